"""Static int8 of a sentence-embedding folder, calibrated on unlabelled sentences (a tiny random BERT).

The folder (mean pooling + Normalize, max_seq_length 48) is quantized once per backend
from a generated text file and shared by the tests; its embeddings are recomputed here
by hand (one sentence at a time, no padding) and compared with the fp32 parent's.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from compress.core.formats.records import read_compression, read_metrics
from compress.core.config import from_dict
from compress.core.errors import CompressError
from compress.core.formats.runtime import load_model
from compress.core.formats.sentence import read_spec
from compress.core.model.structure import config_sizes
from compress.distill.embedding import embedding_sentences
from compress.eval.evaluate import EvalConfig, evaluate
from compress.quantize.calibration import sentence_calibration
from compress.quantize.checks import COSINE_CHECK
from compress.quantize.config import QuantizeConfig
from compress.quantize.run import quantize, rejected_path, summarize
from tests.conftest import make_tiny_model, make_tokenizer, save_tiny
from tests.core.test_sentence import corpus, glue, st_folder

NEEDS = {"onnxruntime": "onnxruntime", "openvino": "nncf"}


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> SimpleNamespace:
    """A sentence-transformers folder, a 200-sentence text file, an STS-B/MRPC folder; a cache of int8 outputs."""
    root = tmp_path_factory.mktemp("quantize-embedding")
    tokenizer = make_tokenizer(root / "tok")
    folder = st_folder(root, tokenizer, name="fp32")
    glue_root, _, _ = glue(root)
    return SimpleNamespace(root=root, tokenizer=tokenizer, folder=folder, text=corpus(root / "c.txt", n=200),
                           glue=glue_root, outputs={})


def config(env, backend: str = "onnxruntime", scheme: str = "static", **changes) -> QuantizeConfig:
    base = {"backend": backend, "scheme": scheme, "corpus": [str(env.text)], "calibration_examples": 24,
            "check_sentences": 40}
    return from_dict(QuantizeConfig, {**base, **changes})


def quantized(env, backend: str) -> Path:
    """The folder quantized statically by ``backend`` from the text file: made once per module."""
    pytest.importorskip(NEEDS[backend], reason=f"the {backend} backend's package is not installed")
    if backend not in env.outputs:
        env.outputs[backend] = quantize(env.folder, env.root / backend, config(env, backend))
    return env.outputs[backend]


def by_hand(model, tokenizer, texts: list[str]) -> np.ndarray:
    """Each text alone: the mean of its token states, L2-normalised (what the folder's modules say): (n, d)."""
    rows = []
    for text in texts:
        enc = tokenizer(text.strip(), truncation=True, max_length=48, return_tensors="pt")
        with torch.inference_mode():
            hidden = model(**enc).last_hidden_state[0].float()  # (seq, d)
        vector = hidden.mean(0).numpy().astype(np.float64)
        rows.append(vector / np.linalg.norm(vector))
    return np.stack(rows)


def check_sentences(env, cfg: QuantizeConfig) -> list[str]:
    """The held-out sentences: the first ``check_sentences`` of the seeded order (at most half)."""
    sentences, _ = embedding_sentences(cfg.sentence_config())
    return sentences[: min(cfg.check_sentences, len(sentences) // 2)]


# ---------------------------------------------------------------------------- each backend


@pytest.mark.e2e
@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
def test_static_int8_of_a_sentence_folder_is_close_to_fp32_and_records_its_check(env, backend):
    out = quantized(env, backend)
    record = read_compression(out)
    assert (record["backend"], record["scheme"], record["head"]) == (backend, "static", "base")
    assert read_spec(out) == read_spec(env.folder)  # pooling, Normalize and max_seq_length travel with the int8 model
    calibration = record["calibration"]
    assert calibration["sources"] == {"corpus": 200} and calibration["corpus"] == [str(env.text)]
    assert (calibration["examples"], calibration["seed"], calibration["max_length"]) == (24, 0, 48)
    assert calibration["check_sentences"] == 40 and calibration["inputs"] == "unlabelled sentences"
    # int8 really: stored int8 weight matrices (ONNX), or layers OpenVINO runs in int8.
    if backend == "onnxruntime":
        import onnx

        graph = onnx.load(str(out / "model.onnx")).graph
        eight_bit = (onnx.TensorProto.INT8, onnx.TensorProto.UINT8)  # the avx2 preset stores uint8 weights
        assert sum(t.data_type in eight_bit and len(t.dims) == 2 for t in graph.initializer) >= 12  # 2 layers x 6
    else:
        assert any(record["layer_precisions"].get(kind) for kind in ("i8", "u8"))
    held = check_sentences(env, config(env, backend))
    fp32 = by_hand(load_model(env.folder), env.tokenizer, held)
    int8 = by_hand(load_model(out), env.tokenizer, held)
    cosine = np.sum(fp32 * int8, axis=1)  # unit vectors: (sentences,)
    assert cosine.mean() > 0.9
    accuracy = record["accuracy"]
    assert accuracy["check"] == COSINE_CHECK and accuracy["sentences"] == len(held) == 40 and accuracy["passed"]
    # Batched and padded there, one at a time here: the same numbers up to float32 rounding.
    assert accuracy["mean_cosine"] == pytest.approx(cosine.mean(), abs=1e-4)
    assert accuracy["min_cosine"] == pytest.approx(cosine.min(), abs=1e-4)
    (summary,) = [r for r in read_metrics(out) if r["kind"] == "quantize"]
    assert summary["embedding"] and summary["mean_cosine"] == accuracy["mean_cosine"]
    text, _ = summarize(out, config(env, backend), {"model": env.folder})
    assert f"embeddings of 40 held-out sentences: mean cosine int8 to fp32 {accuracy['mean_cosine']:.5f}" in text
    (scored,) = evaluate(out, EvalConfig(task="stsb", embedding=True, data_dir=str(env.glue)))  # compress eval --embedding
    assert scored["kind"] == "embedding-eval" and np.isfinite(scored["metrics"]["spearmanr"])


def test_calibration_and_check_sentences_are_disjoint_and_a_short_text_is_split_in_half(env, tmp_path):
    tokenizer, short = env.tokenizer, corpus(tmp_path / "short.txt", n=30, seed=3)
    model = load_model(env.folder)
    for cfg, n_check, n_calibration in [(config(env), 40, 24), (config(env, corpus=[str(short)], check_sentences=256), 15, 15)]:
        calibration, check = sentence_calibration(env.folder, tokenizer, cfg, config_sizes(model.config).max_positions)
        assert len(check.sentences) == n_check and calibration.source["examples"] == n_calibration
        assert check.sentences == check_sentences(env, cfg)
        ids = np.concatenate([b["input_ids"] for b in calibration.batches])  # (examples, padded length)
        assert ids.shape[0] == n_calibration and ids.shape[1] == calibration.source["padded_length"] <= 48
        calibrated = {tuple(int(t) for t in row if t != tokenizer.pad_token_id) for row in ids}
        held = {tuple(tokenizer(s, truncation=True, max_length=48)["input_ids"]) for s in check.sentences}
        assert len(calibrated) == n_calibration and not calibrated & held


# ---------------------------------------------------------------------------- GLUE sentences, eval tasks, the guard


def test_sentences_from_a_glue_task_with_an_stsb_guard_on_the_command_line(env, tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    from compress.cli import main

    out = tmp_path / "int8"
    argv = ["quantize", "--model", str(env.folder), "--backend", "onnxruntime", "--scheme", "static",
            "--sentences-from", "stsb", "--corpus", str(env.text), "--data-dir", str(env.glue),
            "--calibration-examples", "16", "--check-sentences", "8", "--eval-tasks", "stsb", "--out", str(out)]
    assert main([*argv, "--max-drop", "100"]) == 0
    printed = capsys.readouterr().out
    assert "embeddings of 8 held-out sentences: mean cosine int8 to fp32" in printed and "stsb dev spearmanr" in printed
    # The card's loading call, with the folder's own path, as export prints it.
    assert f'SentenceTransformer("{out}", backend="onnx", model_kwargs={{"file_name": "model.onnx"}})' in printed
    record = read_compression(out)
    assert record["calibration"]["sources"] == {"corpus": 200, "stsb": 10}  # STS-B: 5 pairs
    assert record["calibration"]["data"] == str(env.glue) and record["accuracy"]["tasks"]["stsb"]["metric"] == "spearmanr"
    assert [r["kind"] for r in read_metrics(out)] == ["embedding-eval", "quantize"]
    # A drop above --max-drop (impossible to meet here) moves the result aside, as a task's guard does.
    assert main([*argv, "--max-drop", "-1000", "--overwrite"]) != 0
    err = capsys.readouterr().err
    assert "STS-B dev spearmanr of the embeddings dropped" in err and "more than --max-drop -1000" in err
    assert read_compression(rejected_path(out))["accuracy"]["passed"] is False


def test_min_cosine_moves_the_result_aside_and_fails(env, tmp_path):
    pytest.importorskip("onnxruntime")
    out = tmp_path / "int8"
    with pytest.raises(CompressError) as err:
        quantize(env.folder, out, config(env, min_cosine=0.99999))
    message, rejected = str(err.value), rejected_path(out)
    assert "below --min-cosine 0.99999" in message and str(rejected) in message and "\n" not in message
    assert not out.exists() and rejected.is_dir()
    accuracy = read_compression(rejected)["accuracy"]
    assert accuracy["passed"] is False and accuracy["min_required"] == 0.99999 and accuracy["mean_cosine"] < 0.99999
    assert load_model(rejected) is not None  # the rejected model is complete


def test_dynamic_int8_of_a_sentence_folder_is_checked_on_the_same_sentences(env, tmp_path):
    out = quantize(env.folder, tmp_path / "int8", config(env, backend="torch", scheme="dynamic", min_cosine=0.9))
    record = read_compression(out)
    assert record["calibration"] is None and record["check_inputs"]["examples"] == 16  # the output check's rows only
    assert record["accuracy"]["sentences"] == 40 and record["accuracy"]["mean_cosine"] > 0.9


# ---------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("changes, words", [
    ({"corpus": ()}, "--corpus FILE_OR_DIR[,...] or --sentences-from TASK[,...]"),
    ({"task": "sst2"}, "with --task (or --train-file) the task's own training rows calibrate"),
    ({"corpus": (), "sentences_from": ("stsb",), "task": "stsb"}, "drop --corpus/--sentences-from"),
    ({"scheme": "dynamic", "corpus": (), "min_cosine": 0.9}, "--min-cosine and --eval-tasks check a sentence-embedding folder"),
    ({"min_cosine": 1.5}, "--min-cosine is a mean cosine similarity: pass a number in (0, 1], got 1.5"),
    ({"check_sentences": 0}, "--check-sentences must be at least 1"),
    ({"sentences_from": ("squad",)}, "--sentences-from takes GLUE tasks"),
    ({"eval_tasks": ("sst2",)}, "SST-2 cannot score sentence embeddings"),
])
def test_bad_sentence_configurations_are_one_line_errors(env, changes, words):
    with pytest.raises(CompressError) as err:
        config(env, **changes)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_task_model_is_refused_sentences(env, tmp_path):
    classifier = save_tiny(make_tiny_model("sequence-classification"), env.tokenizer, tmp_path / "classifier")
    with pytest.raises(CompressError, match="is a sequence-classification model; --corpus/--sentences-from are for "
                                            "sentence-embedding"):
        quantize(classifier, tmp_path / "int8", config(env))
    assert not (tmp_path / "int8").exists()
