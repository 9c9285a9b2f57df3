"""bf16 OpenVINO folders: `compress export --precision bf16` records the precision, every loader runs it where the
CPU has bf16 kernels (f32 elsewhere), latency names it, and `compress auto` considers it only on such a CPU."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from compress.auto import variants as auto_variants
from compress.auto.finalists import variant_accuracy
from compress.auto.targets import TaskTarget
from compress.cli import main
from compress.core.formats import openvino_runtime
from compress.core.model import structure as st
from compress.core.formats.records import read_compression
from compress.core.data.sources import TaskData
from compress.core.formats.openvino_runtime import openvino_bf16
from compress.core.formats.runtime import load_model
from compress.core.data.synthetic import write_sst2_layout
from compress.core.data.tasks import get_task
from compress.eval.evaluate import EvalConfig, evaluate
from compress.eval.latency.backends import openvino_session
from compress.export import BF16_TOLERANCE, ExportConfig, export
from tests.conftest import make_tiny_model, make_tokenizer, save_tiny

TEXTS = ["a gripping , funny film .", "the plot made no sense at all and the actors looked bored", "no"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bf16")
    tokenizer = make_tokenizer(tmp / "tok")
    fp32 = save_tiny(make_tiny_model(seed=3), tokenizer, tmp / "fp32")
    return {"tokenizer": tokenizer, "fp32": fp32,
            "bf16": export(fp32, tmp / "bf16", ExportConfig(format="openvino", precision="bf16")),
            "ov": export(fp32, tmp / "ov", ExportConfig(format="openvino"))}


def logits(path, tokenizer):
    model = load_model(path)
    with torch.no_grad():
        return model(**st.model_inputs(model, tokenizer(TEXTS, padding=True, return_tensors="pt"))).logits.float().numpy()


@pytest.mark.e2e
def test_a_bf16_export_records_its_precision_and_its_check_tolerance(folders):
    record = read_compression(folders["bf16"])
    assert record["inference_precision_hint"] == "bf16" and record["check"]["tolerance"] == BF16_TOLERANCE
    assert record["check"]["max_abs_diff"] <= BF16_TOLERANCE
    assert record["inference_precision"] == ("bf16" if openvino_bf16() else "f32")
    assert "inference_precision_hint" not in read_compression(folders["ov"])  # an fp32 export asks nothing


def test_a_bf16_folder_runs_in_bf16_where_the_cpu_can_and_its_outputs_stay_close(folders):
    model = load_model(folders["bf16"])
    assert model.precision == ("bf16" if openvino_bf16() else "f32")
    assert load_model(folders["ov"]).precision == "f32"
    got, want = logits(folders["bf16"], folders["tokenizer"]), logits(folders["fp32"], folders["tokenizer"])
    assert np.abs(got - want).max() <= BF16_TOLERANCE and (got.argmax(-1) == want.argmax(-1)).all()


def test_a_bf16_folder_runs_as_fp32_on_a_cpu_without_bf16_kernels(folders, monkeypatch):
    monkeypatch.setattr(openvino_runtime, "openvino_bf16", lambda: False)
    model = load_model(folders["bf16"])
    assert model.precision == "f32"
    np.testing.assert_allclose(logits(folders["bf16"], folders["tokenizer"]), logits(folders["fp32"], folders["tokenizer"]),
                               atol=1e-4)


def test_latency_names_the_precision_the_folder_ran_in(folders):
    options = SimpleNamespace(threads=1, openvino_shapes="dynamic", lengths=None, lengths_multiple=8)
    bf16, fp32 = openvino_session(folders["bf16"], options), openvino_session(folders["ov"], options)
    assert bf16.backend == ("openvino-bf16" if openvino_bf16() else "openvino") and fp32.backend == "openvino"
    asked = "bf16" if openvino_bf16() else "f32"  # what the folder asks, where this CPU can run it
    assert f"(asked: {asked}, as the folder records)" in bf16.note and "(asked: f32, as the folder records)" in fp32.note


@pytest.mark.parametrize("fmt", ["onnx"])
def test_bf16_outside_openvino_is_refused_in_one_line(folders, fmt, tmp_path, capsys):
    code = main(["export", "--model", str(folders["fp32"]), "--format", fmt, "--precision", "bf16",
                 "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and "use it with --format openvino" in err[0] and not (tmp_path / "out").exists()


def test_a_copied_openvino_folder_gains_the_bf16_hint(folders, tmp_path):
    out = export(folders["ov"], tmp_path / "copy", ExportConfig(format="openvino", precision="bf16"))
    assert read_compression(out)["inference_precision_hint"] == "bf16"
    assert load_model(out).precision == ("bf16" if openvino_bf16() else "f32")


@pytest.mark.parametrize("bf16", [True, False])
def test_auto_considers_the_bf16_variant_only_on_a_cpu_with_bf16_kernels(monkeypatch, bf16):
    monkeypatch.setattr(auto_variants, "openvino_bf16", lambda: bf16)
    task, embedding = auto_variants.TASK_VARIANTS, auto_variants.EMBEDDING_VARIANTS
    names = [name for name, _ in auto_variants.usable(task, ("torch", "openvino"))]
    assert names == ["torch-fp32", "torch-int8", "openvino-fp32"] + (["openvino-bf16"] if bf16 else []) + ["openvino-int8"]
    assert ("openvino-bf16" in [name for name, _ in auto_variants.usable(embedding, ("openvino",))]) == bf16
    assert [n for n, _ in auto_variants.usable(task, ("torch",))] == ["torch-fp32", "torch-int8"]


def test_a_bf16_variant_is_scored_on_its_own_and_fp32_exports_take_their_candidates_score(monkeypatch, tmp_path):
    monkeypatch.setattr(TaskTarget, "dev_score", lambda self, path: 12.5)
    target = TaskTarget(get_task("sst2"), SimpleNamespace())
    assert variant_accuracy(tmp_path, ("export", "openvino", "bf16"), target, 80.0) == 12.5
    assert variant_accuracy(tmp_path, ("export", "openvino", None), target, 80.0) == 80.0
    assert variant_accuracy(tmp_path, None, target, 80.0) == 80.0


def test_the_dev_score_of_a_variant_is_what_compress_eval_reports(folders, tmp_path):
    write_sst2_layout(tmp_path / "glue", n_train=20, n_dev=40, n_test=5)
    target = TaskTarget(get_task("sst2"), SimpleNamespace(data=TaskData(data_dir=str(tmp_path / "glue"))))
    for kind in ("fp32", "bf16"):
        (record,) = evaluate(folders[kind], EvalConfig(task="sst2", data_dir=str(tmp_path / "glue"), record=False))
        assert target.dev_score(folders[kind]) == pytest.approx(record["metrics"]["accuracy"])
