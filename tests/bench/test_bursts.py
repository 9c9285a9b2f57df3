"""bench.bursts: the modes alternated in order, each measurement summarised and written as it comes (timing faked)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import bench.bursts as bursts
from compress.eval.latency.row import Row


def fake_rows(n: int) -> list[Row]:
    return [Row(name="teacher", batch=1, seq=128, runs_p50_ms=(20.00049, 22.0), p50_ms=21.0004, spread_pct=9.5238,
                speedup=1.0, speedup_min=1.0),
            Row(name=f"student-b{n}", batch=1, seq=128, runs_p50_ms=(2.0, 2.2), p50_ms=2.1, spread_pct=9.5238,
                speedup=10.0049, speedup_min=9.0909)]


def test_each_mode_is_timed_in_turn_and_written_after_each(tmp_path, monkeypatch, capsys):
    seen, out = [], tmp_path / "bursts.json"

    def fake_latency(models, cfg):
        # what was written so far: every earlier measurement
        seen.append((cfg.bursts, cfg.repeat_runs, cfg.repeats, cfg.warmup, cfg.peak, cfg.record, cfg.batch, cfg.seq,
                     [str(m) for m in models], len(json.loads(out.read_text())) if out.is_file() else 0))
        return {"rows": fake_rows(cfg.bursts)}

    monkeypatch.setattr(bursts, "measure_latency", fake_latency)
    ticks = iter(range(0, 100, 5))
    records = bursts.alternate([Path("t"), Path("s")], (1, 6), 2, out, runs=3, repeats=10, warmup=2,
                               clock=lambda: next(ticks) * 1.01)
    assert [s[0] for s in seen] == [1, 6, 1, 6] and [s[-1] for s in seen] == [0, 1, 2, 3]
    assert seen[0][1:-1] == (3, 10, 2, False, False, (1,), (128,), ["t", "s"])
    assert [(r["bursts"], r["rep"]) for r in records] == [(1, 0), (6, 0), (1, 1), (6, 1)]
    assert records[0]["seconds"] == 5.0  # 5.05 s, rounded to a tenth
    assert records[1]["rows"][0] == {"model": "teacher", "runs_p50_ms": [20.0, 22.0], "p50_ms": 21.0, "spread_pct": 9.5,
                                     "speedup": 1.0, "speedup_min": 1.0}
    assert records[1]["rows"][1]["model"] == "student-b6" and records[1]["rows"][1]["speedup"] == 10.0
    assert json.loads(out.read_text()) == records
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line) for line in lines] == records


def test_the_command_takes_the_models_and_refuses_a_folder_that_is_not_one(tmp_path, monkeypatch):
    models = []
    for name in ("teacher", "student"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
        models.append(str(tmp_path / name))
    calls = []
    monkeypatch.setattr(bursts, "measure_latency", lambda ms, cfg: calls.append(cfg.bursts) or {"rows": fake_rows(cfg.bursts)})
    out = tmp_path / "results" / "bursts.json"
    assert bursts.main([*models, "--out", str(out), "--bursts", "1,2,4", "--reps", "1"]) == 0
    assert calls == [1, 2, 4] and len(json.loads(out.read_text())) == 3
    with pytest.raises(SystemExit):
        bursts.main([*models, str(tmp_path / "nothing"), "--out", str(out)])
    assert calls == [1, 2, 4]
