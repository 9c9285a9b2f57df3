"""Sentence-embedding distillation of a student with a tokenizer of its own: a BERT student under an MPNet teacher.

The two tokenizers (those of test_cross_tokenizer: no id in common, some words split otherwise) meet per sentence: the
student reads its own tokens of sentence i, its target is the teacher's pooled embedding of sentence i on the teacher's
own tokens. Models are tiny and random; what is checked is where every number comes from.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from compress.core.config import from_dict
from compress.core.formats.artifacts import load_tokenizer
from compress.core.formats.folder import open_folder
from compress.core.formats.records import read_compression, read_metrics
from compress.core.formats.runtime import load_model
from compress.core.formats.sentence import SentenceSpec, encode, is_sentence_folder, read_spec, write_sentence_files
from compress.distill import embedding
from compress.distill.embedding import EmbeddingDistillConfig, distill_embedding
from compress.eval.embeddings import embedding_scorer
from compress.core.data.tasks import get_task
from compress.core.data.sources import DataSource, load_split
from tests.conftest import save_tiny
from tests.distill.test_cross_tokenizer import SPLIT, WORDS, bert_tokenizer, mpnet_tokenizer, tiny

SPEC = SentenceSpec(pooling="mean", normalize=True, max_seq_length=48)
TEXTS = ["the movie was good in paris .", "a dog sat on the mat", "  france is a country  "]
STSB = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"


def sentences(n: int, seed: int = 0) -> list[str]:
    """Sentences of 4-9 test words, every few with a word the two tokenizers split otherwise."""
    rng = random.Random(seed)
    words = [w for w in WORDS if w.isalpha()]
    rows = [[rng.choice(words) for _ in range(rng.randint(4, 9))] for _ in range(n)]
    for i in range(0, n, 3):
        rows[i][rng.randrange(len(rows[i]))] = SPLIT[i % len(SPLIT)]
    return [" ".join(r) + " ." for r in rows]


def stsb(root):
    """A five-pair STS-B dev (and train) split of test words."""
    pairs = [("the cat sat on the mat", "a cat sat on a mat", 4.8), ("the movie was good", "the film was great", 3.9),
             ("he did not love paris", "she hate the river", 0.4), ("what is the capital", "the dog sat", 1.0),
             ("they love the acting", "we love the story", 2.5)]
    (root / "STS-B").mkdir(parents=True)
    for split in ("train", "dev"):
        (root / "STS-B" / f"{split}.tsv").write_text(
            STSB + "".join(f"{i}\tg\tf\ty\t0\tn\tn\t{a}\t{b}\t{s}\n" for i, (a, b, s) in enumerate(pairs)))
    return root


def own_pooled(model, tokenizer, text: str) -> torch.Tensor:
    """One text alone (no padding) through ``model`` on ``tokenizer``'s ids, mean-pooled: (d,)."""
    with torch.no_grad():
        return model(**dict(tokenizer(text.strip(), return_tensors="pt"))).last_hidden_state[0].mean(0)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """An MPNet sentence-transformers teacher distilled into a bare BERT student (``--init DIR``), each loss call's
    batch and targets recorded."""
    root = tmp_path_factory.mktemp("embedding-apart")
    tok = {"bert": bert_tokenizer(root / "tok-bert"), "mpnet": mpnet_tokenizer(root / "tok-mpnet")}
    teacher = save_tiny(tiny("mpnet", "base", 1), tok["mpnet"], root / "teacher")
    write_sentence_files(teacher, SPEC, 32)
    student = save_tiny(tiny("bert", "base", 2), tok["bert"], root / "student-init")
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(sentences(60)) + "\n", encoding="utf-8")
    calls = []
    make_loss_fn = embedding._embedding_loss_fn

    def recording(cfg, targets, pooling, **options):
        loss_fn = make_loss_fn(cfg, targets, pooling, **options)

        def loss(model, batch):
            calls.append({"ids": batch["input_ids"].clone(), "mask": batch["attention_mask"].clone(),
                          "targets": targets[batch["index"].cpu()].clone()})
            return loss_fn(model, batch)

        return loss

    cfg = from_dict(EmbeddingDistillConfig, {
        "corpus": [str(corpus)], "init": str(student), "eval_tasks": ["stsb"], "data_dir": str(stsb(root / "glue")),
        "max_length": 32, "heldout_sentences": 6, "epochs": 1, "batch_size": 16, "lr": 1e-3, "seed": 0, "log_every": 1})
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(embedding, "_embedding_loss_fn", recording)
        out = distill_embedding(teacher, root / "out", cfg)
    return {"out": out, "teacher": teacher, "tok": tok, "calls": calls, "cfg": cfg}


