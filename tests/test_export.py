"""`compress export`: every artifact kind to ONNX / OpenVINO, outputs equal to the source's, or one clear refusal."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from compress.cli import main
from compress.core.model import structure as st
from compress.core.formats.records import read_compression
from compress.core.formats.runtime import load_model
from compress.export import ExportConfig, export
from compress.quantize.config import QuantizeConfig
from compress.quantize.run import quantize
from tests.conftest import make_tiny_model, make_tokenizer, save_tiny

# Depends on the installed transformers version: the transformers 4.57 set runs it too (make test-transformers4).
pytestmark = pytest.mark.versions

TEXTS = ["a gripping , funny film .", "the plot made no sense at all and the actors looked bored", "no"]


def logits(path, tokenizer):
    model = load_model(path)
    with torch.no_grad():
        return model(**st.model_inputs(model, tokenizer(TEXTS, padding=True, return_tensors="pt"))).logits.float().numpy()


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("export")
    tokenizer = make_tokenizer(tmp / "tok")
    model = make_tiny_model(seed=5)
    st.prune_heads(model, {0: [0, 3], 1: [1]})  # 2 and 3 heads
    st.resize_ffn(model, 1, range(17))  # FFN widths 37 and 17: no stock config expresses this
    pruned = save_tiny(model, tokenizer, tmp / "pruned")
    return {
        "tokenizer": tokenizer,
        "fp32": save_tiny(make_tiny_model(seed=5), tokenizer, tmp / "fp32"),
        "pruned": pruned,
        "onnx-int8": quantize(pruned, tmp / "onnx-int8", QuantizeConfig(backend="onnxruntime")),
        "torch-int8": quantize(pruned, tmp / "torch-int8", QuantizeConfig(backend="torch")),
    }


@pytest.mark.e2e
@pytest.mark.parametrize("kind", ["fp32", "pruned"])
@pytest.mark.parametrize("fmt", ["onnx", "openvino"])
def test_an_fp32_model_of_any_structure_exports_with_equal_outputs(sources, kind, fmt, tmp_path):
    out = export(sources[kind], tmp_path / "out", ExportConfig(format=fmt))
    record = read_compression(out)
    assert record["stage"] == "export" and record["format"] == fmt and record["source_format"] == "torch"
    # The exported graph's structure: a classifier's last layer computes the first token only.
    assert record["structure"] == {**read_compression(sources[kind])["structure"], "first_token_last_layer": True}
    assert record["check"]["max_abs_diff"] < 1e-4 and record["check"]["argmax_agreement"] == 1.0
    # Independently of the recorded check: our loader runs the exported files like the source.
    np.testing.assert_allclose(logits(out, sources["tokenizer"]), logits(sources[kind], sources["tokenizer"]), atol=1e-4)


def test_an_onnx_runtime_int8_model_exports_to_onnx_as_it_is(sources, tmp_path):
    out = export(sources["onnx-int8"], tmp_path / "out", ExportConfig(format="onnx"))
    record = read_compression(out)
    assert record["source_format"] == "onnx" and record["precision"] == "int8" and record["check"]["max_abs_diff"] == 0.0
    assert (out / "model.onnx").read_bytes() == (sources["onnx-int8"] / "model.onnx").read_bytes()


def test_dynamic_int8_onnx_to_openvino_is_refused_naming_the_openvino_quantizer(sources, tmp_path, capsys):
    # OpenVINO would run MatMulInteger emulated in f32 (slower than fp32): not an int8 model.
    code = main(["export", "--model", str(sources["onnx-int8"]), "--format", "openvino", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and "compress quantize --backend openvino" in err[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("fmt", ["onnx", "openvino"])
def test_torch_int8_is_refused_in_one_line_naming_the_way_out(sources, fmt, tmp_path, capsys):
    code = main(["export", "--model", str(sources["torch-int8"]), "--format", fmt, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and "Traceback" not in err[0]
    assert "has no" in err[0] and f"compress quantize --model {sources['pruned'].resolve()}" in err[0]
    assert not (tmp_path / "out").exists()


def test_the_command_prints_the_check_and_refuses_a_non_empty_out(sources, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["export", "--model", str(sources["pruned"]), "--format", "onnx", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "largest output difference" in text and "argmax agreement 100%" in text
    assert (out / "model.onnx").is_file() and (out / "README.md").is_file()
    assert main(["export", "--model", str(sources["pruned"]), "--format", "onnx", "--out", str(out)]) != 0
    assert "--overwrite" in capsys.readouterr().err


def test_a_check_beyond_the_tolerance_writes_nothing(sources, tmp_path):
    from compress.core.errors import CompressError

    with pytest.raises(CompressError, match="differs from it by"):
        export(sources["onnx-int8"], tmp_path / "out", ExportConfig(format="onnx", tolerance=-1.0))  # no difference passes a negative tolerance
    assert not (tmp_path / "out").exists()
