"""ONNX Runtime static int8 (QDQ): per-channel weights, the exclusion search, the recipes, the guard's refusal.

A 2-layer BERT of hidden 32 on generated SST-2 rows, quantized once per module in the
measured recipe and once in the plain one, checks the written graph and the guard. The
search is checked on a random sentence-embedding encoder of the same size (its outputs are
the hidden states, which every node moves; a random classifier's two logits barely move):
one node's own error is recomputed by hand, and an error injected into one node's
activation range must make the search keep exactly that node fp32.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

import onnx  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402

from compress.core.config import from_dict  # noqa: E402
from compress.core.data import synthetic  # noqa: E402
from compress.core.errors import CompressError  # noqa: E402
from compress.core.formats.records import read_compression  # noqa: E402
from compress.core.model.shapes import Shape  # noqa: E402
from compress.quantize import checks, ort_search  # noqa: E402
from compress.quantize import onnxruntime as ort_backend  # noqa: E402
from compress.quantize.config import QuantizeConfig  # noqa: E402
from compress.quantize.run import quantize, rejected_path  # noqa: E402

SPOILED = "layer.0/output/dense/MatMul"  # the node whose input range the injection test spoils (the first FFN output)


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> SimpleNamespace:
    """Generated SST-2 rows, a random 2-layer hidden-32 classifier, and its measured and plain static int8."""
    from compress.teacher.create import create_model

    root = tmp_path_factory.mktemp("ort-static")
    synthetic.write_sst2_layout(root / "glue", n_train=48, n_dev=16, n_test=4)
    vocab = synthetic.write_vocab(root / "vocab.txt")
    parent = create_model(Shape(2, 32, 4, 37), root / "fp32", tokenizer=vocab, task="sst2", max_positions=64)
    env = SimpleNamespace(root=root, data=root / "glue", parent=parent)
    env.measured = quantize(parent, root / "measured", config(env))
    with ort_backend.static_recipe(ort_backend.PLAIN):
        env.plain = quantize(parent, root / "plain", config(env))
    return env


@pytest.fixture(scope="module")
def encoder(tmp_path_factory) -> SimpleNamespace:
    """A random 2-layer hidden-32 sentence-embedding folder, generated sentences, its measured static int8."""
    from tests.conftest import make_tokenizer
    from tests.core.test_sentence import corpus, st_folder

    root = tmp_path_factory.mktemp("ort-static-encoder")
    # Weights of std 0.3 (BERT's initialisation: 0.02): each sublayer then moves the hidden states, as a trained one does.
    folder = st_folder(root, make_tokenizer(root / "tok"), name="fp32", initializer_range=0.3)
    encoder = SimpleNamespace(root=root, folder=folder, text=corpus(root / "c.txt", n=80))
    encoder.measured = quantize(folder, root / "measured", encoder_config(encoder))
    return encoder


def encoder_config(encoder) -> QuantizeConfig:
    return from_dict(QuantizeConfig, {"backend": "onnxruntime", "scheme": "static", "corpus": [str(encoder.text)],
                                      "calibration_examples": 16, "check_sentences": 16})


def config(env, **changes) -> QuantizeConfig:
    base = {"backend": "onnxruntime", "scheme": "static", "task": "sst2", "data_dir": str(env.data),
            "calibration_examples": 16}
    return from_dict(QuantizeConfig, {**base, **changes})


def graph(out: Path):
    return onnx.load(str(out / "model.onnx")).graph


def weight_dequantizers(g) -> list[tuple[onnx.NodeProto, np.ndarray, np.ndarray]]:
    """Each DequantizeLinear of a 2-D int8 weight feeding a MatMul: (node, int8 weight (in, out), its scales)."""
    weights = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    readers = {name for n in g.node if n.op_type == "MatMul" for name in n.input}
    found = []
    for node in g.node:
        if node.op_type == "DequantizeLinear" and node.output[0] in readers and node.input[0] in weights:
            values = weights[node.input[0]]
            if values.ndim == 2 and values.dtype in (np.int8, np.uint8):
                found.append((node, values, weights[node.input[1]]))
    return found


# ---------------------------------------------------------------------------- per-channel weights


def test_written_weights_have_one_scale_per_output_channel(env):
    found = weight_dequantizers(graph(env.measured))
    assert len(found) >= 12  # 2 layers x 6 weight matrices, besides pooler and classifier
    for node, values, scales in found:
        axis = next(a.i for a in node.attribute if a.name == "axis")
        assert axis == 1 and scales.shape == (values.shape[1],)  # MatMul weights are (in, out): a scale per out
    record = read_compression(env.measured)["onnx_quantization"]
    assert record["weights"].endswith("per channel") and record["recipe"] == "measured"


def test_per_tensor_weights_when_asked(env, tmp_path):
    out = quantize(env.parent, tmp_path / "per-tensor", config(env, per_channel=False))
    found = weight_dequantizers(graph(out))
    assert found and all(scales.shape == () for _, _, scales in found)


# ---------------------------------------------------------------------------- the recipes


def readers_of_dequantized(g) -> set[str]:
    """The op types that read a DequantizeLinear's output."""
    dequantized = {n.output[0] for n in g.node if n.op_type == "DequantizeLinear"}
    return {n.op_type for n in g.node if n.op_type not in ort_search.QDQ_OPS and set(n.input) & dequantized}


