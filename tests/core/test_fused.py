"""ONNX Runtime's fused transformer graph: `compress export --fuse` and `compress quantize --backend onnxruntime --fuse`.

The fused graph's com.microsoft nodes are counted here from the file itself and compared with what
compression.json records; its outputs are compared with PyTorch's, and it runs through eval and latency.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from compress.cli import main
from compress.core.model import structure as st
from compress.core.data import synthetic
from compress.core.formats.records import read_compression
from compress.core.config import from_dict
from compress.core.errors import CompressError
from compress.core.formats.runtime import load_model
from compress.core.formats.sentence import SentenceSpec, is_sentence_folder, read_spec, write_sentence_files
from compress.eval.evaluate import EvalConfig, evaluate
from compress.eval.latency.config import LatencyConfig
from compress.eval.latency.runs import measure_latency
from compress.export import ExportConfig, export
from compress.quantize.config import QuantizeConfig
from compress.quantize.run import quantize
from tests.conftest import make_tiny_model, make_tokenizer, save_tiny
from tests.core.test_families import make_model
from tests.core.test_families import make_tokenizer as family_tokenizer

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime.transformers.optimizer")

TEXTS = ["a gripping , funny film .", "the plot made no sense at all and the actors looked bored", "no"]
MS = "com.microsoft"


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> SimpleNamespace:
    """Generated SST-2 data, the test tokenizer, and the source folders (each exported with --fuse once)."""
    root = tmp_path_factory.mktemp("fused")
    synthetic.write_sst2_layout(root / "glue", n_train=48, n_dev=24, n_test=4)
    tokenizer = make_tokenizer(root / "tok")
    base = save_tiny(make_tiny_model("base", seed=3), tokenizer, root / "base")
    write_sentence_files(base, SentenceSpec(pooling="mean", normalize=True), 32)  # a sentence-embedding folder
    return SimpleNamespace(root=root, data=root / "glue", tokenizer=tokenizer, base=base, fused={},
                           cls=save_tiny(make_tiny_model(seed=5), tokenizer, root / "cls", extra={"task": "sst2"}))


def fused(env, name: str) -> Path:
    if name not in env.fused:
        env.fused[name] = export(getattr(env, name), env.root / f"{name}-fused", ExportConfig(fuse=True))
    return env.fused[name]


def graph_ops(path: Path) -> Counter:
    """(domain, op type) -> nodes in ``path/model.onnx``."""
    return Counter((node.domain, node.op_type) for node in onnx.load(str(path / "model.onnx")).graph.node)


def outputs(path: Path, tokenizer, name: str) -> torch.Tensor:
    """The output ``name`` on TEXTS (padded batch), padded positions dropped."""
    model = load_model(path)
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = getattr(model(**st.model_inputs(model, dict(batch))), name).float()
    return out[batch["attention_mask"].bool()] if out.dim() == 3 else out


@pytest.mark.parametrize("name, output", [("cls", "logits"), ("base", "last_hidden_state")])
def test_the_fused_export_records_the_com_microsoft_nodes_it_holds_and_matches_pytorch(env, name, output):
    out = fused(env, name)
    record, ops = read_compression(out), graph_ops(out)
    assert record["format"] == "onnx" and record["fused"]["model_type"] == "bert" and record["fused"]["num_heads"] == 4
    for op in ("Attention", "MultiHeadAttention", "SkipLayerNormalization", "EmbedLayerNormalization", "BiasGelu"):
        assert record["fusion"].get(op, 0) == ops[MS, op], op
    # 2 layers: two SkipLayerNormalization each; every layer's attention fused, except a classifier's last,
    # which computes the first token only (a pattern the optimizer does not match).
    assert ops[MS, "SkipLayerNormalization"] == 4 and ops[MS, "Attention"] == (1 if name == "cls" else 2)
    assert ops["", "LayerNormalization"] == 0 and ops["", "Softmax"] == (1 if name == "cls" else 0)
    assert record["check"]["max_abs_diff"] < 1e-3
    torch.testing.assert_close(outputs(out, env.tokenizer, output), outputs(getattr(env, name), env.tokenizer, output),
                               atol=1e-3, rtol=0)


def test_a_fused_embedding_folder_stays_one_and_the_command_prints_the_fusion(env, tmp_path, capsys):
    out = tmp_path / "emb"
    assert main(["export", "--model", str(env.base), "--format", "onnx", "--fuse", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "fused by ONNX Runtime's transformer optimizer: " in text and "Attention 2" in text and "SkipLayerNormalization 4" in text
    assert is_sentence_folder(out) and read_spec(out) == read_spec(env.base)


@pytest.mark.e2e
def test_eval_and_latency_run_on_the_fused_classifier(env, capsys):
    out = fused(env, "cls")
    cfg = EvalConfig(task="sst2", data_dir=str(env.data), record=False)
    (before,), (after,) = evaluate(env.cls, cfg), evaluate(out, cfg)
    assert after["n"] == 24 and after["metrics"]["accuracy"] == before["metrics"]["accuracy"]
    assert main(["eval", "--model", str(out), "--data-dir", str(env.data), "--no-record"]) == 0
    assert "accuracy" in capsys.readouterr().out
    report = measure_latency([out], from_dict(LatencyConfig, {"warmup": 1, "repeats": 2, "seq": (16,), "threads": 1,
                                                              "peak": False, "record": False}))
    assert report["rows"][0].backend == "onnxruntime" and report["rows"][0].p50_ms > 0


def test_per_layer_head_counts_fuse_every_layer_with_its_own_count(env, tmp_path, monkeypatch):
    # Sharp attention (large random weights): a wrong head split changes the outputs (near-uniform attention would not).
    model = make_tiny_model("base", seed=4, initializer_range=0.5)
    st.prune_heads(model, {0: [0, 3], 1: [1]})  # 2 and 3 heads of 8 dimensions
    pruned = save_tiny(model, env.tokenizer, tmp_path / "pruned")
    out = export(pruned, tmp_path / "out", ExportConfig(fuse=True))
    attention = [n for n in onnx.load(str(out / "model.onnx")).graph.node if n.op_type == "Attention"]
    assert [next(a.i for a in n.attribute if a.name == "num_heads") for n in attention] == [2, 3]
    record = read_compression(out)
    assert record["check"]["max_abs_diff"] < 1e-3
    # Where the optimizer gives every layer the one count it is told (the transformers 5 graph), the 3-head layer is
    # corrected, and without the correction it is split in 2 and fails the check. (On the transformers 4.57 graph the
    # optimizer already fused each layer with its own count: nothing to correct.)
    if record["fused"]["attention_heads_corrected"]:
        assert record["fused"]["attention_heads_corrected"] == 1
        monkeypatch.setattr("compress.core.formats.onnx.set_attention_heads", lambda model, head_size: 0)
        with pytest.raises(CompressError, match="differs from it by"):
            export(pruned, tmp_path / "wrong", ExportConfig(fuse=True))


def test_modernbert_fuses_its_layer_norms_but_not_its_attention(tmp_path):
    model_dir = save_tiny(make_model("modernbert"), family_tokenizer("modernbert", tmp_path / "tok"), tmp_path / "mb")
    record = read_compression(export(model_dir, tmp_path / "out", ExportConfig(fuse=True)))
    # Its rotary attention matches none of the optimizer's BERT patterns; residual LayerNorms and GELU do.
    assert "Attention" not in record["fusion"] and "MultiHeadAttention" not in record["fusion"]
    assert record["fusion"]["SkipLayerNormalization"] == 4 and record["fusion"]["Gelu"] >= 1
    assert record["check"]["max_abs_diff"] < 1e-3


def test_a_graph_where_nothing_fuses_is_refused_in_one_line(env, tmp_path, monkeypatch, capsys):
    from onnxruntime.transformers import optimizer
    from onnxruntime.transformers.fusion_options import FusionOptions

    real = optimizer.optimize_model

    def nothing_fuses(*args, **kwargs):
        options = FusionOptions("bert")
        options.enable_attention = options.enable_skip_layer_norm = options.enable_bias_skip_layer_norm = False
        return real(*args, optimization_options=options, **kwargs)

    monkeypatch.setattr(optimizer, "optimize_model", nothing_fuses)
    out = tmp_path / "out"
    assert main(["export", "--model", str(env.cls), "--format", "onnx", "--fuse", "--out", str(out)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fused no Attention and no SkipLayerNormalization" in err[0] and "without --fuse" in err[0]
    assert f"bert graph of {env.cls.resolve()}" in err[0]
    assert not out.exists()


@pytest.mark.parametrize("argv, says", [
    (["--format", "openvino", "--fuse"], "use it with --format onnx"),
    (["--format", "onnx", "--fuse", "INT8"], "is int8; --fuse optimises an fp32 graph"),
])
def test_fuse_outside_an_fp32_onnx_export_is_refused_in_one_line(env, tmp_path, capsys, argv, says):
    model = env.cls
    if "INT8" in argv:
        argv = argv[:-1]
        model = quantize(env.cls, tmp_path / "int8", QuantizeConfig(backend="onnxruntime"))
    assert main(["export", "--model", str(model), *argv, "--out", str(tmp_path / "out")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0]


@pytest.mark.e2e
@pytest.mark.parametrize("scheme", ["dynamic", "static"])
def test_the_fused_graph_quantizes_dynamic_and_static(env, tmp_path, scheme, capsys):
    out = tmp_path / "int8"
    assert main(["quantize", "--model", str(env.cls), "--backend", "onnxruntime", "--scheme", scheme, "--fuse",
                 "--task", "sst2", "--data-dir", str(env.data), "--calibration-examples", "16", "--out", str(out)]) == 0
    assert "fused by ONNX Runtime's transformer optimizer: " in capsys.readouterr().out
    record, ops = read_compression(out), graph_ops(out)
    assert record["fusion"] == read_compression(fused(env, "cls"))["fusion"]
    assert record["fused"]["shape_inference"] == "onnxruntime symbolic"
    if scheme == "dynamic":  # the fused attention and embedding quantized too
        assert ops[MS, "QAttention"] == 1 and ops[MS, "QEmbedLayerNormalization"] == 1 and ops["", "MatMulInteger"] >= 6
    else:  # QDQ has no Attention quantizer: it stays fp32, the MatMuls around it get int8 weights and activations
        assert ops[MS, "Attention"] == 1 and ops["", "QuantizeLinear"] >= 6 and ops["", "MatMul"] >= 6
    assert ops[MS, "SkipLayerNormalization"] == 4
    assert record["check"]["max_abs_diff"] <= 0.1 * record["check"]["fp32_max_abs"]
    assert record["accuracy"]["quantized"] is not None


def test_an_export_fuse_folder_quantizes_as_it_is_and_fuse_needs_onnxruntime(env, tmp_path):
    out = quantize(fused(env, "cls"), tmp_path / "int8", QuantizeConfig(backend="onnxruntime"))
    assert read_compression(out)["fused"]["shape_inference"] == "onnxruntime symbolic"
    assert graph_ops(out)[MS, "QAttention"] == 1
    with pytest.raises(CompressError, match="--fuse quantizes ONNX Runtime's fused graph; use it with --backend onnxruntime"):
        quantize(env.cls, tmp_path / "t", QuantizeConfig(backend="torch", fuse=True))
