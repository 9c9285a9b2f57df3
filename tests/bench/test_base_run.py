"""bench.base: the goals read from finished rows, the precision chosen from the CPU, and refusals in one line."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from bench.base import report, run
from compress.core import hardware
from compress.core.errors import CompressError


def _state(rows: dict[str, dict[str, float]]) -> dict:
    """base.json's state with one row per (role, task) and its dev score as the task's primary metric."""
    names = {"sst2": "accuracy", "mrpc": "accuracy", "stsb": "spearmanr", "cola": "matthews_correlation",
             "rte": "accuracy", "wnli": "accuracy"}
    out = {}
    for role, per_task in rows.items():
        for task, value in per_task.items():
            out[f"{task}/{role}"] = {"task": task, "role": role, "metrics": {names[task]: value}}
    return {"rows": out}


def test_goals_compare_six_task_averages_by_hand():
    teacher = {"sst2": 92.0, "mrpc": 86.0, "stsb": 88.0, "cola": 55.0, "rte": 66.0, "wnli": 56.0}  # average 73.8333
    student = {t: v - 2.0 for t, v in teacher.items()}  # 71.8333 = 97.29% of the teacher's
    lines = report.goal_lines(_state({"teacher": teacher, "6L-384": student}))
    assert lines[0] == "- teacher six-task average >= BERT-base's 74.9: accuracy not met: 73.83 against 74.90"
    assert "6L-768" in lines[1] and "not measured yet (no 6L-768 or teacher score on sst2, mrpc" in lines[1]
    # 0.97 x 73.8333 = 71.6183 <= 71.8333
    assert lines[2] == ("- 6L-384 >= 97% of the teacher at >= 5x: accuracy met: 71.83 against 71.62; "
                        "speed-up not measured yet (>= 5.0x wanted)")


def test_a_missing_task_leaves_a_goal_unmeasured_and_names_it():
    teacher = {"sst2": 92.0, "mrpc": 86.0}
    assert report.goal_lines(_state({"teacher": teacher}))[0].endswith("on stsb, cola, rte, wnli)")


@pytest.mark.parametrize("bf16", [True, False])
def test_training_precision_follows_the_cpu(monkeypatch, bf16):
    native = replace(hardware.precisions(), bf16=bf16)
    monkeypatch.setattr(run, "precisions", lambda: native)
    precision, why = run.choose_precision()
    assert precision == ("bf16" if bf16 else "fp32")
    assert why.startswith("native bf16") is bf16


def test_unknown_tasks_and_roles_are_refused_in_one_line(tmp_path, capsys):
    assert run.main(["--out", str(tmp_path / "out"), "--tasks", "sst2,mnli", "--roles", "teacher,7L-999"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bench.base: unknown task or role mnli, 7L-999;") and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_a_teacher_learning_rate_replaces_each_tasks_and_is_stated_with_its_run(tmp_path, monkeypatch, capsys):
    seen = {}
    import compress.teacher.finetune as finetune_module

    monkeypatch.setattr(finetune_module, "finetune", lambda model, out, cfg: seen.setdefault("lr", cfg.train.lr))
    settings = run.BaseSettings(tasks=("stsb",), teacher_lr=5e-5)
    run.teacher_stage(run.TASKS["stsb"], {"task": "stsb", "data_dir": str(tmp_path)}, tmp_path / "t", tmp_path, settings)
    assert seen["lr"] == 5e-5 and run.BaseSettings(tasks=("stsb",)).lr(run.TASKS["stsb"]) == 2e-5
    summary = run.run_summary({"date": "D", "cpu": "C", "command": "c", "settings": vars(settings)})
    line = report.run_line(1, {**summary, "precision_why": "w"})
    assert "epochs x 1.0; teachers at lr 5e-05; students without augmentation" in line
    assert "teachers at lr" not in report.run_line(1, {**summary, "teacher_lr": None})
    assert run.main(["--out", str(tmp_path / "out"), "--tasks", "stsb", "--teacher-lr", "2"]) == 2
    assert capsys.readouterr().err.strip() == "bench.base: --teacher-lr must be between 0 and 1, got 2; the BERT grid is 2e-5 to 5e-5"


def test_committed_rows_are_not_trained_again_unless_a_later_stage_needs_their_model():
    roles = list(run.ROLES)
    assert run.to_run(roles, set(roles), set()) == []
    # The 6L-384 row is missing: its teacher must be trained again on this machine, the rest stays committed.
    committed = set(roles) - {"6L-384"}
    assert run.to_run(roles, committed, set()) == ["teacher", "6L-384"]
    # Its int8 too: the chain reaches back to the teacher; a teacher finished here is not trained twice.
    assert run.to_run(roles, committed - {"6L-384 int8"}, {"teacher"}) == ["6L-384", "6L-384 int8"]
    assert run.to_run(roles, {"teacher"}, set()) == roles  # every student needs the teacher
    assert run.to_run(roles, set(roles) - {run.ALONE}, set()) == [run.ALONE]  # the control needs nothing


def test_a_rerun_on_a_new_machine_keeps_committed_rows_and_trains_only_the_missing(tmp_path, monkeypatch):
    out, work, ran = tmp_path / "results", tmp_path / "work", []
    monkeypatch.setattr(run, "install", lambda release: tmp_path / "teacher")
    monkeypatch.setattr(run, "header", lambda command: {"date": "D2", "cpu": "CPU2", "command": command})
    monkeypatch.setattr(run, "model_row", lambda folder, task, role: {"task": task.name, "role": role,
                                                                         "metrics": {"accuracy": 50.0}})

    def stages(task, options, work_, teacher, settings):
        def make(role, folder):
            def stage():
                ran.append(f"{task.name}/{role}")
                folder.mkdir(parents=True)
                (folder / "compression.json").write_text("{}")
            return stage
        return [(r, work_ / task.name / r, make(r, work_ / task.name / r)) for r in settings.roles]

    monkeypatch.setattr(run, "stages", stages)
    asked = []

    def chance(task, metrics, glue):  # WNLI dev: 40 of 71 pairs are "not entailment" (56.34)
        asked.append((task, glue))
        return {"at_chance": metrics["accuracy"] <= 56.34 + 11.8, "rule": "accuracy <= 56.3 (majority) + 11.8"}

    monkeypatch.setattr(report, "dev_chance", chance)
    settings = run.BaseSettings(tasks=("wnli",), roles=("teacher", "6L-384", run.ALONE), max_train_examples=500)
    earlier = {"header": {"date": "D1", "cpu": "CPU1", "command": "first"},
               "settings": {**vars(settings), "max_train_examples": 2000},
               "rows": {"wnli/teacher": {"task": "wnli", "role": "teacher", "metrics": {"accuracy": 56.34}},
                        "wnli/6L-384": {"task": "wnli", "role": "6L-384", "metrics": {"accuracy": 54.93}}}}
    out.mkdir()
    (out / "base.json").write_text(json.dumps(earlier))
    run.run_base(tmp_path, work, out, settings, command="second", commit_results=False)
    assert ran == ["wnli/" + run.ALONE]  # the committed teacher and student are not trained again
    state = json.loads((out / "base.json").read_text())
    assert state["rows"]["wnli/teacher"]["metrics"] == {"accuracy": 56.34}
    assert state["rows"]["wnli/teacher"]["run"]["max_train_examples"] == 2000
    assert state["rows"][f"wnli/{run.ALONE}"]["run"]["max_train_examples"] == 500
    page = (out / "base.md").read_text()
    assert "1. D1 · CPU1" in page and "at most 2000 training" in page and "2. D2 · CPU2" in page
    assert "| wnli | teacher | 56.34 |" in page and page.count("| 2 | at chance") == 1
    # every row is checked once, the committed ones included, on the dev labels under the data folder's glue/
    assert sorted(asked) == [("wnli", tmp_path / "glue")] * 3
    assert page.count("at chance (accuracy <= 56.3 (majority) + 11.8)") == 3


def test_dev_chance_reads_the_dev_labels_and_leaves_own_data_tasks_alone(tmp_path):
    glue = tmp_path / "glue" / "RTE"
    glue.mkdir(parents=True)
    rows = ["index\tsentence1\tsentence2\tlabel"] + [f"{i}\ta\tb\t{'entailment' if i < 7 else 'not_entailment'}"
                                                       for i in range(10)]
    (glue / "dev.tsv").write_text("\n".join(rows) + "\n")
    at = report.dev_chance("rte", {"accuracy": 70.0}, tmp_path / "glue")
    # majority 7/10; two standard errors of a classifier at 0.7 over 10 examples: 200 * sqrt(0.21 / 10) = 28.98 points
    assert at["at_chance"] and at["chance"] == pytest.approx(70.0) and at["threshold"] == pytest.approx(98.98, abs=0.01)
    assert report.dev_chance("banking77", {"accuracy": 1.0}, tmp_path / "glue") is None
    assert report.chance_mark(None) == "" and report.chance_mark({"at_chance": False, "rule": "r"}) == ""
    # a rule with bars stays inside its markdown cell
    assert report.chance_mark({"at_chance": True, "rule": "|spearmanr| < 10"}) == "at chance (\\|spearmanr\\| < 10)"


def test_an_unreadable_results_file_is_refused_in_one_line(tmp_path):
    (tmp_path / "base.json").write_text("{not json")
    with pytest.raises(CompressError, match=r"base.json is not valid JSON .*move it aside"):
        run.previous_state(tmp_path / "base.json")
