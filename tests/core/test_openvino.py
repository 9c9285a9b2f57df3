"""OpenVINO: IR export of any structure, NNCF int8, evaluation and latency of IR folders, clear refusals.

Tolerances, as measured on these tiny models: an fp32 IR (f32 inference precision) gives
the torch logits to ~3e-9, so 1e-4 is asserted; an int8 IR stays within a tenth of the
logits' scale (measured ~3%) and agrees on the argmax of nearly every example.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from compress.core.data import synthetic
from compress.core.formats.artifacts import artifact_format, load_tokenizer
from compress.core.formats.records import read_compression, read_metrics
from compress.core.config import from_dict
from compress.core.errors import CompressError
from compress.core.formats.openvino import OPENVINO_FILE, OPENVINO_WEIGHTS, export_openvino, int8_weights
from compress.core.formats.openvino_runtime import OpenVINORunner, layer_precisions, openvino_bf16
from compress.core.formats.runtime import load_model
from compress.core.formats.sentence import SentenceSpec, encode, read_spec, write_sentence_files
from compress.core.model.shapes import Shape
from compress.core.model.structure import describe, prune_heads, resize_ffn
from compress.eval.latency.config import LatencyConfig
from compress.eval.latency.runs import measure_latency
from compress.eval.latency.backends import AUTO_BACKENDS
from compress.quantize.config import QuantizeConfig
from compress.quantize.run import quantize
from tests.conftest import make_tiny_model, save_tiny

# Depends on the installed transformers version: the transformers 4.57 set runs it too (make test-transformers4).
pytestmark = pytest.mark.versions

openvino = pytest.importorskip("openvino")
pytest.importorskip("nncf")

FP32_TOLERANCE = 1e-4  # absolute, on logits / hidden states of magnitude ~0.1-1
TEXTS = ["the movie was good", "a bad , boring film . really not fun at all", "paris", "what a great story !"]


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> SimpleNamespace:
    """Tiny fp32 models (uniform; heads pruned + per-layer FFN widths), an SST-2 classifier with data, its int8 IR."""
    from compress.teacher.create import create_model

    from tests.conftest import make_tokenizer

    root = tmp_path_factory.mktemp("openvino")
    tokenizer = make_tokenizer(root / "tok")
    pruned = make_tiny_model(seed=3)
    prune_heads(pruned, {0: [1], 1: [0, 2]})  # 3 and 2 heads
    resize_ffn(pruned, 1, range(20))  # FFN widths 37 and 20: no stock config expresses this
    synthetic.write_sst2_layout(root / "glue", n_train=64, n_dev=32, n_test=8)
    # Hidden 256: weights, not graph metadata, dominate the files (for the size check).
    parent = create_model(Shape(2, 256, 4, 1024), root / "sst2", tokenizer=synthetic.write_vocab(root / "vocab.txt"),
                          task="sst2", max_positions=64)
    env = SimpleNamespace(root=root, tokenizer=tokenizer, data=root / "glue", parent=parent,
                          uniform=save_tiny(make_tiny_model(seed=2), tokenizer, root / "uniform"),
                          pruned=save_tiny(pruned, tokenizer, root / "pruned"))
    env.int8 = quantize(parent, root / "int8", qconfig(env))
    return env


def qconfig(env, **changes) -> QuantizeConfig:
    base = {"backend": "openvino", "scheme": "static", "task": "sst2", "data_dir": str(env.data), "calibration_examples": 16}
    return from_dict(QuantizeConfig, {**base, **changes})


def outputs(model_dir: Path, texts=TEXTS, name: str = "logits") -> np.ndarray:
    """The model's ``name`` output on ``texts`` (one padded batch), as loaded by ``load_model``."""
    tokenizer = load_tokenizer(model_dir)
    model = load_model(model_dir)
    batch = dict(tokenizer(list(texts), padding=True, return_tensors="pt"))
    with torch.inference_mode():
        return getattr(model(**batch), name).float().numpy()


# ---------------------------------------------------------------------------- fp32 export


