"""Latency rows from the workers' results: per-point statistics, sizes, speed-ups, the reference and metrics.json.

``build_rows`` turns each model's worker results (one per repeated run) into one row per
(batch, seq): the median over runs of each run's p50 / p90 / p99 / mean, the spread, the
size, FLOPs against the peak of the row's precision, and speed-ups against the first
model (and the reference's fastest fp32 backend). ``build_real_rows`` does the same for
the real inputs of ``--lengths``. Rows are the records of :mod:`compress.eval.latency.row`
(:class:`Row`, :class:`RealRow`); they go into ``latency.json`` and each model's
``metrics.json`` as their ``to_dict()``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from compress.core.formats.records import append_metrics
from compress.eval.latency.config import LatencyConfig
from compress.eval.latency.peak import PRECISIONS, floor_ms, precision_of_backend
from compress.eval.latency.row import RealRow, Row, Stats

# File names that hold weights, for the size column (config and tokenizer files are noise).
WEIGHT_SUFFIXES = (".safetensors", ".onnx", ".onnx_data", ".onnx.data", ".bin", ".pt2")


def size_on_disk(model_dir: Path | str) -> int:
    """Bytes of the weight files (safetensors, ONNX and its external data, .bin) in a directory."""
    return sum(
        p.stat().st_size
        for p in Path(model_dir).iterdir()
        if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES)
    )


MB = 10**6  # the one size unit of every table and summary (latency, quantize, leaderboard): decimal MB, not MiB


def megabytes(n_bytes: int) -> float:
    """``n_bytes`` in MB (10^6 bytes)."""
    return n_bytes / MB


def display_names(model_dirs: list[Path]) -> list[str]:
    """Directory names, with the parent folder added where two would otherwise collide."""
    names = [p.name for p in model_dirs]
    return [
        f"{p.parent.name}/{p.name}" if names.count(p.name) > 1 else p.name
        for p in model_dirs
    ]


def best_peaks(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Per precision and engine, the best of the runs' peaks: noise only ever slows a product down."""
    if not runs:
        return None
    out: dict[str, Any] = {"threads": runs[0]["threads"], "sizes": runs[0]["sizes"]}
    for precision in PRECISIONS:
        engines: dict[str, Any] = {}
        for run in runs:
            for name, record in run[precision]["engines"].items():
                if "gflops" in record and record["gflops"] > engines.get(name, {}).get("gflops", -1.0):
                    engines[name] = record
                engines.setdefault(name, record)  # an engine that never ran keeps its error
        ran = {name: r["gflops"] for name, r in engines.items() if "gflops" in r}
        best = max(ran, key=ran.get) if ran else None
        out[precision] = {**runs[0][precision], "engines": engines, "best": best, "gflops": ran.get(best)}
    return out


def _point_p50s(runs: list[dict[str, Any]]) -> dict[tuple[int, int], list[float]]:
    """(batch, seq) -> the p50 (ms) of each run."""
    out: dict[tuple[int, int], list[float]] = {}
    for result in runs:
        for point in result["points"]:
            out.setdefault((point["batch"], point["seq"]), []).append(Stats.of(point["seconds"]).p50_ms)
    return out


def _ratios(base: Sequence[float], p50s: Sequence[float]) -> list[float]:
    """Per run: the base's p50 over this p50 (> 1 means faster than the base)."""
    return [b / p for b, p in zip(base, p50s)]


def build_rows(
    paths: list[Path], names: list[str], results: list[list[dict[str, Any]]], cfg: LatencyConfig,
    peaks: dict[str, Any] | None, references: dict[str, list[dict[str, Any]]] | None = None,
) -> list[Row]:
    """One row per model x (batch, seq): the median over runs of each run's statistics, and speed-ups.

    ``speedup`` is against the first model (its median p50 over this one's), ``speedup_min``
    the worst run's; with reference backends, ``speedup_vs_best_fp32`` is against the first
    model on its fastest fp32 backend (per point, fastest by median) and ``speedup_vs_torch``
    against it in PyTorch eager.
    """
    rows = [row for path, name, runs in zip(paths, names, results) for row in _model_rows(path, name, runs, cfg, peaks)]
    first = {r.point: r for r in rows[: len(results[0][0]["points"])]}
    ref = {b: _point_p50s(runs) for b, runs in (references or {}).items() if runs}
    return [_with_speedups(row, first[row.point], ref) for row in rows]


