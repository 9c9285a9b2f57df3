"""Sentence-embedding distillation into a narrower student: PCA-reduced targets and the in-batch similarity term.

The headline case in miniature: a 16-wide BERT student with its own tokenizer under a 32-wide MPNet teacher (as
all-MiniLM-L6-v2 under all-mpnet-base-v2). The student keeps its width (no Dense layer); its per-sentence targets are
the teacher's embeddings through a PCA fitted on the training sentences, checked here against torch.linalg.svd by hand.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import transformers

from compress.core.config import from_dict
from compress.core.errors import CompressError
from compress.core.formats.artifacts import load_tokenizer
from compress.core.formats.records import read_compression, read_metrics
from compress.core.formats.runtime import load_model
from compress.core.formats.sentence import SentenceSpec, encode, read_spec, write_sentence_files
from compress.distill import embedding
from compress.distill.embedding import EmbeddingDistillConfig, distill_embedding, pca_reduction, summarize_embedding
from compress.distill.losses import sentence_embedding_mse, sentence_similarity_mse
from tests.conftest import save_tiny, tiny_config
from tests.distill.test_cross_tokenizer import BERT_TOKENS, bert_tokenizer, mpnet_tokenizer, tiny
from tests.distill.test_embedding_tokenizers import TEXTS, sentences

SPEC = SentenceSpec(pooling="mean", normalize=True, max_seq_length=48)


def hand_pca(embeddings: torch.Tensor, k: int):
    """Mean, top-k right singular vectors of the centred embeddings and the share of variance they hold, by SVD."""
    e = embeddings.double()
    mean = e.mean(0)
    _, s, vh = torch.linalg.svd(e - mean, full_matrices=False)
    return mean, vh[:k], float(s[:k].pow(2).sum() / s.pow(2).sum())


def aligned(ours: torch.Tensor, hand: torch.Tensor) -> torch.Tensor:
    """``hand`` with each column's sign set to agree with ``ours`` (a principal direction is defined up to sign)."""
    return hand * torch.sign((ours.double() * hand.double()).sum(0, keepdim=True)).to(hand.dtype)


def bert(width: int, seed: int):
    """A tiny random BERT encoder ``width`` wide over the BERT test vocabulary."""
    torch.manual_seed(seed)
    config = tiny_config(vocab_size=len(BERT_TOKENS), hidden_size=width, num_attention_heads=4, intermediate_size=2 * width)
    return transformers.BertModel(config).eval()


# ---------------------------------------------------------------------------- the pieces, by hand


def test_pca_targets_and_kept_variance_match_a_hand_svd():
    torch.manual_seed(0)
    scales = torch.tensor([5.0, 3.0, 2.0, 1.0, 0.5, 0.1])
    e = torch.randn(40, 6) * scales @ torch.linalg.qr(torch.randn(6, 6))[0] + torch.randn(6) * 4  # a mean offset
    reduction = pca_reduction(e, 3)
    mean, components, share = hand_pca(e, 3)
    torch.testing.assert_close(reduction.mean, mean)
    torch.testing.assert_close(reduction.components, aligned(reduction.components.T, components.T).T)
    assert reduction.variance_kept == pytest.approx(share, rel=1e-9) and reduction.fitted_on == 40
    # the targets: (e - mean) @ C.T with the mean added back, mean @ C.T — that is, e @ C.T
    targets = reduction.apply(e)
    hand = ((e.double() - mean) @ components.T + mean @ components.T).float()
    assert targets.shape == (40, 3) and targets.dtype == torch.float32
    torch.testing.assert_close(targets, aligned(targets, hand), rtol=1e-5, atol=1e-5)
    # chunked sums give the same PCA; each direction's largest coordinate is positive (a fixed sign)
    torch.testing.assert_close(pca_reduction(e, 3, chunk=7).components, reduction.components)
    c = reduction.components
    assert bool((c.gather(1, c.abs().argmax(1, keepdim=True)) > 0).all())
    torch.testing.assert_close(c @ c.T, torch.eye(3, dtype=torch.float64))
    record = reduction.record()
    assert record["components"] == 3 and record["variance_kept"] == pytest.approx(share, abs=1e-6)
    assert record["mean_kept"] == pytest.approx(float((components @ mean).pow(2).sum() / mean.pow(2).sum()), abs=1e-6)
    with pytest.raises(CompressError, match="needs more than 6 sentences"):
        pca_reduction(e[:6], 6)