@pytest.mark.e2e
@pytest.mark.parametrize("kind", ["uniform", "pruned"])
def test_export_gives_the_torch_outputs(env, kind, tmp_path):
    source = getattr(env, kind)
    out = export_openvino(source, tmp_path / "ov")
    assert (out / OPENVINO_FILE).is_file() and (out / OPENVINO_WEIGHTS).is_file() and artifact_format(out) == "openvino"
    record = read_compression(out)
    assert record["stage"] == "export" and record["format"] == "openvino" and record["precision"] == "fp32"
    assert record["inference_precision"] == "f32" and record["source_format"] == "torch"
    # A classifier reads the first token only: the graph's last layer computes that one.
    assert record["structure"] == {**describe(load_model(source)), "first_token_last_layer": True}
    model = load_model(out)
    assert isinstance(model, OpenVINORunner) and model.precision == "f32"
    # Padded batches of 4 and a batch of 1 of another length: batch and sequence are dynamic.
    for texts in (TEXTS, TEXTS[1:2]):
        np.testing.assert_allclose(outputs(out, texts), outputs(source, texts), atol=FP32_TOLERANCE, rtol=0)
    if kind == "pruned":
        assert describe(load_model(source))["heads"] == [3, 2] and describe(load_model(source))["ffn"] == [37, 20]


def test_conversion_logs_no_transformers_loss_warning(env, tmp_path, monkeypatch):
    from transformers import modeling_utils

    said = []
    monkeypatch.setattr(modeling_utils.logger, "warning_once", lambda msg, *a, **k: said.append(msg))
    export_openvino(env.parent, tmp_path / "ov")
    assert not [msg for msg in said if "loss_type" in msg]


def test_export_of_a_sentence_folder_keeps_its_pooling_and_embeddings(env, tmp_path):
    folder = save_tiny(make_tiny_model("base", seed=4), env.tokenizer, tmp_path / "st")
    write_sentence_files(folder, SentenceSpec(pooling="mean", normalize=True), 32)
    out = export_openvino(folder, tmp_path / "ov")
    assert read_spec(out) == read_spec(folder) and read_compression(out)["outputs"] == ["last_hidden_state"]
    want = encode(load_model(folder, head="base"), env.tokenizer, TEXTS, read_spec(folder))
    got = encode(load_model(out, head="base"), env.tokenizer, TEXTS, read_spec(out))
    np.testing.assert_allclose(got, want, atol=FP32_TOLERANCE, rtol=0)


@pytest.mark.e2e
def test_an_onnx_runtime_static_int8_graph_converts_and_runs_in_int8(env, tmp_path):
    ort = quantize(env.parent, tmp_path / "ort", from_dict(QuantizeConfig, {
        "backend": "onnxruntime", "scheme": "static", "task": "sst2", "data_dir": str(env.data), "calibration_examples": 16}))
    out = export_openvino(ort, tmp_path / "ov")
    record = read_compression(out)
    assert record["precision"] == "int8" and record["source_format"] == "onnx"
    assert record["layer_precisions"].get("u8", 0) + record["layer_precisions"].get("i8", 0) >= 12
    reference = outputs(ort)
    # The same QDQ graph on another runtime's int8 kernels (measured: ~1e-8 apart).
    np.testing.assert_allclose(outputs(out), reference, atol=0.02 * np.abs(reference).max(), rtol=0)


@pytest.mark.parametrize("backend, match", [
    ("onnxruntime", "only emulates in f32 .*compress quantize --backend openvino"),  # dynamic: MatMulInteger
    ("torch", "torch-int8-dynamic int8 model, which OpenVINO cannot read; .*compress quantize --backend openvino"),
])
def test_int8_models_openvino_would_not_run_in_int8_are_refused_in_one_line(env, tmp_path, backend, match):
    int8 = quantize(env.uniform, tmp_path / "int8", QuantizeConfig(backend=backend))
    with pytest.raises(CompressError, match=match) as err:
        export_openvino(int8, tmp_path / "ov")
    assert "\n" not in str(err.value) and not (tmp_path / "ov").exists()


# ---------------------------------------------------------------------------- NNCF int8


def test_int8_is_stored_and_run_as_int8(env, tmp_path):
    record = read_compression(env.int8)
    assert record["format"] == "openvino" and record["backend"] == "openvino" and record["precision"] == "int8"
    assert record["scheme"] == "static" and record["inference_precision"] == "f32"
    assert {"openvino", "nncf"} <= set(record["packages"])
    # 2 layers x 6 Linear weights and the 3 embedding tables stored as int8 (not the pooler, not the classifier) ...
    assert int8_weights(openvino.Core().read_model(str(env.int8 / OPENVINO_FILE))) == 15
    assert record["openvino_quantization"]["int8_weight_matrices"] == 15
    fp32 = export_openvino(env.parent, tmp_path / "fp32")
    # ... so the weights file is ~4x smaller than the fp32 IR's (measured 3.9x).
    assert (env.int8 / OPENVINO_WEIGHTS).stat().st_size < 0.3 * (fp32 / OPENVINO_WEIGHTS).stat().st_size
    # ... and run as int8: every Linear of the layers, in the plugin's own words; the head's two in f32. The attention's
    # own products (Q.K^T, P.V) are the plugin's choice per CPU: fused away on AVX-512 machines, i8 and f32 MatMuls on
    # an AVX2-only one; they are not weights and are not counted here.
    compiled = load_model(env.int8).compiled
    linear = {}
    for op in compiled.get_runtime_model().get_ops():
        info = op.get_rt_info()
        if info["layerType"].astype(str) == "FullyConnected":
            linear[op.get_friendly_name()] = info["runtimePrecision"].astype(str).lower()
    layers = [p for name, p in linear.items() if ".encoder.layer." in name]
    head = [p for name, p in linear.items() if ".pooler." in name or ".classifier" in name]
    assert len(layers) == 12 and all(p in ("u8", "i8") for p in layers) and head == ["f32", "f32"]
    assert layer_precisions(compiled) == record["layer_precisions"]


