"""`compress demo` end to end (slow: the whole recipe on the generated task, a few minutes on 2 cores)."""

from __future__ import annotations

import json

import pytest

from compress.cli import main

pytestmark = pytest.mark.slow


def test_demo_runs_every_stage_and_prints_the_table(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["demo", "--out", str(tmp_path / "demo")]) == 0
    run = tmp_path / "demo"
    manifest = json.loads((run / "manifest.json").read_text())["stages"]
    stages = ["pretrained", "teacher", "student", "pruned", "student-int8", "teacher-int8", "latency"]
    assert [s for s in stages if manifest[s]["status"] == "done"] == stages
    report = (run / "report.md").read_text()
    rows = [line for line in report.splitlines() if line.startswith("| ")]
    for name in ("teacher", "student", "pruned", "student-int8", "teacher-int8"):
        assert any(r.startswith(f"| {name} |") for r in rows), name
    # the demo's task follows a learnable rule: the teacher beats a coin flip clearly
    teacher = next(r for r in rows if r.startswith("| teacher |")).split("|")
    assert float(teacher[5]) > 75
    out = capsys.readouterr().out
    assert "| teacher |" in out  # the headline table is printed at the end
    # a second run refuses to overwrite, in one line
    assert main(["demo", "--out", str(run)]) == 2
    assert "--overwrite" in capsys.readouterr().err