@pytest.mark.e2e
def test_the_student_trains_on_its_own_tokens_against_the_teachers_embeddings_on_its_own(run):
    bert, mpnet = run["tok"]["bert"], run["tok"]["mpnet"]
    teacher = load_model(run["teacher"], head="base")
    by_ids = {tuple(bert(t)["input_ids"]): t for t in sentences(60)}
    training = next(r for r in read_metrics(run["out"]) if r["kind"] == "training")
    assert training["steps"] >= 3 and training["sentences"] == 54 and training["heldout"] == 6
    met = {}  # sentence -> the target its student row was trained against
    for call in run["calls"]:  # held-out evaluations and training steps alike
        for ids, mask, target in zip(call["ids"], call["mask"], call["targets"]):
            met[by_ids[tuple(ids[mask.bool()].tolist())]] = target  # a KeyError: not the student's own ids
    assert len(met) == 60
    split = next(t for t in met if any(w in t.split() for w in SPLIT))
    assert len(mpnet(split)["input_ids"]) != len(bert(split)["input_ids"])  # the two tokenisations differ
    for text in (split, next(t for t in met if t != split)):  # by hand: the teacher alone on its own ids, mean-pooled
        torch.testing.assert_close(met[text], own_pooled(teacher, mpnet, text), rtol=1e-4, atol=1e-5)


@pytest.mark.e2e
def test_the_folder_has_the_students_tokenizer_and_encodes_alike_through_every_loader(run):
    out, bert = run["out"], run["tok"]["bert"]
    assert is_sentence_folder(out) and read_spec(out) == read_spec(run["teacher"])
    assert open_folder(out).tokenizer.get_vocab() == bert.get_vocab() != run["tok"]["mpnet"].get_vocab()
    assert type(open_folder(out).config).__name__ == "BertConfig"
    assert read_compression(out)["tokenizer"].startswith("the student's own")
    model = load_model(out, head="base")
    ours = encode(model, load_tokenizer(out), TEXTS, read_spec(out))
    by_hand = torch.stack([F.normalize(own_pooled(model, bert, t), dim=-1) for t in TEXTS]).numpy()
    np.testing.assert_allclose(ours, by_hand, atol=1e-5)
    st = pytest.importorskip("sentence_transformers")
    np.testing.assert_allclose(st.SentenceTransformer(str(out), device="cpu").encode(TEXTS), ours, atol=1e-5)


@pytest.mark.e2e
def test_the_teacher_is_scored_on_its_own_tokens_the_student_on_its_own(run):
    task = get_task("stsb")
    ds = load_split(task, "dev", DataSource(data_dir=run["cfg"].data_dir))
    records = read_metrics(run["out"])
    retention = next(r for r in records if r["kind"] == "retention")
    evaluated = next(r for r in records if r["kind"] == "embedding-eval")
    teacher_score = embedding_scorer(run["tok"]["mpnet"], task, ds, SPEC)(load_model(run["teacher"], head="base"))[0]
    student_score = embedding_scorer(run["tok"]["bert"], task, ds, SPEC)(load_model(run["out"], head="base"))[0]
    assert retention["teacher"] == pytest.approx(teacher_score["spearmanr"], abs=1e-6)
    assert evaluated["metrics"]["spearmanr"] == pytest.approx(student_score["spearmanr"], abs=1e-6)