def test_the_pooler_and_task_head_stay_fp32(env):
    kept = read_compression(env.int8)["openvino_quantization"]["fp32_matmuls"]
    assert len(kept) == 2 and any(".pooler.dense/" in n for n in kept) and any(".classifier/" in n for n in kept)
    ir = openvino.Core().read_model(str(env.int8 / OPENVINO_FILE))
    ops = {op.get_friendly_name(): op for op in ir.get_ops()}
    for name in kept:  # the weight input of each kept MatMul is an f32 constant, not a dequantized int8 one
        weight = ops[name].input_value(1).get_node()
        assert weight.get_type_name() == "Constant" and weight.get_output_element_type(0).get_type_name() == "f32"
    layer = [n for n in ops if ".encoder.layer.0.attention.self.query/" in n and ops[n].get_type_name() == "MatMul"]
    assert layer and ops[layer[0]].input_value(1).get_node().get_type_name() != "Constant"  # int8, then dequantized


def test_the_matmuls_outside_the_layers_are_told_apart_by_name():
    from compress.core.formats.openvino import matmuls_outside

    class Op:
        def __init__(self, name):
            self.name = name

        def get_type_name(self):
            return "MatMul"

        def get_friendly_name(self):
            return self.name

    model = SimpleNamespace(get_ops=lambda: [Op("__module.inner.bert.encoder.layer.0.attention.self.query/aten::linear/MatMul"),
                                             Op("__module.inner.bert.encoder.layer.11.output.dense/aten::linear/MatMul"),
                                             Op("__module.inner.bert.pooler.dense/aten::linear/MatMul"),
                                             Op("__module.inner.classifier/aten::linear/MatMul")])
    assert matmuls_outside(model, "bert.encoder.layer") == ["__module.inner.bert.pooler.dense/aten::linear/MatMul",
                                                            "__module.inner.classifier/aten::linear/MatMul"]
    onnx = SimpleNamespace(get_ops=lambda: [Op("/bert/encoder/layer.1/output/dense/MatMul"), Op("/classifier/MatMul")])
    assert matmuls_outside(onnx, "bert.encoder.layer") == ["/classifier/MatMul"]
    # a graph whose ops carry no module names: nothing can be told apart, so nothing is kept out
    assert matmuls_outside(SimpleNamespace(get_ops=lambda: [Op("MatMul_1"), Op("MatMul_2")]), "bert.encoder.layer") == []


def test_int8_outputs_are_close_to_fp32(env):
    check = read_compression(env.int8)["check"]  # quantize's own check on 16 training examples
    assert check["max_abs_diff"] <= 0.1 * check["fp32_max_abs"] and check["argmax_agreement"] >= 0.9
    texts = [text for text, _ in synthetic.examples(24, seed=11)]  # calibration-like inputs it has not seen
    reference, got = outputs(env.parent, texts), outputs(env.int8, texts)
    assert np.abs(got - reference).max() <= 0.1 * np.abs(reference).max()
    assert (got.argmax(1) == reference.argmax(1)).mean() >= 0.9
    assert got.std(axis=0).max() > 0  # still depends on the input


@pytest.mark.e2e
def test_an_fp32_onnx_directory_quantizes_with_openvino_too(env, tmp_path):
    from compress.core.formats.onnx import export_onnx

    out = quantize(export_onnx(env.parent, tmp_path / "onnx"), tmp_path / "int8", qconfig(env))
    record = read_compression(out)
    assert record["source_format"] == "onnx" and record["structure"] == read_compression(env.int8)["structure"]
    assert record["layer_precisions"].get("u8", 0) + record["layer_precisions"].get("i8", 0) >= 14
    assert record["check"]["max_abs_diff"] <= 0.1 * record["check"]["fp32_max_abs"]


