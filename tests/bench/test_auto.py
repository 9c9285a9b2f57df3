"""bench.auto's fresh check: a budget as a fixed p50 (slowest run) or as 1/N of the teacher in the same run (every run)."""

from __future__ import annotations

from pathlib import Path

import bench.auto as bench_auto

TEACHER, CHOSEN, HAND = Path("t"), Path("c"), Path("h")
# p50 ms per run: the teacher slows down in run 2, and the models with it
RUNS = {"t": [20.0, 30.0, 20.0], "c": [2.4, 3.6, 2.4], "h": [2.6, 2.9, 2.4]}


def check(monkeypatch, relative: bool, runs: dict = RUNS) -> dict:
    monkeypatch.setattr(bench_auto, "p50", lambda dirs, **_: {str(d): runs[str(d)] for d in dirs})
    monkeypatch.setattr(bench_auto, "dev_score", lambda model, task: {"h": 84.4}[str(model)])
    return bench_auto.fresh_check(TEACHER, CHOSEN, [HAND], teacher_ms=20.0, fraction=8, task="mrpc", relative=relative)


def test_a_fixed_budget_is_judged_on_the_slowest_run(monkeypatch):
    row = check(monkeypatch, relative=False)
    # limit 20 / 8 = 2.5 ms: the chosen model's slowest run is 3.6 ms, the hand-made one's 2.9 ms: neither fits
    assert row["chosen_fresh"]["meets"] is False and row["hand_made_best"] is None
    # same-run ratios 20/2.4, 30/3.6, 20/2.4 = 8.33x each: 1/8 of the teacher in every run
    assert row["chosen_fresh"]["meets_same_run"] is True


def test_a_relative_budget_is_judged_against_the_teacher_of_each_run(monkeypatch):
    row = check(monkeypatch, relative=True)
    assert row["chosen_fresh"]["meets"] is True
    assert [round(x, 2) for x in row["chosen_fresh"]["fresh_speedups"]] == [8.33, 8.33, 8.33]
    # the hand-made model: 20/2.6 = 7.7x in run 1 misses, though 30/2.9 and 20/2.4 fit
    assert row["hand_made_best"] is None
    faster = {**RUNS, "h": [2.5, 3.7, 2.4]}  # 8.0x, 8.1x, 8.3x: fits in every run
    assert check(monkeypatch, relative=True, runs=faster)["hand_made_best"] == (84.4, "h", 3.7)