def test_the_similarity_term_by_hand_on_three_vectors():
    student = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 3.0]], requires_grad=True)  # 2 wide
    teacher = torch.tensor([[1.0, 0.0, 0.0], [5.0, 0.0, 0.0], [0.0, 1.0, 0.0]], requires_grad=True)  # 3 wide
    # student cosines: (0,1) 0, (0,2) and (1,2) 1/sqrt(2); teacher's: (0,1) 1, (0,2) and (1,2) 0
    # squared differences over the 6 ordered pairs i != j: 2 * (1 + 1/2 + 1/2) / 6 = 2/3
    loss = sentence_similarity_mse(student, teacher)
    assert float(loss.detach()) == pytest.approx(2 / 3)
    loss.backward()
    assert student.grad is not None and teacher.grad is None  # the teacher is a fixed target
    assert float(sentence_similarity_mse(student[:1], teacher[:1]).detach()) == 0.0  # no pair in a batch of one
    assert float(sentence_similarity_mse(student.detach() * 7, teacher.detach())) == pytest.approx(2 / 3)  # cosines only


def test_the_loss_reads_reduced_targets_per_sentence_and_the_full_width_for_similarity(tmp_path):
    model = bert(16, seed=3)
    batch = dict(bert_tokenizer(tmp_path)(TEXTS, padding=True, return_tensors="pt"))
    index = torch.tensor([2, 0, 1])
    full, targets = torch.randn(4, 32), torch.randn(4, 16)
    cfg = EmbeddingDistillConfig(corpus=("x",), losses=("mse", "similarity"), mse_weight=0.5, similarity_weight=2.0)
    loss, logs = embedding._embedding_loss_fn(cfg, targets, "mean", full=full)(model, {**batch, "index": index})
    with torch.no_grad():
        student = embedding.pooled_embeddings(model, batch, "mean")  # (3, 16)
    mse, similarity = sentence_embedding_mse(student, targets[index]), sentence_similarity_mse(student, full[index])
    torch.testing.assert_close(logs["loss_mse"], mse)
    torch.testing.assert_close(logs["loss_similarity"], similarity)
    torch.testing.assert_close(loss.detach(), 0.5 * mse + 2.0 * similarity)


# ---------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def narrow(tmp_path_factory):
    """A 32-wide MPNet sentence-transformers teacher distilled into a 16-wide BERT (``--init DIR``, its own tokenizer)
    with mse, cosine and similarity; the targets each loss call was built on are kept."""
    root = tmp_path_factory.mktemp("embedding-narrow")
    tok = {"bert": bert_tokenizer(root / "tok-bert"), "mpnet": mpnet_tokenizer(root / "tok-mpnet")}
    teacher = save_tiny(tiny("mpnet", "base", 1), tok["mpnet"], root / "teacher")
    write_sentence_files(teacher, SPEC, 32)
    student = save_tiny(bert(16, seed=2), tok["bert"], root / "student-init")
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(sentences(60)) + "\n", encoding="utf-8")
    seen = {}
    make_loss_fn = embedding._embedding_loss_fn

    def recording(cfg, targets, pooling, **options):
        seen.update(targets=targets, **options)
        return make_loss_fn(cfg, targets, pooling, **options)

    cfg = from_dict(EmbeddingDistillConfig, {
        "corpus": [str(corpus)], "init": str(student), "losses": ["mse", "cosine", "similarity"], "max_length": 32,
        "heldout_sentences": 6, "epochs": 2, "batch_size": 16, "lr": 1e-3, "seed": 0, "log_every": 1})
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(embedding, "_embedding_loss_fn", recording)
        out = distill_embedding(teacher, root / "out", cfg)
    return {"out": out, "root": root, "teacher": teacher, "tok": tok, "seen": seen, "cfg": cfg}