@pytest.mark.e2e
def test_accuracy_control_runs_and_falls_back_to_the_guard(env, tmp_path, monkeypatch):
    out = quantize(env.parent, tmp_path / "ac", qconfig(env, max_drop=5.0))
    control = read_compression(out)["openvino_quantization"]["accuracy_control"]
    assert control == {"split": "dev", "metric": "accuracy", "examples": 32, "max_drop": 5.0, "used": True}
    assert read_compression(out)["accuracy"]["passed"] is True

    import nncf

    def refuse(*args, **kwargs):
        raise RuntimeError("not for this model")

    monkeypatch.setattr(nncf, "quantize_with_accuracy_control", refuse)
    out = quantize(env.parent, tmp_path / "fallback", qconfig(env, max_drop=5.0))
    record = read_compression(out)
    assert record["openvino_quantization"]["accuracy_control"]["used"] is False
    assert "not for this model" in record["openvino_quantization"]["accuracy_control"]["reason"]
    assert record["accuracy"]["max_drop"] == 5.0 and [r["kind"] for r in read_metrics(out)] == ["eval", "quantize"]


@pytest.mark.e2e
def test_degenerate_int8_outputs_abort_and_leave_nothing(env, tmp_path, monkeypatch):
    from tests.quantize.test_quantize import break_runtime

    break_runtime(monkeypatch, "zeros")
    with pytest.raises(CompressError, match="the openvino backend produced all-zero outputs"):
        quantize(env.parent, tmp_path / "int8", qconfig(env))
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------- eval and latency


def test_compress_eval_runs_on_the_openvino_folder(env):
    from compress.eval.evaluate import EvalConfig, evaluate

    (record,) = evaluate(env.int8, EvalConfig(task="sst2", data_dir=str(env.data), record=False))
    # Same dev split, length and runner as quantize's own scoring: the same number.
    assert record["metrics"]["accuracy"] == pytest.approx(read_compression(env.int8)["accuracy"]["quantized"])


@pytest.mark.e2e
def test_latency_runs_openvino_and_reports_the_precision(env):
    assert AUTO_BACKENDS[artifact_format(env.int8)] == "openvino"
    cfg = from_dict(LatencyConfig, {"backend": "openvino", "warmup": 1, "repeats": 2, "seq": (16,), "threads": 1,
                                    "peak": False, "record": False})
    report = measure_latency([env.parent, env.int8], cfg)  # the fp32 PyTorch parent is converted in its worker
    assert [r.backend for r in report["rows"]] == ["openvino", "openvino-int8"]
    assert all(r.p50_ms > 0 and "inference precision f32" in r.note for r in report["rows"])
    assert "u8" in report["rows"][1].note or "i8" in report["rows"][1].note


def test_a_runner_compiled_for_one_shape_gives_the_dynamic_outputs_and_refuses_others(env):
    from compress.core.formats.artifacts import load_config, saved_head

    config, head = load_config(env.int8), saved_head(env.int8)
    dynamic = OpenVINORunner(env.int8, config, head, threads=1)
    static = OpenVINORunner(env.int8, config, head, threads=1, shape=(2, 12))
    assert [port.get_partial_shape().is_static for port in static.compiled.inputs] == [True] * len(static.compiled.inputs)
    assert not dynamic.compiled.inputs[0].get_partial_shape().is_static
    batch = {"input_ids": torch.randint(5, 50, (2, 12)), "attention_mask": torch.ones(2, 12, dtype=torch.long),
             "token_type_ids": torch.zeros(2, 12, dtype=torch.long)}
    with torch.inference_mode():
        np.testing.assert_allclose(static(**batch).logits.numpy(), dynamic(**batch).logits.numpy(), atol=1e-5)
        with pytest.raises(CompressError, match=r"compiled for inputs of shape \(2, 12\); got \(2, 8\)"):
            static(**{k: v[:, :8] for k, v in batch.items()})  # another shape is refused, not run wrong
        # the any-shape runner takes each call's shape, and back: the same input gives the same logits after a shorter one
        long, short, again = (dynamic(**{k: v[:1, :seq] for k, v in batch.items()}).logits for seq in (12, 5, 12))
        assert long.shape == short.shape == (1, 2) and torch.equal(long, again) and not torch.equal(long, short)
        first, second = static(**batch).logits, static(**batch).logits
        assert first.data_ptr() != second.data_ptr()  # each call's outputs are its own, not the request's buffer