def _model_rows(path: Path, name: str, runs: list[dict[str, Any]], cfg: LatencyConfig,
                peaks: dict[str, Any] | None) -> list[Row]:
    """One model's rows (one per (batch, seq) of its runs' results), without the speed-ups."""
    size_mb = megabytes(size_on_disk(path))
    backend = runs[0].get("backend") or cfg.backend
    precision = precision_of_backend(backend, runs[0].get("note"))
    # The peak of the precision the GEMMs really ran in (an int8 row against the int8 peak).
    peak = ((peaks or {}).get(precision) or {}).get("gflops")
    result = runs[0]
    rows = []
    for point in result["points"]:
        batch, seq = point["batch"], point["seq"]
        per_run = [Stats.of(q["seconds"]) for r in runs for q in r["points"] if (q["batch"], q["seq"]) == (batch, seq)]
        stats = _across(per_run, np.median)
        p50_s = stats.p50_ms / 1e3
        flops = result["flops"][str(seq)]  # per sequence, whole encoder
        achieved = flops * batch / p50_s / 1e9
        runs_p50 = tuple(st.p50_ms for st in per_run)
        measured = peak if flops else None  # no FLOPs (a static model): no floor, no share of a peak
        floor = floor_ms(flops * batch, measured) if measured else None
        rows.append(Row(
            model=str(path), name=name, backend=backend, precision=precision, batch=batch, seq=seq,
            p50_ms=stats.p50_ms, p90_ms=stats.p90_ms, p99_ms=stats.p99_ms, mean_ms=stats.mean_ms, runs_p50_ms=runs_p50,
            # each statistic in its slowest run: a budget holds only if it holds there too
            slowest_run=_across(per_run, max),
            # (slowest - fastest run) / median, in %: how far apart the runs were
            spread_pct=100.0 * (max(runs_p50) - min(runs_p50)) / stats.p50_ms,
            throughput=batch / p50_s,  # sequences per second at the median
            params=result["params"], size_mb=size_mb, gflops_per_seq=flops / 1e9, achieved_gflops=achieved,
            pct_peak=100.0 * achieved / measured if measured else None,
            # FLOPs at the peak of its precision: what no engine measured here could beat
            floor_ms=floor,
            x_floor=stats.p50_ms / floor if floor else None,
            note=result.get("note") or None,  # e.g. OpenVINO's inference precision
            # what its matrix multiplications ran on, as the library reports (compress.eval.latency.kernels)
            kernels=result.get("kernels"),
        ))
    return rows


def _across(per_run: list[Stats], how) -> Stats:
    """Each statistic taken across the runs by ``how`` (``np.median``: the row's; ``max``: its slowest run's)."""
    return Stats(*(float(how(values)) for values in zip(*(dataclasses.astuple(st) for st in per_run))))


def _with_speedups(row: Row, base: Row, ref: dict[str, dict[tuple[int, int], list[float]]]) -> Row:
    """``row`` with its speed-ups against ``base`` (the first model at its point) and the reference backends' p50s."""
    more: dict[str, Any] = {"speedup": base.p50_ms / row.p50_ms,
                            "speedup_min": min(_ratios(base.runs_p50_ms, row.runs_p50_ms))}
    if ref:
        best = min(ref, key=lambda b: float(np.median(ref[b][row.point])))
        more.update(best_fp32_backend=best,
                    speedup_vs_best_fp32=float(np.median(ref[best][row.point])) / row.p50_ms,
                    speedup_vs_best_fp32_min=min(_ratios(ref[best][row.point], row.runs_p50_ms)))
        if "torch" in ref:
            more["speedup_vs_torch"] = float(np.median(ref["torch"][row.point])) / row.p50_ms
    return dataclasses.replace(row, **more)


def _real_per_run(runs: list[dict[str, Any]], batch: str, key: str) -> list:
    """Each run's ``key`` on the real inputs at ``batch`` (as the worker's result names it: a string)."""
    return [r["real"]["batches"][batch][key] for r in runs]


