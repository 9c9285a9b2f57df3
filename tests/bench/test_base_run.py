"""bench.base: the goals read from finished rows, the precision chosen from the CPU, and refusals in one line."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench.base import report, run
from compress.core import hardware


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
