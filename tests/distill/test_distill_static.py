"""compress distill-static: a model2vec static student from a tiny random sentence-transformers teacher.

The folder must load in model2vec, in sentence-transformers and in every loader here, with
the three encodings equal; without refinement its vectors are model2vec's own; refinement on
a small corpus must bring held-out sentences closer to the teacher (measured here, apart
from the stage's own log). Skipped where model2vec (the static extra) is not installed.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("model2vec", reason="model2vec (the static extra) is not installed")

from compress.core.formats.artifacts import load_tokenizer  # noqa: E402
from compress.core.formats.records import read_compression, read_metrics  # noqa: E402
from compress.core.config import from_dict  # noqa: E402
from compress.core.errors import CompressError  # noqa: E402
from compress.core.formats.runtime import load_model  # noqa: E402
from compress.core.formats.sentence import encode, pooled, read_spec  # noqa: E402
from compress.distill.embedding import embedding_sentences  # noqa: E402
from compress.distill.static import StaticDistillConfig, distill_static  # noqa: E402
from compress.eval.evaluate import EvalConfig, evaluate  # noqa: E402
from compress.eval.latency.config import LatencyConfig  # noqa: E402
from compress.eval.latency.runs import measure_latency  # noqa: E402
from tests.conftest import make_tokenizer  # noqa: E402
from tests.core.test_sentence import corpus, glue, st_folder  # noqa: E402

TEXTS = ["the movie was good .", "a cat sat on the mat", "what is the capital city of france ?", "dog",
         "  they really hate   the acting ! ", "zq the qx film", "qzx"]  # unknown words; one sentence of nothing else
REFINE = {"corpus": None, "sentences_from": ["stsb"], "min_words": 2, "heldout_sentences": 40, "epochs": 8,
          "batch_size": 16, "lr": 0.1, "seed": 0}


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> SimpleNamespace:
    """A teacher folder (mean pooling + Normalize), a 400-sentence corpus and an STS-B/MRPC folder; the stage run
    on the command line: refined (PCA 16) and plain (PCA 16), and refined without PCA for the held-out check."""
    from compress.cli import main

    root = tmp_path_factory.mktemp("static")
    tokenizer = make_tokenizer(root / "tok")
    teacher = st_folder(root, tokenizer, name="teacher", seed=3)
    text, (glue_root, _, _) = corpus(root / "c.txt", n=400), glue(root)
    plain = root / "plain"
    assert main(["distill-static", "--teacher", str(teacher), "--out", str(plain), "--pca-dims", "16", "-q"]) == 0
    refined = root / "refined"
    argv = ["distill-static", "--teacher", str(teacher), "--out", str(refined), "--pca-dims", "16", "--corpus", str(text),
            "--sentences-from", "stsb", "--data-dir", str(glue_root), "--eval-tasks", "stsb", "--min-words", "2",
            "--heldout-sentences", "40", "--epochs", "8", "--batch-size", "16", "--lr", "0.1", "--seed", "0", "-q"]
    assert main(argv) == 0
    return SimpleNamespace(root=root, tokenizer=tokenizer, teacher=teacher, text=text, glue=glue_root, plain=plain,
                           refined=refined)


def toolkit_encode(folder: Path, texts: list[str]) -> np.ndarray:
    """The folder's embeddings as compress eval --embedding computes them (its loader, tokenizer and spec)."""
    return encode(load_model(folder, head="base"), load_tokenizer(folder), texts, read_spec(folder), batch_size=3)


# ---------------------------------------------------------------------------- the folder


@pytest.mark.e2e
@pytest.mark.parametrize("name", ["plain", "refined"])
def test_the_folder_loads_in_model2vec_and_sentence_transformers_and_the_three_encodings_agree(env, name):
    from model2vec import StaticModel

    st = pytest.importorskip("sentence_transformers")
    folder = getattr(env, name)
    ours = toolkit_encode(folder, TEXTS)
    theirs = StaticModel.from_pretrained(folder).encode(TEXTS)
    sentence = st.SentenceTransformer(str(folder), device="cpu").encode(TEXTS)
    assert ours.shape == theirs.shape == sentence.shape == (len(TEXTS), 16)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    np.testing.assert_allclose(sentence, theirs, atol=1e-5)
    assert np.allclose(np.linalg.norm(ours[:-1], axis=1), 1.0, atol=1e-5) and not ours[-1].any()  # "qzx": no token


def test_without_refinement_the_vectors_are_model2vecs_own(env, tmp_path):
    from model2vec import StaticModel
    from model2vec.distill import distill_from_model

    teacher = load_model(env.teacher, head="base")
    own = distill_from_model(teacher, load_tokenizer(env.teacher), pca_dims=16, quantize_to="float32")
    ours = StaticModel.from_pretrained(env.plain)
    assert ours.tokens == own.tokens
    unk = ours.unk_token_id
    keep = np.arange(len(own.tokens)) != unk  # its unknown token's row is zero here (a sentence never uses it)
    np.testing.assert_allclose(ours.embedding[keep], own.embedding[keep], atol=1e-5)
    assert not ours.embedding[unk].any()
    # A model2vec folder written elsewhere (no compression.json; its unknown token's vector not zero) reads here too,
    # with or without modules.json, and encodes as model2vec does.
    own.save_pretrained(tmp_path / "m2v")
    np.testing.assert_allclose(toolkit_encode(tmp_path / "m2v", TEXTS), own.encode(TEXTS), atol=1e-5)
    (tmp_path / "m2v" / "modules.json").unlink()
    np.testing.assert_allclose(toolkit_encode(tmp_path / "m2v", TEXTS), own.encode(TEXTS), atol=1e-5)
    files = {p.name for p in env.plain.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "modules.json", "compression.json", "metrics.json",
            "README.md"} <= files
    config = json.loads((env.plain / "config.json").read_text())
    assert config["model_type"] == "model2vec" and config["normalize"] and config["apply_pca"] == 16