def test_measured_recipe_feeds_int8_to_matmul_and_gather_only_plain_to_layernorm_and_the_residual_add(env):
    assert readers_of_dequantized(graph(env.measured)) <= {"MatMul", "Gemm", "Gather"}
    # No MatMul output is quantized: no QuantizeLinear reads a MatMul's output.
    g = graph(env.measured)
    matmul_outputs = {n.output[0] for n in g.node if n.op_type == "MatMul"}
    assert not any(n.op_type == "QuantizeLinear" and n.input[0] in matmul_outputs for n in g.node)
    # The plain recipe (the backend before) quantizes LayerNorm inputs, and the residual Add reads int8 values.
    plain = readers_of_dequantized(graph(env.plain))
    assert {"LayerNormalization", "Add"} <= plain
    record = read_compression(env.plain)["onnx_quantization"]
    assert record["recipe"] == "plain" and record["exclusion_search"] is None and record["matmul_outputs"] == "int8"
    assert record["calibration"] == {"method": "minmax", "rows": 16, "inputs": "padded batches"}


# ---------------------------------------------------------------------------- the search


def test_a_nodes_own_error_is_the_one_computed_by_hand(encoder):
    """local_errors() of one quantized MatMul: its output with the int8 graph's Q/DQ applied to its input and weight,
    against its fp32 output, recomputed here in numpy from the written graph's scales."""
    int8 = onnx.load(str(encoder.measured / "model.onnx"))
    fp32 = _fp32_graph(encoder.folder, encoder.root)
    ort_search.name_nodes(fp32)
    node = next(n for n in int8.graph.node if n.op_type == "MatMul" and "layer.0/intermediate/dense" in n.name)
    original = next(n for n in fp32.graph.node if n.name == node.name)
    rows = _rows(encoder)
    got = ort_search.local_errors(ort_search.Graphs(fp32, int8), [node.name], rows)[node.name]

    producers = {out: n for n in int8.graph.node for out in n.output}
    weights = {t.name: numpy_helper.to_array(t) for t in int8.graph.initializer}
    x_dq, w_dq = (producers[name] for name in node.input)  # DequantizeLinear of the activation and of the weight
    x_scale, x_zero = weights[x_dq.input[1]], weights[x_dq.input[2]].astype(np.float64)
    w_int8, w_scale = weights[w_dq.input[0]].astype(np.float64), weights[w_dq.input[1]]
    w_zero = weights[w_dq.input[2]].astype(np.float64) if len(w_dq.input) > 2 else 0.0
    probe = _with_output(fp32, original.input[0])
    err = ref = 0.0
    for x in (values[-1] for values in ort_search.run_rows(probe, rows)):  # (1, seq, hidden)
        w = numpy_helper.to_array(next(t for t in fp32.graph.initializer if t.name == original.input[1]))
        q = np.clip(np.round(x / x_scale) + x_zero, 0, 255)  # uint8 activations
        y8 = ((q - x_zero) * x_scale) @ ((w_int8 - w_zero) * w_scale)  # weight scales broadcast per output column
        y = x.astype(np.float64) @ w
        err, ref = err + float(np.sum((y8 - y) ** 2)), ref + float(np.sum(y ** 2))
    assert got == pytest.approx((err / ref) ** 0.5, rel=1e-3)
    assert 0 < got < 0.1  # a well-calibrated MatMul: a few percent


def _fp32_graph(folder: Path, root: Path):
    """The fp32 graph the backend quantizes: the folder's ONNX export."""
    from compress.core.formats.onnx import export_onnx

    out = root / "fp32-onnx"
    if not (out / "model.onnx").is_file():
        export_onnx(folder, out)
    return onnx.load(str(out / "model.onnx"))


def _rows(encoder) -> list[dict[str, np.ndarray]]:
    """The calibration rows the backend measured on, each at its own length."""
    from compress.core.formats.artifacts import load_tokenizer
    from compress.quantize.calibration import sentence_calibration

    calibration, _ = sentence_calibration(encoder.folder, load_tokenizer(encoder.folder), encoder_config(encoder), 64)
    return calibration.rows()


