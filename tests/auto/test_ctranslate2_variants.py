"""compress auto's CTranslate2 variants: float32 and int8 folders of a BERT candidate scored as compress eval scores
them, none of a family CTranslate2 does not convert (the export's reason logged and reported), and the int8 one
refused beyond --max-drop."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import transformers

from compress.auto import variants as auto_variants
from compress.auto.config import AutoConfig, TASK_VARIANTS
from compress.auto.finalists import make_finalists
from compress.auto.probe import variants
from compress.auto.report import write_report
from compress.auto.state import SearchRun, SearchState
from compress.auto.targets import TaskTarget
from compress.core.config import from_dict
from compress.core.data import synthetic
from compress.core.data.tasks import get_task
from compress.core.formats import ctranslate2 as ct2_format
from compress.core.formats.records import read_compression
from compress.core.model.shapes import Shape
from compress.eval.evaluate import EvalConfig, evaluate
from tests.conftest import save_tiny
from tests.core.test_families import family_config, make_tokenizer

LABEL = "2L-32"
CT2 = ["ctranslate2-fp32", "ctranslate2-int8"]


def dev_accuracy(folder: Path, glue: Path) -> float:
    """``compress eval``'s SST-2 dev accuracy of ``folder``."""
    (record,) = evaluate(folder, EvalConfig(task="sst2", data_dir=str(glue), max_length=32, record=False))
    return float(record["metrics"]["accuracy"])


def search_run(teacher: Path, candidate: Path, score: float, glue: Path, work: Path, **options) -> SearchRun:
    """A search whose one trained candidate is ``candidate`` (scored ``score``), its teacher ``teacher``."""
    cfg = from_dict(AutoConfig, {"task": "sst2", "budget": "p50<=5ms@b1,s32", "data_dir": str(glue), "max_length": 32,
                                 **options})
    work.mkdir(parents=True, exist_ok=True)
    trained = {f"{LABEL}/0": {"label": LABEL, "round": 0, "epochs": 1, "score": score, "dir": str(candidate),
                              "teacher": score, "seconds": 1.0}}
    return SearchRun(teacher_dir=teacher, target=TaskTarget(get_task("sst2"), cfg),
                     search=SearchState(work, {"trained": trained, "finalists": None}), budgets=(), at=[(1, 32)],
                     timer=None)


def predicted_as(names: list[str]) -> dict:
    """Every one of ``names`` predicted to fit the candidate."""
    return {LABEL: {"variants": names, "measurements": {name: {} for name in names}}}


@pytest.fixture(scope="module")
def glue(tmp_path_factory):
    return synthetic.write_sst2_layout(tmp_path_factory.mktemp("ct2-glue"), n_train=8, n_dev=32, n_test=4)


@pytest.fixture(scope="module")
def bert(tmp_path_factory, glue):
    """A BERT SST-2 candidate (random weights) and its compress eval dev accuracy; the work folder its variants share."""
    pytest.importorskip("ctranslate2")
    from compress.teacher.create import create_model

    root = tmp_path_factory.mktemp("ct2-bert")
    candidate = create_model(Shape(2, 32, 4, 37), root / "candidate", tokenizer=synthetic.write_vocab(root / "vocab.txt"),
                             task="sst2", max_positions=64)
    return candidate, dev_accuracy(candidate, glue), root / "work"


@pytest.fixture(scope="module")
def mpnet(tmp_path_factory):
    """A tiny MPNet classifier: a family CTranslate2 has no converter for."""
    root = tmp_path_factory.mktemp("ct2-mpnet")
    model = transformers.MPNetForSequenceClassification(family_config("mpnet")).eval()
    return save_tiny(model, make_tokenizer("mpnet", root / "tok"), root / "mpnet")


def test_the_ctranslate2_variants_are_float32_and_its_own_int8():
    assert TASK_VARIANTS["ctranslate2"] == (("ctranslate2-fp32", ("export", "ctranslate2", None)),
                                            ("ctranslate2-int8", ("export", "ctranslate2", "int8")))
    assert "ctranslate2" in AutoConfig().backends
    fp32, int8 = (auto_variants.export_config("ctranslate2", scheme) for _, (_, _, scheme) in TASK_VARIANTS["ctranslate2"])
    assert (fp32.format, fp32.quantization, int8.quantization, int8.precision) == ("ctranslate2", "float32", "int8", "fp32")
    bf16 = auto_variants.export_config("openvino", "bf16")
    assert (bf16.format, bf16.precision, bf16.quantization) == ("openvino", "bf16", "float32")