def test_compression_json_records_the_teacher_the_pca_and_the_refinement(env):
    plain, refined = read_compression(env.plain), read_compression(env.refined)
    assert plain["stage"] == "distill-static" and plain["format"] == "static" and plain["method"] == "model2vec"
    assert plain["parent"]["path"] == str(env.teacher.resolve()) and plain["teacher"]["hash"].startswith("sha256:")
    assert plain["static"]["pca_dims"] == 16 and plain["static"]["dimension"] == 16 and plain["static"]["teacher_width"] == 32
    assert plain["static"]["pca_fit_error"] < 1e-4 and plain["refinement"] is None and plain["sources"] == {}
    assert plain["structure"]["static"] and plain["structure"]["vocabulary"] == plain["static"]["vocabulary"]
    log = refined["refinement"]
    assert refined["method"] == "model2vec+refined" and log["kept"] and log["heldout"] == 40
    assert refined["sources"]["corpus"] > 300 and refined["sources"]["stsb"] == 10
    assert log["after"]["heldout_loss"] < log["before"]["heldout_loss"] and log["steps"] > 0
    assert log["after"]["heldout_cosine"] < log["before"]["heldout_cosine"] and log["after"]["heldout_mse"] < log["before"]["heldout_mse"]
    training = next(r for r in read_metrics(env.refined) if r["kind"] == "training")
    assert training["stage"] == "distill-static" and training["history"] and training["best"] == log["after"]
    retention = next(r for r in read_metrics(env.refined) if r["kind"] == "retention")
    assert retention["task"] == "stsb" and retention["embedding"] and retention["teacher"] is not None
    assert "static token vectors (model2vec)" in (env.refined / "README.md").read_text()


def test_refinement_brings_heldout_sentences_closer_to_the_teacher(env, tmp_path):
    # Without PCA the static space is the teacher's own: the held-out cosine is measured here directly.
    cfg = from_dict(StaticDistillConfig, {**REFINE, "corpus": [str(env.text)], "data_dir": str(env.glue), "pca_dims": None})
    refined = distill_static(env.teacher, tmp_path / "refined", cfg)
    plain = distill_static(env.teacher, tmp_path / "plain", from_dict(StaticDistillConfig, {"pca_dims": None}))
    sentences, _ = embedding_sentences(cfg)
    held = sentences[: read_compression(refined)["refinement"]["heldout"]]
    teacher = load_model(env.teacher, head="base")
    target = F.normalize(pooled(teacher, load_tokenizer(env.teacher), held, read_spec(env.teacher)), dim=-1).numpy()

    def distance(folder):  # mean 1 - cos(static embedding, teacher embedding) over the held-out sentences
        return float(np.mean(1 - np.sum(toolkit_encode(folder, held) * target, axis=1)))

    before, after = distance(plain), distance(refined)
    print(f"held-out 1 - cos to the teacher: {before:.4f} unrefined -> {after:.4f} refined")
    assert after < 0.8 * before


# ---------------------------------------------------------------------------- as any model


@pytest.mark.e2e
def test_eval_embedding_and_latency_read_the_folder(env, capsys):
    from compress.cli import main

    (record,) = evaluate(env.plain, EvalConfig(task="stsb", embedding=True, data_dir=str(env.glue), record=False))
    assert record["kind"] == "embedding-eval" and record["n"] == 5 and record["embedding"]["normalize"]
    assert record["max_length"] == 512 and -100 <= record["metrics"]["spearmanr"] <= 100
    assert main(["eval", "--model", str(env.plain), "--task", "stsb", "--data-dir", str(env.glue), "--no-record"]) == 2
    assert "static (model2vec) folder" in capsys.readouterr().err
    report = measure_latency([env.plain], LatencyConfig(batch=(1,), seq=(16,), repeats=3, warmup=1, peak=False, record=False))
    (row,) = report["rows"]
    assert row.backend == "static" and row.p50_ms > 0 and row.gflops_per_seq == 0 and row.params > 0


# ---------------------------------------------------------------------------- refusals


def test_bad_inputs_are_refused_in_one_line(env, tmp_path, capsys):
    from compress.cli import main

    def refused(argv, said):
        assert main(["distill-static", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert said in err and len(err.splitlines()) == 1, err

    teacher, out = str(env.teacher), str(tmp_path / "out")
    refused(["--teacher", str(tmp_path / "missing"), "--out", out], "is neither a directory nor a known hub model")
    refused(["--teacher", teacher, "--out", str(env.plain)], "is not empty")
    refused(["--teacher", teacher, "--out", out, "--pca-dims", "64"], "more than the teacher's width 32")
    refused(["--teacher", teacher, "--out", out, "--epochs", "5"], "--epochs tunes the refinement, which needs sentences")
    refused(["--teacher", teacher, "--out", out, "--heldout-sentences", "9"], "--heldout-sentences tunes the refinement")
    refused(["--teacher", teacher, "--out", out, "--sif-coefficient", "2"], "--sif-coefficient must be in (0, 1)")
    refused(["--teacher", str(env.plain), "--out", out], "static distillation (the teacher) needs PyTorch fp32 weights")
    assert not (tmp_path / "out").exists()
    with pytest.raises(CompressError, match="with no task head"):
        load_model(env.plain, head="sequence-classification")
    assert torch.is_tensor(load_model(env.plain).embedding.weight)