def _with_output(model, name: str):
    """``model`` with the tensor ``name`` as its last output."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    model.graph.output.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    return model


def test_the_search_keeps_fp32_exactly_the_node_whose_range_was_spoiled(encoder, tmp_path, monkeypatch):
    fp32 = _fp32_graph(encoder.folder, encoder.root)
    target = next(n for n in fp32.graph.node if n.op_type == "MatMul" and SPOILED in n.name)
    real = ort_backend._calibrate

    def spoiled(*args, **kwargs):  # the FFN output's input range 1000 times too wide: its int8 input is ~all zero
        ranges = real(*args, **kwargs)
        low, high = ranges[target.input[0]].range_value
        ranges[target.input[0]] = type(ranges[target.input[0]])(lowest=low * 1000, highest=high * 1000)
        return ranges

    monkeypatch.setattr(ort_backend, "_calibrate", spoiled)
    out = quantize(encoder.folder, tmp_path / "int8", encoder_config(encoder))
    record = read_compression(out)["onnx_quantization"]
    assert record["nodes_to_exclude"] == [target.name]
    (kept,) = record["exclusion_search"]["excluded"]
    assert kept["op"] == "MatMul" and kept["own_error"] > 0.5 and kept["share"] > 0.5
    assert kept["why"].startswith(f"quantized alone its output is {100 * kept['own_error']:.1f}% (RMS) off fp32")
    search = record["exclusion_search"]
    assert search["output_error_written"] < 0.1 * search["output_error_all_int8"]
    # The written graph: the excluded node reads fp32 (no DequantizeLinear), the other MatMuls int8.
    g = graph(out)
    dequantized = {n.output[0] for n in g.node if n.op_type == "DequantizeLinear"}
    node = next(n for n in g.node if n.name == target.name)
    assert not set(node.input) & dequantized
    assert len(weight_dequantizers(g)) == len(weight_dequantizers(graph(encoder.measured))) - 1


def test_unspoiled_the_search_keeps_nothing_fp32(encoder):
    search = read_compression(encoder.measured)["onnx_quantization"]["exclusion_search"]
    assert search["excluded"] == [] and search["rows"] == 16
    assert search["output_error_written"] == pytest.approx(search["output_error_all_int8"])


def test_keep_fp32_by_hand_on_a_two_node_graph():
    """keep_fp32() on a QDQ graph written by hand: the node reads its fp32 input and weight again, the dead Q/DQ go."""
    w = numpy_helper.from_array(np.eye(2, dtype=np.float32), "w")
    fp32 = helper.make_model(helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 2])], [w]))
    scale, zero = numpy_helper.from_array(np.float32(0.1), "s"), numpy_helper.from_array(np.uint8(128), "z")
    w8 = numpy_helper.from_array(np.eye(2, dtype=np.int8), "w_q")
    ws = numpy_helper.from_array(np.float32(1.0), "ws")
    qdq = helper.make_model(helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["x_q"], name="q"),
         helper.make_node("DequantizeLinear", ["x_q", "s", "z"], ["x_dq"], name="dq"),
         helper.make_node("DequantizeLinear", ["w_q", "ws"], ["w_dq"], name="wdq"),
         helper.make_node("MatMul", ["x_dq", "w_dq"], ["y"], name="mm")], "g",
        fp32.graph.input, fp32.graph.output, [scale, zero, w8, ws]))
    graphs = ort_search.Graphs(fp32, qdq)
    assert graphs.quantized() == ["mm"]
    kept = ort_search.keep_fp32(graphs, {"mm"})
    assert [(n.op_type, list(n.input)) for n in kept.graph.node] == [("MatMul", ["x", "w"])]
    assert sorted(t.name for t in kept.graph.initializer) == ["w"]


# ---------------------------------------------------------------------------- the guard


def fake_scores(monkeypatch, parent: float, quantized: float) -> None:
    """The guard's dev scores: ``parent`` for the fp32 model (scored first), ``quantized`` for the int8 one."""
    scores = iter([parent, quantized])
    monkeypatch.setattr(checks, "dev_evaluator", lambda *a, **k: lambda model: {"accuracy": next(scores)})


def test_the_guard_refuses_a_drop_above_max_drop_in_one_line(env, tmp_path, monkeypatch):
    fake_scores(monkeypatch, 90.0, 85.5)
    out = tmp_path / "int8"
    with pytest.raises(CompressError) as err:
        quantize(env.parent, out, config(env, max_drop=1.0))
    assert str(err.value) == (
        "int8 SST-2 dev accuracy dropped 4.50 points (90.00 -> 85.50), more than --max-drop 1: try --backend openvino "
        "(NNCF, whose accuracy control keeps the layers that cost accuracy in fp32) or --scheme dynamic; the rejected "
        f"int8 model is in {rejected_path(out)}")
    assert not out.exists() and read_compression(rejected_path(out))["accuracy"]["drop"] == pytest.approx(4.5)


def test_the_guard_passes_a_drop_within_max_drop(env, tmp_path, monkeypatch):
    fake_scores(monkeypatch, 90.0, 89.5)
    out = quantize(env.parent, tmp_path / "int8", config(env, max_drop=1.0))
    accuracy = read_compression(out)["accuracy"]
    assert accuracy["passed"] and accuracy["drop"] == pytest.approx(0.5)


def test_the_refusal_is_one_line_on_the_command_line(env, tmp_path, monkeypatch, capsys):
    from compress.cli import main

    fake_scores(monkeypatch, 90.0, 85.5)
    code = main(["quantize", "--model", str(env.parent), "--backend", "onnxruntime", "--scheme", "static", "--task",
                 "sst2", "--data-dir", str(env.data), "--calibration-examples", "16", "--max-drop", "1",
                 "--out", str(tmp_path / "int8")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and "Traceback" not in err[0]
    assert "dropped 4.50 points (90.00 -> 85.50), more than --max-drop 1: try --backend openvino" in err[0]