@pytest.mark.e2e
def test_a_bert_candidate_gets_float32_and_int8_folders_scored_as_compress_eval_scores_them(bert, glue):
    import ctranslate2

    candidate, fp32, work = bert
    run = search_run(candidate, candidate, fp32, glue, work, backends=["torch", "ctranslate2"], max_drop=None)
    assert [name for name, _ in variants(run)] == ["torch-fp32", "torch-int8", *CT2]
    artifacts = make_finalists(run, [LABEL], predicted_as(CT2))
    assert [a["variant"] for a in artifacts] == CT2
    for a, quantization in zip(artifacts, ("float32", "int8")):
        folder = Path(a["dir"])
        assert folder.name == f"{LABEL}-r0-{a['variant']}"
        assert read_compression(folder)["ctranslate2"]["quantization"] == quantization
        ctranslate2.Encoder(str(folder), device="cpu")  # CTranslate2 itself loads the folder
        assert a["accuracy"] == pytest.approx(dev_accuracy(folder, glue))
    assert artifacts[0]["accuracy"] == fp32  # float32 keeps its candidate's score, which it scores itself too
    assert [f["variant"] for f in run.search.state["finalists"]] == CT2


@pytest.mark.e2e
def test_the_guard_refuses_a_ctranslate2_int8_variant_that_drops_more_than_max_drop(bert, glue, monkeypatch, caplog):
    candidate, _, work = bert
    run = search_run(candidate, candidate, 50.0, glue, work, backends=["ctranslate2"], max_drop=1.0)
    monkeypatch.setattr(TaskTarget, "dev_score", lambda self, path: 48.75)
    with caplog.at_level(logging.WARNING, logger="compress.auto.finalists"):
        artifacts = make_finalists(run, [LABEL], predicted_as(CT2))
    assert [a["variant"] for a in artifacts] == ["ctranslate2-fp32"]
    assert f"{LABEL} as ctranslate2-int8: {LABEL}-r0-ctranslate2-int8 scores 48.75 (SST-2 dev accuracy), 1.25 points " \
           "below its fp32 model's 50.00: more than --max-drop 1" in caplog.messages
    monkeypatch.setattr(TaskTarget, "dev_score", lambda self, path: 49.0)  # exactly --max-drop below: kept
    assert [(a["variant"], a["accuracy"]) for a in make_finalists(run, [LABEL], predicted_as(CT2))] == [
        ("ctranslate2-fp32", 50.0), ("ctranslate2-int8", 49.0)]


def test_an_mpnet_candidate_gets_no_ctranslate2_variant_and_the_reason_is_logged_and_reported(mpnet, glue, tmp_path,
                                                                                           caplog):
    run = search_run(mpnet, mpnet, 50.0, glue, tmp_path / "work", backends=["torch", "ctranslate2"])
    why = (f"CTranslate2 has no converter for mpnet models ({mpnet.resolve()}); it converts bert, distilbert, roberta, "
           "xlm-roberta: export this one with --format onnx or --format openvino")
    assert [name for name, _ in variants(run)] == ["torch-fp32", "torch-int8"]  # neither probed nor made
    with caplog.at_level(logging.WARNING, logger="compress.auto.finalists"):
        artifacts = make_finalists(run, [LABEL], predicted_as(["torch-fp32", *CT2]))
    assert [a["variant"] for a in artifacts] == ["torch-fp32"]
    assert [m for m in caplog.messages if "ctranslate2" in m] == [f"{LABEL} as {name}: {why}" for name in CT2]
    skipped = auto_variants.skipped(run.cfg.variant_table, run.cfg.backends, mpnet)
    assert skipped == dict.fromkeys(CT2, why)
    report = {"task": "sst2", "budgets": ["p50<=5ms@b1,s32"], "teacher": str(mpnet), "point": [1, 32],
              "teacher_ms": {"1,32": 2.0}, "seconds": 60.0, "halving_stopped": False, "latency_model_error": None,
              "chosen": None, "trained": [], "results": [], "skipped_variants": skipped}
    write_report(tmp_path / "search", report)
    assert f"- not made: ctranslate2-fp32, ctranslate2-int8 ({why})" in (tmp_path / "search" / "report.md").read_text().splitlines()


def test_ctranslate2_not_installed_skips_its_variants_saying_how_to_install_it(mpnet, monkeypatch, tmp_path):
    from compress.teacher.create import create_model

    teacher = create_model(Shape(1, 32, 4, 37), tmp_path / "bert", tokenizer=synthetic.write_vocab(tmp_path / "vocab.txt"),
                           task="sst2", max_positions=64)
    assert auto_variants.skipped(TASK_VARIANTS, ("torch", "ctranslate2"), teacher) == {}
    assert auto_variants.skipped(TASK_VARIANTS, ("torch",), mpnet) == {}  # not asked for: nothing to say
    monkeypatch.setattr(ct2_format, "find_spec", lambda name: None)
    why = f"CTranslate2 is not installed, so {teacher.resolve()} cannot be converted: pip install 'compress[ctranslate2]'"
    assert auto_variants.skipped(TASK_VARIANTS, ("torch", "ctranslate2"), teacher) == dict.fromkeys(CT2, why)
    assert [n for n, _ in auto_variants.usable(TASK_VARIANTS, ("torch", "ctranslate2"), teacher)] == ["torch-fp32", "torch-int8"]
