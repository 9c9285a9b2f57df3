"""Latency rows as records: ``to_dict()`` is exactly the dict latency.json and metrics.json hold (keys, order, the
optional keys left out), and ``from_dict()`` reads back what this and earlier versions wrote."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compress.core.errors import CompressError
from compress.eval.latency.config import LatencyConfig
from compress.eval.latency.report import format_markdown, read_report, report_record
from compress.eval.latency.row import RealRow, Row, Stats
from compress.eval.latency.rows import build_rows, record_metrics

KERNELS = {"runtime": "torch", "summary": "ATen matmul", "isa": "avx2", "reported": True, "detail": {}, "note": None}

# A row of latency.json as the version before the records wrote it, by hand: every key in its order, with the
# reference backends' columns (torch among them) and an OpenVINO note.
WRITTEN = {
    "model": "models/student", "name": "student", "backend": "openvino", "precision": "fp32", "batch": 1, "seq": 128,
    "p50_ms": 2.0, "p90_ms": 2.2, "p99_ms": 2.5, "mean_ms": 2.1, "runs_p50_ms": [1.9, 2.0, 2.3],
    "slowest_run": {"p50_ms": 2.3, "p90_ms": 2.4, "p99_ms": 2.9, "mean_ms": 2.35}, "spread_pct": 20.0,
    "throughput": 500.0, "params": 11_000_000, "size_mb": 44.0, "gflops_per_seq": 2.8, "achieved_gflops": 1400.0,
    "pct_peak": 70.0, "floor_ms": 1.4, "x_floor": 1.43, "note": "inference precision f32", "kernels": KERNELS,
    "speedup": 8.0, "speedup_min": 7.0, "best_fp32_backend": "openvino", "speedup_vs_best_fp32": 5.0,
    "speedup_vs_best_fp32_min": 4.5, "speedup_vs_torch": 9.0,
}
# The same without --reference-backends and without a note: those keys are not written at all.
PLAIN = {k: v for k, v in WRITTEN.items()
         if k not in ("note", "best_fp32_backend", "speedup_vs_best_fp32", "speedup_vs_best_fp32_min", "speedup_vs_torch")}

REAL = {"model": "models/student", "name": "student", "backend": "torch", "batch": 2, "p50_ms": 3.0, "p99_ms": 4.0,
        "sentences_per_s": 650.0, "runs_sentences_per_s": [640.0, 660.0], "runs_passes": [2, 3], "padded_tokens": 120,
        "speedup": 1.5, "speedup_min": 1.4, "best_fp32_backend": "torch", "speedup_vs_best_fp32": 1.5,
        "speedup_vs_best_fp32_min": 1.4}


@pytest.mark.parametrize("written", [WRITTEN, PLAIN], ids=["references", "plain"])
def test_a_row_reads_back_and_writes_the_same_dict(written):
    row = Row.from_dict(written)
    assert row.runs_p50_ms == (1.9, 2.0, 2.3) and row.slowest_run == Stats(2.3, 2.4, 2.9, 2.35)
    assert row.point == (1, 128) and row.kernels == KERNELS
    assert list(row.to_dict().items()) == list(written.items())  # same keys, same order, same values
    assert json.dumps(row.to_dict()) == json.dumps(written)


def test_a_real_input_row_reads_back_and_writes_the_same_dict():
    row = RealRow.from_dict(REAL)
    assert row.runs_passes == (2, 3) and row.sentences_per_s == 650.0
    assert list(row.to_dict().items()) == list(REAL.items())
    without = {k: v for k, v in REAL.items() if not k.startswith(("best_fp32", "speedup_vs"))}
    assert list(RealRow.from_dict(without).to_dict().items()) == list(without.items())


def test_metrics_json_rows_and_an_earlier_versions_rows_read():
    kept = Row.from_dict({k: v for k, v in WRITTEN.items() if k not in ("model", "name")})  # metrics.json leaves them out
    assert kept.model == "" and kept.p50_ms == 2.0 and kept.speedup_vs_torch == 9.0
    # the first version's row: no precision, runs, spread, floor or kernels yet
    first = Row.from_dict({"model": "m", "name": "m", "backend": "torch", "batch": 1, "seq": 128, "p50_ms": 5.0,
                           "p90_ms": 5.5, "p99_ms": 6.0, "mean_ms": 5.2, "throughput": 200.0, "params": 10, "size_mb": 1.0,
                           "gflops_per_seq": 1.0, "achieved_gflops": 200.0, "pct_peak": None, "speedup": 1.0})
    assert first.precision is None and first.runs_p50_ms == () and first.slowest_run is None and first.kernels is None
    with pytest.raises(CompressError, match="not a latency row: no p50_ms"):
        Row.from_dict({"batch": 1, "seq": 128})


def test_latency_json_reads_back_into_the_report_and_writes_the_same_file(tmp_path):
    """An earlier version's latency.json (by hand) reads, renders, and is written again byte for byte."""
    written = {"kind": "latency", "backend": "openvino", "threads": 1, "hardware": {"flags": []}, "packages": {},
               "when": "now", "repeat_runs": 3, "reference": None, "real_inputs": None, "real_rows": [],
               "config": {"repeats": 3}, "rows": [PLAIN]}
    report = read_report(json.loads(json.dumps(written)))
    assert report["rows"] == [Row.from_dict(PLAIN)] and report["real_rows"] == []
    assert json.dumps(report_record(report)) == json.dumps(written)
    assert "| student | 1 | 128 | 2.00 | 2.20 |" in format_markdown(report)


def test_built_rows_write_todays_keys_in_todays_order(tmp_path):
    """build_rows's rows as latency.json gets them, and metrics.json's compact copy (without model and name)."""
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"\0" * 1000)
    result = {"points": [{"batch": 1, "seq": 8, "seconds": [0.01, 0.012, 0.011]}], "flops": {"8": 1e9}, "params": 1000,
              "backend": "torch", "kernels": KERNELS}
    rows = build_rows([folder], ["m"], [[result, result]], LatencyConfig(), {"fp32": {"gflops": 100.0}})
    assert list(rows[0].to_dict()) == [k for k in PLAIN]  # no note, no reference backends
    assert rows[0].speedup == 1.0 and rows[0].slowest_run == Stats.of(result["points"][0]["seconds"])  # two runs alike
    report = {"rows": rows, "hardware": {"cpu": "x", "physical_cores": 1, "flags": []}, "backend": "torch",
              "threads": 1, "peak_gflops": 100.0, "when": "now"}
    record_metrics(report, [folder])
    kept = json.loads((folder / "metrics.json").read_text())["results"][-1]
    assert list(kept["rows"][0]) == [k for k in PLAIN if k not in ("model", "name")]
    assert Row.from_dict(kept["rows"][0]).to_dict() == {**rows[0].to_dict(), "model": "", "name": ""}
    assert kept["speedup_vs"] == str(Path(folder))