@pytest.mark.e2e
def test_a_narrower_student_learns_the_teachers_pca_reduced_embeddings(narrow):
    full, targets = narrow["seen"]["full"], narrow["seen"]["targets"]
    assert full.shape == (60, 32) and targets.shape == (60, 16)
    mean, components, share = hand_pca(full[6:], 16)  # fitted on the 54 training sentences, not the 6 held out
    hand = (full.double() @ components.T).float()
    torch.testing.assert_close(targets, aligned(targets, hand), rtol=1e-4, atol=1e-5)
    record = read_compression(narrow["out"])
    assert record["targets"]["reduction"] == "pca" and record["targets"]["teacher_width"] == 32
    assert record["targets"]["components"] == 16 and record["targets"]["fitted_on"] == 54
    assert record["targets"]["variance_kept"] == pytest.approx(share, abs=1e-6)
    assert set(record["terms"]) == {"mse", "cosine", "similarity"} and record["method"] == "mse+cosine+similarity"
    assert "own width" in record["terms"]["similarity"]["against"]
    training = next(r for r in read_metrics(narrow["out"]) if r["kind"] == "training")
    assert training["steps"] >= 6 and training["sentences"] == 54
    assert all(math.isfinite(training["best"][f"heldout_{t}"]) for t in ("mse", "cosine", "similarity"))
    assert training["best"]["heldout_loss"] < training["before"]["heldout_loss"]
    summary, _ = summarize_embedding(narrow["out"], narrow["cfg"], {})
    assert f"reduced to 16 by PCA on 54 sentences, keeping {100 * share:.1f}%" in summary


@pytest.mark.e2e
def test_the_narrow_student_is_a_16_dimensional_sentence_transformers_model(narrow):
    out = narrow["out"]
    modules = json.loads((out / "modules.json").read_text())
    assert not any("Dense" in m["type"] for m in modules)  # no layer added: the student's own width and speed
    assert json.loads((out / "1_Pooling" / "config.json").read_text())["word_embedding_dimension"] == 16
    model = load_model(out, head="base")
    assert model.config.hidden_size == 16
    ours = encode(model, load_tokenizer(out), TEXTS, read_spec(out))
    assert ours.shape == (len(TEXTS), 16)
    st = pytest.importorskip("sentence_transformers")
    theirs = st.SentenceTransformer(str(out), device="cpu").encode(TEXTS)
    assert theirs.shape == (len(TEXTS), 16)
    np.testing.assert_allclose(theirs, ours, atol=1e-5)


@pytest.mark.e2e
def test_a_wider_student_and_too_few_sentences_for_the_pca_are_refused_in_one_line(narrow, tmp_path):
    root, cfg = narrow["root"], narrow["cfg"]
    wide = save_tiny(bert(64, seed=4), narrow["tok"]["bert"], tmp_path / "wide")
    with pytest.raises(CompressError, match="hidden width 64 is more than the teacher's 32") as err:
        distill_embedding(narrow["teacher"], tmp_path / "s", from_dict(EmbeddingDistillConfig, {
            "corpus": list(cfg.corpus), "init": str(wide), "max_steps": 1}))
    assert "\n" not in str(err.value)
    few = tmp_path / "few.txt"
    few.write_text("\n".join(sentences(12)) + "\n", encoding="utf-8")
    with pytest.raises(CompressError, match="needs more than 16 training sentences, and there are 12") as err:
        distill_embedding(narrow["teacher"], tmp_path / "s", from_dict(EmbeddingDistillConfig, {
            "corpus": [str(few)], "init": str(root / "student-init"), "heldout_sentences": 0, "max_length": 32,
            "max_steps": 1}))
    assert "\n" not in str(err.value) and not (tmp_path / "s").exists()


def test_similarity_is_the_transformer_students_term_only():
    from compress.distill.static import StaticDistillConfig

    assert from_dict(EmbeddingDistillConfig, {"corpus": ["x"], "losses": ["similarity"]}).losses == ("similarity",)
    with pytest.raises(CompressError, match="unknown embedding distillation loss 'similarity'; valid: cosine, mse"):
        from_dict(StaticDistillConfig, {"corpus": ["x"], "losses": ["similarity"]})
    with pytest.raises(CompressError, match="valid: cosine, mse, similarity"):
        from_dict(EmbeddingDistillConfig, {"corpus": ["x"], "losses": ["cos"]})
