"""bench.base.precision: the rate, score and comparison read from two runs' training records, by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.base.precision import compare, finetune_command, render, run_row


def write_run(folder: Path, rates: list[float], seconds: float, accuracy: float, f1: float) -> Path:
    folder.mkdir(parents=True)
    history = [{"step": 20 * (i + 1), "examples_per_second": r} for i, r in enumerate(rates)] + [{"step": 99, "eval": 1}]
    records = [{"kind": "training", "status": "done", "n_train": 1000, "seconds": seconds, "history": history},
               {"kind": "eval", "split": "dev", "n": 408, "metrics": {"accuracy": accuracy, "f1": f1}}]
    (folder / "metrics.json").write_text(json.dumps({"results": records}))
    return folder


def test_a_run_is_its_median_window_rate_and_the_tasks_official_score(tmp_path):
    row = run_row(write_run(tmp_path / "fp32", [4.0, 6.0, 5.0, 5.5], 240.0, 70.0, 80.0), "mrpc", "fp32", 251.3)
    assert row["examples_per_s"] == 5.25  # the median of 4.0, 5.0, 5.5, 6.0; the eval entry has no rate
    assert row["windows"] == 4 and row["train_seconds"] == 240.0 and row["wall_seconds"] == 251.3
    assert row["score"] == 80.0  # MRPC's official metric is F1


def test_the_comparison_is_bf16_over_fp32_and_bf16_minus_fp32(tmp_path):
    fp32 = run_row(write_run(tmp_path / "a", [5.0], 200.0, 70.0, 80.0), "mrpc", "fp32", 210.0)
    bf16 = run_row(write_run(tmp_path / "b", [9.0], 110.0, 69.0, 79.25), "mrpc", "bf16", 120.0)
    result = compare({"fp32": fp32, "bf16": bf16})
    assert result["speedup"] == pytest.approx(1.8) and result["score_difference"] == pytest.approx(-0.75)
    state = {"rows": {"fp32": fp32, "bf16": bf16}, "comparison": result, "date": "d", "cpu": "c", "bf16": True,
             "task": "mrpc", "max_train_examples": 1000, "epochs": 1, "seed": 42, "command": "python -m ..."}
    text = render(state)
    assert "| fp32 | 5.0 | 200 | 80.00 |" in text and "| bf16 | 9.0 | 110 | 79.25 |" in text
    assert "bf16 trains 1.80x as fast as fp32; its dev score differs by -0.75 points" in text


def test_both_runs_share_the_recipe_and_differ_only_in_precision(tmp_path):
    a = finetune_command(tmp_path / "t", tmp_path / "o", "mrpc", tmp_path, precision="fp32", epochs=1,
                         max_train_examples=1000, seed=42)
    b = finetune_command(tmp_path / "t", tmp_path / "o", "mrpc", tmp_path, precision="bf16", epochs=1,
                         max_train_examples=1000, seed=42)
    assert [x for x, y in zip(a, b) if x != y] == ["fp32"] and b[b.index("--precision") + 1] == "bf16"
    assert a[a.index("--max-length") + 1] == "128" and a[a.index("--lr") + 1] == "2e-05"


def test_a_run_at_chance_is_marked_and_its_score_difference_disowned(tmp_path):
    fp32 = run_row(write_run(tmp_path / "a", [5.0], 200.0, 68.38, 81.22), "mrpc", "fp32", 210.0)
    bf16 = run_row(write_run(tmp_path / "b", [10.0], 100.0, 68.38, 81.22), "mrpc", "bf16", 110.0)
    # MRPC dev: 279 of 408 pairs are paraphrases; answering "paraphrase" everywhere scores accuracy 68.38
    chance = {"at_chance": True, "rule": "accuracy <= 68.4 (the majority class of 408 dev examples) + 4.6"}
    rows = {"fp32": {**fp32, "chance": chance}, "bf16": {**bf16, "chance": chance}}
    state = {"rows": rows, "comparison": compare(rows), "date": "d", "cpu": "c", "bf16": True, "task": "mrpc",
             "max_train_examples": 1000, "epochs": 1, "seed": 42, "command": "python -m ..."}
    text = render(state)
    assert "| fp32 | 5.0 | 200 | 81.22 | at chance (accuracy <= 68.4 (the majority class of 408 dev examples) + 4.6) |" in text
    assert "the score difference says nothing about bf16's accuracy" in text
