"""The latency probe as a record: ``Probe.to_dict()`` is exactly what state.json holds (and search.json's probe
fields come from), and ``from_dict()`` reads this version's and an earlier version's probe back."""

from __future__ import annotations

import dataclasses
import json

from compress.auto.state import Earlier, Probe, ProbeSample, SearchState
from compress.core.checkpoints import work_dir_for
from compress.core.model.shapes import Shape
from compress.eval.latency.row import Row

ROW = {"model": "/w/probe/2L-64/torch-fp32", "name": "torch-fp32", "backend": "torch", "precision": "fp32", "batch": 1,
       "seq": 32, "p50_ms": 1.2, "p90_ms": 1.3, "p99_ms": 1.4, "mean_ms": 1.25, "runs_p50_ms": [1.2, 1.3],
       "slowest_run": {"p50_ms": 1.3, "p90_ms": 1.4, "p99_ms": 1.5, "mean_ms": 1.3}, "spread_pct": 8.3,
       "throughput": 833.3, "params": 50000, "size_mb": 0.2, "gflops_per_seq": 0.01, "achieved_gflops": 8.3,
       "pct_peak": None, "floor_ms": None, "x_floor": None, "kernels": None, "speedup": 2.0, "speedup_min": 1.8}
# state.json's probe as the version before the records wrote it, by hand.
WRITTEN = {
    "samples": [
        {"variant": "torch-fp32", "shape": {"layers": 2, "hidden": 64, "heads": 4, "ffn": 256}, "held_out": False,
         "batch": 1, "seq": 32, "ms": 1.2, "size_bytes": 200000, "params": 50000},
        {"variant": "torch-fp32", "shape": {"layers": 1, "hidden": 32, "heads": 2, "ffn": 128}, "held_out": True,
         "batch": 1, "seq": 32, "ms": 1.05, "size_bytes": 90000, "params": None},
    ],
    "error": {"median": 1.5, "worst": 2.0, "errors": [{"variant": "torch-fp32", "shape": "1L-32", "batch": 1, "seq": 32,
                                                       "measured_ms": 1.05, "predicted_ms": 1.07, "percent": 2.0}]},
    "teacher": {"1,32": 2.4}, "teacher_timings": {"1,32": [2.6, 2.4]}, "teacher_size_bytes": 800000,
    "rows": [ROW], "when": "2026-12-01T10:00:00Z",
}


def test_a_probe_reads_back_and_writes_the_same_dict():
    probe = Probe.from_dict(json.loads(json.dumps(WRITTEN)))
    assert probe.samples[0] == ProbeSample("torch-fp32", Shape(2, 64, 4, 256), False, 1, 32, 1.2, 200000, 50000)
    assert probe.samples[1].held_out and probe.samples[1].sample.shape.label == "1L-32"
    assert probe.rows == (Row.from_dict(ROW),) and probe.teacher == {"1,32": 2.4} and probe.reused_from is None
    assert json.dumps(probe.to_dict()) == json.dumps(WRITTEN)  # same keys, same order, same values
    lent = dataclasses.replace(probe, reused_from="/runs/a")  # --reuse: said last
    assert json.dumps(lent.to_dict()) == json.dumps({**WRITTEN, "reused_from": "/runs/a"})


def test_an_earlier_versions_probe_reads_and_is_lent_by_reuse(tmp_path):
    """A probe without the teacher's two timings (before they were kept) reads, and --reuse lends it as it was."""
    old = {k: v for k, v in WRITTEN.items() if k != "teacher_timings"}
    folder = tmp_path / "a"
    work = work_dir_for(folder)
    work.mkdir()
    SearchState(work, {"probe_key": "k", "train_key": "t", "probe": old, "trained": {}}).save()
    earlier = Earlier.read((str(folder),), "k", "other")
    assert earlier.probe.teacher_timings is None and earlier.probe.reused_from == str(folder)
    assert json.dumps(earlier.probe.to_dict()) == json.dumps({**old, "reused_from": str(folder)})