def build_real_rows(paths: list[Path], names: list[str], results: list[list[dict[str, Any]]],
                    references: dict[str, list[dict[str, Any]]]) -> list[RealRow]:
    """One row per model x real-input batch size: medians over runs, sentences/s speed-ups (median and worst run)."""
    rows = []
    for path, name, runs in zip(paths, names, results):
        backend = runs[0].get("backend", "")
        for batch in runs[0]["real"]["batches"]:
            rate = _real_per_run(runs, batch, "sentences_per_s")
            rows.append(RealRow(
                model=str(path), name=name, backend=backend, batch=int(batch),
                p50_ms=float(np.median(_real_per_run(runs, batch, "p50_ms"))),
                p99_ms=float(np.median(_real_per_run(runs, batch, "p99_ms"))),
                sentences_per_s=float(np.median(rate)), runs_sentences_per_s=tuple(rate),
                # with --bursts, a fast model's include extra ones
                runs_passes=tuple(_real_per_run(runs, batch, "passes")),
                padded_tokens=runs[0]["real"]["batches"][batch]["padded_tokens"],
            ))
    first = {r.batch: r for r in rows[: len(results[0][0]["real"]["batches"])]}
    ref = {b: runs for b, runs in references.items() if runs}
    return [_with_real_speedups(row, first[row.batch], ref) for row in rows]


def _with_real_speedups(row: RealRow, base: RealRow, ref: dict[str, list[dict[str, Any]]]) -> RealRow:
    """``row`` with its sentences/s speed-ups against ``base`` (the first model) and the fastest reference backend."""
    more: dict[str, Any] = {
        "speedup": row.sentences_per_s / base.sentences_per_s,
        "speedup_min": min(a / b for a, b in zip(row.runs_sentences_per_s, base.runs_sentences_per_s)),
    }
    if ref:
        key = str(row.batch)
        best = max(ref, key=lambda b: float(np.median(_real_per_run(ref[b], key, "sentences_per_s"))))
        best_rate = _real_per_run(ref[best], key, "sentences_per_s")
        more.update(best_fp32_backend=best, speedup_vs_best_fp32=row.sentences_per_s / float(np.median(best_rate)),
                    speedup_vs_best_fp32_min=min(a / b for a, b in zip(row.runs_sentences_per_s, best_rate)))
    return dataclasses.replace(row, **more)


def reference_summary(name: str, references: dict[str, list[dict[str, Any]]]) -> dict[str, Any] | None:
    """The first model's median p50 per fp32 backend and point, as the report's ``reference``.

    ``gflops_per_seq``: per backend and sequence length, the FLOPs of the graph that backend
    ran (an exported classifier's last layer computes the first token only: fewer than PyTorch's).
    """
    if not any(references.values()):
        return None
    return {"model": name, "p50_ms": {b: {f"b{bs},s{sq}": float(np.median(v)) for (bs, sq), v in _point_p50s(runs).items()}
                                      for b, runs in references.items()},
            "kernels": {b: runs[0].get("kernels") for b, runs in references.items() if runs},  # what each backend ran on
            "gflops_per_seq": {b: {s: f / 1e9 for s, f in runs[0]["flops"].items()} for b, runs in references.items() if runs}}


def record_metrics(report: dict[str, Any], paths: list[Path]) -> None:
    """Append each model's own rows (a compact record: each row's dict without the model and its name) to its
    ``metrics.json``."""
    cpu = report["hardware"]
    for path in dict.fromkeys(paths):  # a model listed twice is recorded once
        rows = [
            {k: v for k, v in row.to_dict().items() if k not in ("model", "name")}
            for row in report["rows"]
            if row.model == str(path)
        ]
        append_metrics(path, {
            "kind": "latency",
            "backend": rows[0]["backend"] if rows else report["backend"],
            "threads": report["threads"],
            "rows": rows,
            "speedup_vs": report["rows"][0].model,
            "peak_gflops": report["peak_gflops"],
            "hardware": {"cpu": cpu["cpu"], "microarchitecture": cpu.get("microarchitecture"),
                         "physical_cores": cpu["physical_cores"], "flags": cpu["flags"]},
            "when": report["when"],
        })
