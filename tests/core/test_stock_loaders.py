"""Every artifact kind, loaded with stock tools only: the toolkit's outputs exactly, or an exception.

Never silent garbage: a folder a stock loader "loads" with weights re-initialised is the
failure these tests exist for. The model card's claim (loads stock or not) must match what
the stock loader did.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from compress.core.model import structure as st
from compress.core.formats.layout import INT8_WEIGHTS_FILE, WEIGHTS_FILE
from compress.core.formats.records import read_compression
from compress.core.compat import HAS_OPTIMUM_ONNX, STOCK_PRUNED_HEADS
from compress.core.formats.onnx import export_onnx
from compress.core.formats.runtime import load_model
from compress.export import ExportConfig, export
from compress.quantize.config import QuantizeConfig
from compress.quantize.run import quantize
from tests.conftest import make_tiny_model, make_tokenizer, save_tiny

# Depends on the installed transformers version: the transformers 4.57 set runs it too (make test-transformers4).
pytestmark = pytest.mark.versions

TEXTS = ["the film was a delight .", "a dull , plodding mess that never finds its footing at all", "no"]
TOLERANCE = 1e-4  # fp32 logits, stock loader vs the toolkit's loader (same weights, same ops)


def build_kinds(tmp_path, tokenizer) -> dict:
    """Artifact kind -> directory, from one tiny classifier."""
    kinds = {}
    kinds["fp32"] = save_tiny(make_tiny_model(seed=1), tokenizer, tmp_path / "fp32")
    model = make_tiny_model(seed=1)
    st.prune_heads(model, {0: [1, 2], 1: [3]})  # different head counts per layer
    kinds["heads-pruned"] = save_tiny(model, tokenizer, tmp_path / "heads")
    model = make_tiny_model(seed=1)
    st.resize_ffn(model, 0, range(20))  # FFN widths 20 and 37
    kinds["ffn-global"] = save_tiny(model, tokenizer, tmp_path / "ffn")
    model = make_tiny_model(seed=1)
    for layer in range(2):
        st.resize_ffn(model, layer, range(24))
    kinds["ffn-uniform"] = save_tiny(model, tokenizer, tmp_path / "ffn-uniform")
    kinds["torch-int8"] = quantize(kinds["fp32"], tmp_path / "torch-int8", QuantizeConfig(backend="torch"))
    kinds["onnx"] = export_onnx(kinds["heads-pruned"], tmp_path / "onnx")
    kinds["onnx-int8"] = quantize(kinds["fp32"], tmp_path / "onnx-int8", QuantizeConfig(backend="onnxruntime"))
    kinds["openvino"] = export(kinds["heads-pruned"], tmp_path / "openvino", ExportConfig(format="openvino"))
    return kinds


@pytest.fixture(scope="module")
def kinds(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("kinds")
    return build_kinds(tmp_path, make_tokenizer(tmp_path / "tok"))


def ours(path, tokenizer):
    model = load_model(path)
    with torch.no_grad():
        return model(**tokenizer(TEXTS, padding=True, return_tensors="pt")).logits.float().numpy()


def reproduces_or_raises(load_and_run, reference) -> str:
    """'exact' when the stock result equals ``reference`` within TOLERANCE, 'refused' when it raised; else fail."""
    try:
        theirs = load_and_run()
    except Exception:  # noqa: BLE001 - any loud failure is a refusal
        return "refused"
    np.testing.assert_allclose(theirs, reference, atol=TOLERANCE, err_msg="a stock loader produced different outputs")
    return "exact"


def stock_transformers(path, tokenizer):
    model = transformers.AutoModelForSequenceClassification.from_pretrained(str(path)).eval()
    with torch.no_grad():
        return model(**tokenizer(TEXTS, padding=True, return_tensors="pt")).logits.numpy()


def stock_pipeline(path, _):
    pipe = transformers.pipeline("text-classification", model=str(path), top_k=None, function_to_apply="none")
    rows = pipe(TEXTS)
    labels = sorted(rows[0], key=lambda r: r["label"])
    return np.array([[next(r["score"] for r in row if r["label"] == label["label"]) for label in labels] for row in rows])


def onnx_session(path, tokenizer):
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path / "model.onnx"), providers=["CPUExecutionProvider"])
    enc = tokenizer(TEXTS, padding=True, return_tensors="np")
    names = [i.name for i in session.get_inputs()]
    return session.run(["logits"], {n: enc[n].astype(np.int64) for n in names})[0]


@pytest.mark.e2e
@pytest.mark.parametrize("kind", ["fp32", "heads-pruned", "ffn-global", "ffn-uniform", "torch-int8", "onnx", "onnx-int8", "openvino"])
@pytest.mark.parametrize("loader", [stock_transformers, stock_pipeline])
def test_stock_transformers_reproduces_or_refuses(kinds, kind, loader, tmp_path):
    tokenizer = make_tokenizer(tmp_path / "tok")
    path = kinds[kind]
    outcome = reproduces_or_raises(lambda: loader(path, tokenizer), ours(path, tokenizer))
    expected = {
        "fp32": "exact", "ffn-uniform": "exact", "ffn-global": "refused", "torch-int8": "refused",
        "onnx": "refused", "onnx-int8": "refused", "openvino": "refused",
        "heads-pruned": "exact" if STOCK_PRUNED_HEADS else "refused",
    }[kind]
    assert outcome == expected
    # The card says what the stock loader does.
    card = (path / "README.md").read_text()
    assert ("reproduces these outputs" in card) == (outcome == "exact")
    if outcome == "refused" and kind not in ("onnx", "onnx-int8", "openvino"):
        assert "compress export" in card or "compress quantize --backend" in card


@pytest.mark.parametrize("kind", ["onnx", "onnx-int8"])
def test_onnx_folders_run_exactly_in_a_bare_session(kinds, kind, tmp_path):
    tokenizer = make_tokenizer(tmp_path / "tok")
    assert reproduces_or_raises(lambda: onnx_session(kinds[kind], tokenizer), ours(kinds[kind], tokenizer)) == "exact"


def test_an_openvino_folder_runs_exactly_in_openvino(kinds, tmp_path):
    import openvino

    tokenizer = make_tokenizer(tmp_path / "tok")

    def run():
        compiled = openvino.Core().compile_model(str(kinds["openvino"] / "openvino_model.xml"), "CPU",
                                                 {"INFERENCE_PRECISION_HINT": "f32"})
        enc = tokenizer(TEXTS, padding=True, return_tensors="np")
        return compiled({p.get_any_name(): enc[p.get_any_name()].astype(np.int64) for p in compiled.inputs})[compiled.output("logits")]

    assert reproduces_or_raises(run, ours(kinds["openvino"], tokenizer)) == "exact"


@pytest.mark.skipif(not HAS_OPTIMUM_ONNX, reason="Optimum's ONNX Runtime integration exists for transformers < 4.58 only")
@pytest.mark.parametrize("kind", ["onnx", "onnx-int8"])
def test_onnx_folders_load_exactly_with_optimum(kinds, kind, tmp_path):
    from optimum.onnxruntime import ORTModelForSequenceClassification

    tokenizer = make_tokenizer(tmp_path / "tok")

    def run():
        model = ORTModelForSequenceClassification.from_pretrained(str(kinds[kind]))
        return model(**tokenizer(TEXTS, padding=True, return_tensors="pt")).logits.numpy()

    assert reproduces_or_raises(run, ours(kinds[kind], tokenizer)) == "exact"


def test_torch_int8_weights_are_int8_under_a_name_stock_loaders_do_not_read(kinds):
    from safetensors import safe_open

    path = kinds["torch-int8"]
    assert not (path / WEIGHTS_FILE).exists() and (path / INT8_WEIGHTS_FILE).is_file()
    with safe_open(str(path / INT8_WEIGHTS_FILE), "pt") as f:
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys() if k.endswith(".weight_int8")}
    assert dtypes == {"I8"}
    with pytest.raises(OSError):
        transformers.AutoModelForSequenceClassification.from_pretrained(str(path))


def test_a_saved_tokenizer_carries_no_truncation_or_padding_from_its_run(kinds, tmp_path):
    """A tokenizer used at max length 8 with padding, then saved: a stock load truncates nothing and pads nothing."""
    import json

    from compress.core.formats.artifacts import load_tokenizer, save_tokenizer

    tokenizer = load_tokenizer(kinds["fp32"])
    tokenizer(TEXTS, truncation=True, max_length=8, padding="max_length")  # leaves state in the backend
    save_tokenizer(tokenizer, tmp_path / "saved")
    data = json.loads((tmp_path / "saved" / "tokenizer.json").read_text())
    assert data["truncation"] is None and data["padding"] is None
    reloaded = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "saved"))
    long = " ".join(["film"] * 30)
    assert len(reloaded(long)["input_ids"]) == 32  # 30 words + [CLS] + [SEP], not cut at 8
    for kind in ("fp32", "torch-int8", "onnx", "onnx-int8"):
        data = json.loads((kinds[kind] / "tokenizer.json").read_text())
        assert data["truncation"] is None and data["padding"] is None, kind


def test_every_model_folder_has_a_card_that_follows_its_metrics(kinds, tmp_path):
    from compress.core.formats.records import append_metrics

    for kind, path in kinds.items():
        card = (path / "README.md").read_text()
        record = read_compression(path)
        assert record["stage"] in card and "## Loading" in card and "## Structure" in card, kind
    path = kinds["fp32"]
    append_metrics(path, {"kind": "eval", "task": "sst2", "split": "dev", "n": 872, "metrics": {"accuracy": 0.9123}})
    assert "accuracy 0.9123" in (path / "README.md").read_text()


def test_a_readme_the_toolkit_did_not_write_is_kept(tmp_path):
    from compress.core.formats.records import append_metrics

    tokenizer = make_tokenizer(tmp_path / "tok")
    path = save_tiny(make_tiny_model(), tokenizer, tmp_path / "m")
    (path / "README.md").write_text("my own card\n")
    append_metrics(path, {"kind": "eval", "task": "sst2", "metrics": {"accuracy": 0.5}})
    assert (path / "README.md").read_text() == "my own card\n"