def test_only_batch_by_sequence_inputs_get_a_fixed_shape():
    import openvino.opset13 as ops

    from compress.core.formats.openvino_runtime import compile_openvino

    image = ops.parameter([-1, 3, 8], np.float32, name="pixels")
    model = openvino.Model([ops.relu(image)], [image], "not-an-encoder")
    with pytest.raises(CompressError, match="input pixels is not \\[batch, seq\\]"):
        compile_openvino(model, threads=1, shape=(1, 8))
    assert compile_openvino(model, threads=1) is not None  # compiled for any shape, it is fine


@pytest.mark.e2e
@pytest.mark.parametrize("shapes", ["static", "dynamic"])
def test_latency_compiles_openvino_per_grid_point_when_asked(env, shapes):
    from compress.eval.latency.backends import openvino_session

    cfg = from_dict(LatencyConfig, {"backend": "openvino", "batch": (1, 2), "seq": (16,), "threads": 1,
                                    "openvino_shapes": shapes})
    session = openvino_session(env.parent, cfg)  # an fp32 PyTorch folder: converted, then compiled
    assert session.note.endswith("compiled for each grid point's fixed [batch, seq]" if shapes == "static"
                                 else "compiled for any shape")
    assert (session.compile_for is not None) == (shapes == "static")
    if shapes == "static":
        inputs = session.prepare({"input_ids": np.full((2, 16), 7), "attention_mask": np.ones((2, 16), dtype=np.int64),
                                  "token_type_ids": np.zeros((2, 16), dtype=np.int64)})
        forward = session.compile_for((2, 16))  # from the converted IR, which outlives the session's creation
        (logits,) = forward(inputs)  # the runtime's own call on feeds built by prepare: numpy out
        assert isinstance(logits, np.ndarray) and logits.shape == (2, 2)
        np.testing.assert_allclose(logits, session.forward(inputs)[0], atol=1e-5)
        with pytest.raises(CompressError, match="compiled for inputs of shape"):
            forward([array[:1] for array in inputs])  # (1, 16) is not its shape
    with pytest.raises(CompressError, match="--openvino-shapes is static or dynamic"):
        from_dict(LatencyConfig, {"openvino_shapes": "fixed"}).validate()


def test_asking_for_bf16_is_honoured_where_the_cpu_has_it(env):
    from compress.core.formats.artifacts import load_config, saved_head

    runner = OpenVINORunner(env.int8, load_config(env.int8), saved_head(env.int8), threads=1, precision="bf16")
    assert runner.precision == ("bf16" if openvino_bf16() else "f32")  # the precision reported is the one that runs


# ---------------------------------------------------------------------------- bad requests


@pytest.mark.parametrize("changes, match", [
    ({"scheme": "dynamic"}, "the openvino backend does not do dynamic quantization; it does static"),
    ({"task": ""}, "static quantization needs a task's training examples to calibrate on; pass --task"),
    ({"preset": "avx2"}, "--preset chooses ONNX Runtime kernels; the openvino backend has none"),
])
def test_bad_quantize_requests_are_one_line_errors(env, changes, match):
    with pytest.raises(CompressError, match=match) as err:
        qconfig(env, **changes)
    assert "\n" not in str(err.value)


def test_bad_load_and_export_requests_are_one_line_errors(env, tmp_path):
    for call, match in [
        (lambda: export_openvino(env.int8, tmp_path / "again"), "is an OpenVINO IR already"),
        (lambda: load_model(env.int8, head="question-answering"), "cannot be given a question-answering head"),
        (lambda: load_model(env.int8).to(torch.bfloat16), "cannot be cast"),
        (lambda: export_openvino(env.uniform, env.int8), "not empty; pass --overwrite"),
    ]:
        with pytest.raises(CompressError, match=match) as err:
            call()
        assert "\n" not in str(err.value)
    broken = tmp_path / "broken"
    broken.mkdir()
    for item in env.int8.iterdir():
        (broken / item.name).write_bytes(item.read_bytes()[:100] if item.name == OPENVINO_FILE else item.read_bytes())
    with pytest.raises(CompressError, match="OpenVINO cannot compile") as err:
        load_model(broken)
    assert "\n" not in str(err.value)


def test_the_record_of_a_quantized_ir_is_complete(env):
    record = read_compression(env.int8)
    assert record["parent"]["path"] == str(env.parent.resolve()) and record["parent"]["hash"].startswith("sha256:")
    assert record["structure"] == {**describe(load_model(env.parent)), "first_token_last_layer": True}
    assert record["outputs"] == ["logits"]
    assert record["calibration"] == {**record["calibration"], "task": "sst2", "split": "train", "examples": 16}
    assert record["config"]["backend"] == "openvino" and record["config"]["scheme"] == "static"
