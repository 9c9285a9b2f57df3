"""CPU latency of model directories, each timed in its own process, against a measured GEMM peak.

``measure_latency(model_dirs, cfg)`` times every model at every (batch, seq) of the grid
and returns a report dict; ``format_markdown(report)`` renders it as one table and
``write_report(report, out_dir)`` writes ``latency.json`` + ``latency.md``.

Why one process per model: thread pools (torch's OpenMP pool, ONNX Runtime's own pool)
persist for the life of a process and fight each other on a 2-core machine, and a
model's allocations and caches would warm the next model's run. So the parent never
times anything; it spawns ``python -m compress.eval.latency.worker --worker`` once for the GEMM peak
and once per model, with the thread count fixed in the environment before torch is
imported, and reads JSON lines back on the worker's stdout:

    parent --(job JSON on stdin)--> worker
    worker --{"point": {...}}-----> parent   one per (batch, seq), for the progress bar
    worker --{"done": {...}}------> parent   or {"error": "one line"} for a CompressError

With ``--bursts N`` every model's worker is started at once and stays loaded
(``"mode": "serve"``: one JSON line per request, one answer per line); the parent then
asks each in turn for 1/N of a point's timed passes, N times round, so the models take
turns in short bursts and a slow spell of the machine (on a shared host it can last
seconds and slow everything by a third) lands on all of them rather than on one; the
real inputs of ``--lengths`` are then timed the same way, in turns of half a second,
every model timing extra passes until the slowest is done (``extra``):

    parent --{"burst": [batch, seq, passes, min_s]}--> worker --{"seconds": [...]}--> parent
    parent --{"real": [batch, seconds, extra]}-------> worker --{"more": true|false}-> parent
    parent --{"finish": true}------------------------> worker --{"done": {...}}-----> parent

The modules: this one is the parent (the config, the runs, the rows and the report);
``compress.eval.latency.worker`` is the worker process (:class:`Timing` times one model
point by point); ``compress.eval.latency.backends`` holds the backends (``BACKENDS``) that
load a model directory into a ``Session`` (``auto``, the default, picks by the directory's
format; each row names the backend that ran, and an OpenVINO row's note the precision
the compiled model reports).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from compress.core.formats.artifacts import (
    append_metrics,
    artifact_format,
    check_writable,
    load_config,
    load_tokenizer,
    require_model_dir,
    utc_now,
    write_json_atomic,
    write_text_atomic,
)
from compress.core.config import option
from compress.core.errors import CompressError
from compress.core.hardware import cpu_info, hardware, package_versions
from compress.core.logs import progress
from compress.core.formats.static import STATIC, max_length_of, static_config
from compress.core.model.structure import config_sizes
from compress.core.data.tasks import Task
from compress.eval.latency.backends import AUTO_BACKENDS, BACKENDS
from compress.eval.latency.lengths import lengths_task, real_inputs
from compress.eval.latency.peak import PRECISIONS, cpu_theoretical_peaks, floor_ms, peak_notes, precision_of_backend

log = logging.getLogger(__name__)

REPORT_JSON = "latency.json"
REPORT_MD = "latency.md"

# File names that hold weights, for the size column (config and tokenizer files are noise).
WEIGHT_SUFFIXES = (".safetensors", ".onnx", ".onnx_data", ".onnx.data", ".bin", ".pt2")

# Square matmuls for the GEMM peaks (compress.eval.latency.peak: every engine, fp32 / bf16 / int8):
# big enough to be compute-bound on a CPU, small enough for seconds on 2 cores.
PEAK_SIZES = (1024, 2048)
PEAK_SECONDS = 0.3

# The backends that run an fp32 folder in fp32: the candidates for the reference's fastest.
FP32_BACKENDS = ("torch", "onnxruntime", "openvino")

# Real inputs are cut where tasks cut them by default (a longer model still sees the same set).
MAX_REAL_LENGTH = 128

# How OpenVINO rows compile: per grid point for its fixed shape, or once for any shape.
OPENVINO_SHAPES = ("static", "dynamic")

# A model at its floor is possible (the BERT-base shape reaches the fp32 peak on OpenVINO); one faster than this share
# of it (above 1/0.95 = 105% of the peak) is not: the peak run was slowed.
BELOW_FLOOR = 0.95

# Timed passes a point keeps under --max-seconds: a median needs a few.
MIN_PASSES = 3

# How the parent starts a worker process (compress.eval.latency.worker).
WORKER_COMMAND = [sys.executable, "-m", "compress.eval.latency.worker", "--worker"]


@dataclass(frozen=True)
class LatencyConfig:
    batch: tuple[int, ...] = option((1,), "batch sizes to time", metavar="N[,...]")
    seq: tuple[int, ...] = option((128,), "sequence lengths (tokens) to time", metavar="N[,...]")
    warmup: int = option(5, "untimed forward passes before timing each (batch, seq)")
    repeats: int = option(30, "timed forward passes per (batch, seq)")
    min_seconds: float = option(0.0, "keep repeating until the timed passes add up to at least this long (a point's "
                                "passes, and the passes over the --lengths set)")
    max_seconds: float = option(0.0, "stop timing a point once its passes add up to this long, even short of --repeats "
                                f"(never fewer than {MIN_PASSES}), and start no pass over the --lengths set past it: "
                                "a slow reference model (BERT-base at batch 32) needs fewer passes (0: no limit)")
    threads: int | None = option(None, "intra-op threads (default: usable physical cores)")
    backend: str = option("auto", "latency backend: auto (by the directory's format), torch (fp32), torch-int8, torch-bf16, onnxruntime, inc, openvino, openvino-bf16",
                          choices=lambda: [name for name, _ in BACKENDS.items()])
    openvino_shapes: str = option("static", "OpenVINO rows: static compiles the model once more for each grid point's "
                                  "fixed [batch, seq] and, with --lengths, for each padded shape of the real inputs (see "
                                  "--lengths-multiple), as a deployment padding to a few lengths would; dynamic compiles "
                                  "it once for any shape", choices=OPENVINO_SHAPES)
    peak: bool = option(True, "also measure the fp32 GEMM peak and report each model's % of it")
    repeat_runs: int = option(1, "repeat the whole measurement (every model in turn) K times: rows give the median of the "
                              "runs' medians, their spread, and the speed-up of the worst run (a speed-up holds only if it "
                              "holds in every run)", metavar="K")
    bursts: int = option(1, "split each point's timed passes into N bursts taken in turn by every model (all loaded at "
                         "once, one process each, idle while another times), so that a slow spell of the machine hits "
                         "every model alike instead of whichever was timing then; --lengths passes are then taken in "
                         "turns of half a second, the faster models timing extra passes until the slowest is done",
                         metavar="N")
    reference_backends: tuple[str, ...] = option((), "also time the FIRST model on these fp32 backends (e.g. torch,"
                                                 "onnxruntime,openvino): rows then give speed-ups against its fastest "
                                                 "fp32 backend and against PyTorch eager", metavar="B[,...]")
    lengths: str | None = option(None, "also time on real inputs at their own lengths: a TASK's dev set (with --data-dir), a "
                                 "FILE of texts (.txt lines, .tsv/.jsonl with sentence or sentence1/sentence2), or a data "
                                 "file of the models' own task (csv/tsv/jsonl/CoNLL..., read through the task their folder "
                                 "records): batch 1 one sentence at a time, and --lengths-batch sorted by length with "
                                 "dynamic padding", metavar="TASK|FILE")
    lengths_batch: int = option(32, "the batch size of the sorted, dynamically padded pass of --lengths")
    lengths_passes: int = option(3, "timed passes over the --lengths set (each batch's median is kept)")
    lengths_multiple: int = option(8, "with --openvino-shapes static, OpenVINO pads --lengths inputs to a multiple of this "
                                   "many tokens and compiles one model per padded shape (fewer shapes, more padding)",
                                   metavar="N")
    data_dir: str | None = option(None, "GLUE data folder for --lengths TASK (default: the hub's copy)", metavar="DIR")
    record: bool = option(True, "append the results to each model's metrics.json")
    out: str | None = option(None, "directory for latency.json and latency.md", metavar="DIR")

    def validate(self) -> None:
        for name in ("batch", "seq"):
            values = getattr(self, name)
            if not values:
                raise CompressError(f"--{name} needs at least one value, e.g. --{name} 1,8")
            if min(values) < 1:
                raise CompressError(f"--{name} values must be at least 1, got {min(values)}")
        if self.warmup < 0:
            raise CompressError(f"--warmup must be 0 or more, got {self.warmup}")
        if self.repeats < 1:
            raise CompressError(f"--repeats must be at least 1, got {self.repeats}")
        if self.min_seconds < 0:
            raise CompressError(f"--min-seconds must be 0 or more, got {self.min_seconds}")
        if self.max_seconds < 0 or (self.max_seconds and self.max_seconds < self.min_seconds):
            raise CompressError(f"--max-seconds must be 0 (no limit) or at least --min-seconds ({self.min_seconds:g}), "
                                f"got {self.max_seconds:g}")
        if self.lengths_batch < 1 or self.lengths_passes < 1 or self.lengths_multiple < 1:
            raise CompressError("--lengths-batch, --lengths-passes and --lengths-multiple must be at least 1")
        if self.repeat_runs < 1:
            raise CompressError(f"--repeat-runs must be at least 1, got {self.repeat_runs}")
        if not 1 <= self.bursts <= self.repeats:
            raise CompressError(f"--bursts must be between 1 and --repeats ({self.repeats}), got {self.bursts}")
        for name in self.reference_backends:
            if name not in FP32_BACKENDS:
                raise CompressError(f"--reference-backends takes fp32 backends ({', '.join(FP32_BACKENDS)}); got {name!r}")
        if self.threads is not None and self.threads < 1:
            raise CompressError(f"--threads must be at least 1, got {self.threads}")
        if self.openvino_shapes not in OPENVINO_SHAPES:
            raise CompressError(f"--openvino-shapes is static or dynamic, got {self.openvino_shapes!r}")
        if self.backend not in BACKENDS:
            # Registration order (the fp32 baseline first), not the registry's alphabetical one.
            valid = ", ".join(name for name, _ in BACKENDS.items())
            raise CompressError(f"unknown latency backend {self.backend!r}; valid: {valid}")

    def grid(self) -> list[tuple[int, int]]:
        """Every (batch, seq) to time, in a stable order."""
        return [(b, s) for b in self.batch for s in self.seq]


# ---------------------------------------------------------------------------- small helpers


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


def default_threads() -> int:
    """Usable physical cores: hyper-threads only slow dense matmuls down."""
    info = cpu_info()
    return max(1, min(info["physical_cores"], info["usable_cores"]))


def check_seq(seqs: tuple[int, ...], max_positions: int, model_dir: Path | str) -> None:
    """Refuse sequence lengths the model's position embeddings cannot cover."""
    too_long = max(seqs)
    if too_long > max_positions:
        raise CompressError(
            f"--seq {too_long} is longer than {model_dir}'s max_position_embeddings ({max_positions}); "
            f"use --seq {max_positions} or less"
        )


def percentile_stats(seconds: list[float]) -> dict[str, float]:
    """p50 / p90 / p99 / mean of the timed passes, in milliseconds."""
    ms = np.asarray(seconds, dtype=np.float64) * 1e3
    p50, p90, p99 = np.percentile(ms, [50, 90, 99])
    return {"p50_ms": float(p50), "p90_ms": float(p90), "p99_ms": float(p99), "mean_ms": float(ms.mean())}


def display_names(model_dirs: list[Path]) -> list[str]:
    """Directory names, with the parent folder added where two would otherwise collide."""
    names = [p.name for p in model_dirs]
    return [
        f"{p.parent.name}/{p.name}" if names.count(p.name) > 1 else p.name
        for p in model_dirs
    ]


# ---------------------------------------------------------------------------- the parent side


def measure_latency(model_dirs: list[str | Path], cfg: LatencyConfig) -> dict[str, Any]:
    """Time every model at every (batch, seq) of ``cfg``, each in its own process; the report.

    Also appends each model's rows to its ``metrics.json`` (``cfg.record``) and writes
    ``latency.json`` + ``latency.md`` to ``cfg.out`` when set.
    """
    cfg.validate()
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    if not model_dirs:
        raise CompressError("no model directory given; pass at least one --model DIR")
    paths = [Path(p) for p in model_dirs]
    reads = lengths_task(paths, cfg.lengths)  # the user's task whose file --lengths is: every model times its inputs
    for path in paths:
        precheck(path, cfg, reads)  # every cheap failure before minutes of timing
    if cfg.out:
        check_writable(cfg.out, "--out", "choose another --out")
    if cfg.record:
        for path in paths:
            check_writable(path, "results (metrics.json)", "pass --no-record, or copy the model somewhere writable")
    threads = cfg.threads or default_threads()
    names = display_names(paths)

    peaks, results, references = run_all(paths, names, cfg, threads, reads)
    if references and "torch" not in references and results[0][0].get("backend") == "torch":
        references["torch"] = results[0]  # the first model ran in PyTorch eager fp32: it is that reference already
    rows = build_rows(paths, names, results, cfg, peaks, references)
    theoretical = cpu_theoretical_peaks(threads) if cfg.peak else None
    report = {
        "kind": "latency",
        "when": utc_now(),
        "hardware": hardware(),
        "packages": package_versions(),
        "threads": threads,
        # The backends that ran (auto resolves per directory), e.g. "torch, onnxruntime-int8".
        "backend": ", ".join(dict.fromkeys(r["backend"] for r in rows)),
        "notes": list(dict.fromkeys(r["note"] for runs in results for r in runs if r.get("note"))),
        "load_avg_1min": load_before,  # near 0 when idle; higher means shared cores
        "peak_gflops": peaks["fp32"]["gflops"] if peaks else None,  # the fp32 peak: the best engine's
        "peaks": peaks,
        "theoretical_peaks": theoretical,
        "peak_notes": peak_notes(peaks, theoretical) if peaks else [],
        "peak_sizes": list(PEAK_SIZES) if cfg.peak else None,
        "repeat_runs": cfg.repeat_runs,
        "reference": reference_summary(names[0], references),
        "real_inputs": results[0][0]["real"]["inputs"] if cfg.lengths else None,
        "real_rows": build_real_rows(paths, names, results, references) if cfg.lengths else [],
        "config": {**dataclasses.asdict(cfg), "threads": threads},
        "rows": rows,
    }
    if cfg.record:
        record_metrics(report, paths)
    if cfg.out:
        write_report(report, cfg.out)
    return report


def run_all(
    paths: list[Path], names: list[str], cfg: LatencyConfig, threads: int, reads: Task | None = None
) -> tuple[dict[str, Any] | None, list[list[dict[str, Any]]], dict[str, list[dict[str, Any]]]]:
    """The GEMM peaks (:func:`best_peaks`, or None), each model's worker result per run, and the reference's per
    fp32 backend per run.

    A run is the whole sequence (peak, every model, the reference on each backend), one
    process after another; runs repeat it, so a load change hits every model alike and
    shows as spread instead of as one model's speed-up. ``reads``: the user's task whose data file
    ``--lengths`` is (:func:`compress.eval.latency.lengths.lengths_task`), sent to every worker.
    """
    task = {"lengths_task": reads.to_record()} if reads is not None else {}
    jobs = [(name, {"mode": "model", "model": str(path), "config": worker_config(cfg, threads), **task})
            for path, name in zip(paths, names)]
    # The first model's own job already times it on the backend its format picks: that one is not timed twice.
    own = _own_backend(paths[0], cfg)
    shared = [b for b in cfg.reference_backends if b == own]
    jobs += [(f"{names[0]} [{b}]", {"mode": "model", "model": str(paths[0]),
                                    "config": {**worker_config(cfg, threads), "backend": b}, "reference": b, **task})
             for b in cfg.reference_backends if b not in shared]
    total = cfg.repeat_runs * (len(jobs) * len(cfg.grid()) + (1 if cfg.peak else 0))
    peaks: list[dict[str, Any]] = []
    results: list[list[dict[str, Any]]] = [[] for _ in paths]
    references: dict[str, list[dict[str, Any]]] = {b: [] for b in cfg.reference_backends}
    # The bar is on stderr (hidden when not a terminal); one log line per model.
    with progress(total=total, desc="latency", unit="point", file=sys.stderr) as bar:
        for run in range(cfg.repeat_runs):
            tag = f" (run {run + 1}/{cfg.repeat_runs})" if cfg.repeat_runs > 1 else ""
            if cfg.peak:
                peaks.append(run_worker({"mode": "peak", "sizes": list(PEAK_SIZES)}, threads, "GEMM peak", bar)["peaks"])
                log.info("GEMM peaks%s: %s", tag, ", ".join(
                    f"{p} {peaks[-1][p]['gflops']:.0f} ({peaks[-1][p]['best']})" for p in PRECISIONS if peaks[-1][p]["gflops"]))
            outcomes = (run_interleaved(jobs, cfg, threads, bar) if cfg.bursts > 1
                        else (run_worker(job, threads, name, bar) for name, job in jobs))
            for i, ((name, job), result) in enumerate(zip(jobs, outcomes)):
                if "reference" in job:
                    references[job["reference"]].append(result)
                else:
                    results[i].append(result)
                first = result["points"][0]
                p50 = percentile_stats(first["seconds"])["p50_ms"]
                log.info(f"{name}: p50 {p50:.2f} ms at batch {first['batch']} seq {first['seq']}{tag}")
            for b in shared:
                references[b].append(results[0][-1])
    return best_peaks(peaks), results, references


def _own_backend(path: Path, cfg: LatencyConfig) -> str:
    """The backend a model's own job runs on: ``cfg.backend``, or for ``auto`` the one its format picks."""
    if cfg.backend != "auto":
        return cfg.backend
    return AUTO_BACKENDS.get(artifact_format(path), "")


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


def precheck(path: Path, cfg: LatencyConfig, reads: Task | None = None) -> None:
    """Fail before spawning anything on a missing directory or a too-long sequence."""
    require_model_dir(path)
    if artifact_format(path) == STATIC:  # a model2vec config.json: no encoder family, only its own max_length
        longest = max_length_of(static_config(path))
    else:
        longest = config_sizes(load_config(path)).max_positions  # config.json only: no torch, no weights
    check_seq(cfg.seq, longest, path)
    if cfg.lengths:  # a wrong task, file or data folder is said now, not after minutes of timing
        real_inputs(cfg.lengths, load_tokenizer(path), data_dir=cfg.data_dir, limit=1, task=reads)


def worker_config(cfg: LatencyConfig, threads: int) -> dict[str, Any]:
    """The config as JSON for a worker, with the thread count resolved."""
    return {**dataclasses.asdict(cfg), "threads": threads, "out": None}


def _point_p50s(runs: list[dict[str, Any]]) -> dict[tuple[int, int], list[float]]:
    """(batch, seq) -> the p50 (ms) of each run."""
    out: dict[tuple[int, int], list[float]] = {}
    for result in runs:
        for point in result["points"]:
            out.setdefault((point["batch"], point["seq"]), []).append(percentile_stats(point["seconds"])["p50_ms"])
    return out


def _ratios(base: list[float], p50s: list[float]) -> list[float]:
    """Per run: the base's p50 over this p50 (> 1 means faster than the base)."""
    return [b / p for b, p in zip(base, p50s)]


def build_rows(
    paths: list[Path], names: list[str], results: list[list[dict[str, Any]]], cfg: LatencyConfig,
    peaks: dict[str, Any] | None, references: dict[str, list[dict[str, Any]]] | None = None,
) -> list[dict[str, Any]]:
    """One row per model x (batch, seq): the median over runs of each run's statistics, and speed-ups.

    ``speedup`` is against the first model (its median p50 over this one's), ``speedup_min``
    the worst run's; with reference backends, ``speedup_vs_best_fp32`` is against the first
    model on its fastest fp32 backend (per point, fastest by median) and ``speedup_vs_torch``
    against it in PyTorch eager.
    """
    rows = []
    for path, name, runs in zip(paths, names, results):
        size_mb = megabytes(size_on_disk(path))
        backend = runs[0].get("backend") or cfg.backend
        precision = precision_of_backend(backend, runs[0].get("note"))
        # The peak of the precision the GEMMs really ran in (an int8 row against the int8 peak).
        peak = ((peaks or {}).get(precision) or {}).get("gflops")
        result = runs[0]
        for point in result["points"]:
            batch, seq = point["batch"], point["seq"]
            per_run = [percentile_stats(r["points"][i]["seconds"]) for r in runs for i, q in enumerate(r["points"])
                       if (q["batch"], q["seq"]) == (batch, seq)]
            stats = {k: float(np.median([st[k] for st in per_run])) for k in per_run[0]}
            p50_s = stats["p50_ms"] / 1e3
            flops = result["flops"][str(seq)]  # per sequence, whole encoder
            achieved = flops * batch / p50_s / 1e9
            runs_p50 = [st["p50_ms"] for st in per_run]
            measured = peak if flops else None  # no FLOPs (a static model): no floor, no share of a peak
            floor = floor_ms(flops * batch, measured) if measured else None
            rows.append({
                "model": str(path),
                "name": name,
                "backend": backend,
                "precision": precision,
                "batch": batch,
                "seq": seq,
                **stats,
                "runs_p50_ms": runs_p50,
                # each statistic in its slowest run: a budget holds only if it holds there too
                "slowest_run": {k: float(max(st[k] for st in per_run)) for k in per_run[0]},
                # (slowest - fastest run) / median, in %: how far apart the runs were
                "spread_pct": 100.0 * (max(runs_p50) - min(runs_p50)) / stats["p50_ms"],
                "throughput": batch / p50_s,  # sequences per second at the median
                "params": result["params"],
                "size_mb": size_mb,
                "gflops_per_seq": flops / 1e9,
                "achieved_gflops": achieved,
                "pct_peak": 100.0 * achieved / measured if measured else None,
                # FLOPs at the peak of its precision: what no engine measured here could beat
                "floor_ms": floor,
                "x_floor": stats["p50_ms"] / floor if floor else None,
                **({"note": result["note"]} if result.get("note") else {}),  # e.g. OpenVINO's inference precision
                # what its matrix multiplications ran on, as the library reports (compress.eval.latency.kernels)
                "kernels": result.get("kernels"),
            })
    first = {(r["batch"], r["seq"]): r for r in rows[: len(results[0][0]["points"])]}
    ref = {b: _point_p50s(runs) for b, runs in (references or {}).items() if runs}
    for row in rows:
        point = (row["batch"], row["seq"])
        base = first[point]
        row["speedup"] = base["p50_ms"] / row["p50_ms"]
        row["speedup_min"] = min(_ratios(base["runs_p50_ms"], row["runs_p50_ms"]))
        if ref:
            best = min(ref, key=lambda b: float(np.median(ref[b][point])))
            row["best_fp32_backend"] = best
            row["speedup_vs_best_fp32"] = float(np.median(ref[best][point])) / row["p50_ms"]
            row["speedup_vs_best_fp32_min"] = min(_ratios(ref[best][point], row["runs_p50_ms"]))
            if "torch" in ref:
                row["speedup_vs_torch"] = float(np.median(ref["torch"][point])) / row["p50_ms"]
    return rows


def build_real_rows(paths: list[Path], names: list[str], results: list[list[dict[str, Any]]],
                    references: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per model x real-input batch size: medians over runs, sentences/s speed-ups (median and worst run)."""
    def per_run(runs, batch, key):
        return [r["real"]["batches"][batch][key] for r in runs]

    rows = []
    for path, name, runs in zip(paths, names, results):
        backend = runs[0].get("backend", "")
        for batch in runs[0]["real"]["batches"]:
            rate = per_run(runs, batch, "sentences_per_s")
            rows.append({
                "model": str(path), "name": name, "backend": backend, "batch": int(batch),
                "p50_ms": float(np.median(per_run(runs, batch, "p50_ms"))),
                "p99_ms": float(np.median(per_run(runs, batch, "p99_ms"))),
                "sentences_per_s": float(np.median(rate)), "runs_sentences_per_s": rate,
                "runs_passes": per_run(runs, batch, "passes"),  # with --bursts, a fast model's include extra ones
                "padded_tokens": runs[0]["real"]["batches"][batch]["padded_tokens"],
            })
    first = {r["batch"]: r for r in rows[: len(results[0][0]["real"]["batches"])]}
    ref = {b: runs for b, runs in references.items() if runs}
    for row in rows:
        base = first[row["batch"]]
        row["speedup"] = row["sentences_per_s"] / base["sentences_per_s"]
        row["speedup_min"] = min(a / b for a, b in zip(row["runs_sentences_per_s"], base["runs_sentences_per_s"]))
        if ref:
            key = str(row["batch"])
            best = max(ref, key=lambda b: float(np.median(per_run(ref[b], key, "sentences_per_s"))))
            best_rate = per_run(ref[best], key, "sentences_per_s")
            row["best_fp32_backend"] = best
            row["speedup_vs_best_fp32"] = row["sentences_per_s"] / float(np.median(best_rate))
            row["speedup_vs_best_fp32_min"] = min(a / b for a, b in zip(row["runs_sentences_per_s"], best_rate))
    return rows


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
    """Append each model's own rows (a compact record) to its ``metrics.json``."""
    cpu = report["hardware"]
    for path in dict.fromkeys(paths):  # a model listed twice is recorded once
        rows = [
            {k: v for k, v in row.items() if k not in ("model", "name")}
            for row in report["rows"]
            if row["model"] == str(path)
        ]
        append_metrics(path, {
            "kind": "latency",
            "backend": rows[0]["backend"] if rows else report["backend"],
            "threads": report["threads"],
            "rows": rows,
            "speedup_vs": report["rows"][0]["model"],
            "peak_gflops": report["peak_gflops"],
            "hardware": {"cpu": cpu["cpu"], "microarchitecture": cpu.get("microarchitecture"),
                         "physical_cores": cpu["physical_cores"], "flags": cpu["flags"]},
            "when": report["when"],
        })


def worker_env(threads: int) -> dict[str, str]:
    """The environment of a worker: thread counts fixed before torch loads, this checkout importable."""
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(threads)
    env["TOKENIZERS_PARALLELISM"] = "false"
    root = str(Path(__file__).resolve().parents[1])  # so the worker runs this very code
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def run_worker(job: dict[str, Any], threads: int, label: str, bar=None) -> dict[str, Any]:
    """Run one worker process on ``job``; its ``done`` payload, or a CompressError with its message."""
    job = {**job, "threads": threads}
    cmd = WORKER_COMMAND
    # stderr goes to a file, not a pipe: a chatty worker must not block on a full pipe.
    with tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") as err:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
            text=True, env=worker_env(threads),
        )
        try:
            proc.stdin.write(json.dumps(job))
            proc.stdin.close()
            done, error = None, None
            for line in proc.stdout:
                message = _parse_line(line)
                if "point" in message and bar is not None:
                    bar.update(1)
                done = message.get("done", done)
                error = message.get("error", error)
            code = proc.wait()
        finally:
            if proc.poll() is None:  # interrupted: do not leave our worker running
                proc.kill()
                proc.wait()
        if bar is not None and "gflops" in (done or {}):
            bar.update(1)
        if error:
            raise CompressError(error)
        if code != 0 or done is None:
            err.seek(0)
            raise CompressError(f"the latency worker for {label} failed ({_exit_reason(code)}): {_last_line(err.read())}")
    return done


# Between two bursts: time for the last worker's thread pool to stop spinning before the next one times.
BURST_PAUSE_S = 0.05
# A model's turn on the real inputs when models take turns: short against the slow spells of a shared host (seconds
# to minutes), long against a call (a BERT-base batch of 32 is the longest, about a second; a turn ends after a call).
REAL_SLICE_S = 0.5


def run_interleaved(jobs: list[tuple[str, dict[str, Any]]], cfg: LatencyConfig, threads: int, bar=None) -> list[dict[str, Any]]:
    """Every job's ``done`` payload, the models timed in ``cfg.bursts`` bursts per point taken in turn.

    All workers load first (the slowest part, and nobody times meanwhile); then for each
    (batch, seq), round after round, each worker times its share of the passes while the
    others wait on their stdin. A worker's passes of a point are pooled, so its payload is
    the one-shot worker's, point for point. With ``--lengths``, the real inputs follow the
    same way: round after round each worker times them for :data:`REAL_SLICE_S`, going on
    from where its last turn stopped, until every model's passes are done. A fast model's
    passes end in a few rounds, a slow one's take many: the fast one keeps its turns and times
    extra passes until the last model is done, so its median pass is drawn from the same
    minutes as the slow one's (else a slow spell in the first seconds lands on it alone).
    """
    workers: list[_Served] = []
    try:
        for name, job in jobs:
            workers.append(_Served({**job, "mode": "serve"}, threads, name))
        for worker in workers:
            worker.wait_ready()
        for batch, seq in cfg.grid():
            # The passes split as evenly as they go: 30 in 4 bursts -> 8, 8, 7, 7.
            shares = [cfg.repeats // cfg.bursts + (i < cfg.repeats % cfg.bursts) for i in range(cfg.bursts)]
            for passes in shares:
                for worker in workers:
                    time.sleep(BURST_PAUSE_S)
                    worker.ask({"burst": [batch, seq, passes, cfg.min_seconds / cfg.bursts]}, "seconds")
            if bar is not None:
                bar.update(len(workers))
        if cfg.lengths:  # the real inputs in slices of REAL_SLICE_S, round after round, until every model is done
            for batch in real_batches(cfg):
                active = list(workers)  # the models short of their passes; the others time extra ones meanwhile
                while active:
                    for worker in workers:
                        if not active:
                            break
                        time.sleep(BURST_PAUSE_S)
                        extra = worker not in active
                        if not worker.ask({"real": [batch, REAL_SLICE_S, extra]}, "more") and not extra:
                            active.remove(worker)
        return [worker.ask({"finish": True}, "done") for worker in workers]
    finally:
        for worker in workers:
            worker.close()


class _Served:
    """A worker process that keeps its model loaded and answers one request per line (``"mode": "serve"``)."""

    def __init__(self, job: dict[str, Any], threads: int, label: str):
        self.label = label
        self.err = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")  # a file: never a full pipe
        self.proc = subprocess.Popen(WORKER_COMMAND, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.err, text=True, env=worker_env(threads))
        self._send({**job, "threads": threads})

    def wait_ready(self) -> None:
        self._read("ready")

    def ask(self, request: dict[str, Any], key: str) -> Any:
        self._send(request)
        return self._read(key)

    def _send(self, message: dict[str, Any]) -> None:
        try:
            self.proc.stdin.write(json.dumps(message) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            self._failed()

    def _read(self, key: str) -> Any:
        for line in iter(self.proc.stdout.readline, ""):
            message = _parse_line(line)
            if "error" in message:
                raise CompressError(message["error"])
            if key in message:
                return message[key]
        self._failed()

    def _failed(self):
        code = self.proc.wait()
        self.err.seek(0)
        raise CompressError(f"the latency worker for {self.label} failed ({_exit_reason(code)}): {_last_line(self.err.read())}")

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()  # a served worker ends at the end of its input
                self.proc.wait(timeout=10)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.err.close()


def _parse_line(line: str) -> dict[str, Any]:
    try:
        message = json.loads(line)
    except json.JSONDecodeError:
        return {}
    return message if isinstance(message, dict) else {}


def _exit_reason(code: int) -> str:
    if code == -9:
        return "killed by signal 9, often out of memory; try a smaller --batch or --seq"
    if code < 0:
        return f"killed by signal {-code}"
    return f"exit status {code}"


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no error output"


# ---------------------------------------------------------------------------- reports


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def format_markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: a header naming the machine and settings, the grid table, and the real-input table."""
    runs = report.get("repeat_runs") or 1
    ref = report.get("reference")
    extra = ([f"spread over {runs} runs", "worst-run speed-up"] if runs > 1 else []) + (
        ["vs best fp32 (worst run)", "vs PyTorch eager"] if ref else [])
    lines = [f"# Latency ({report['backend']})", "", *_header(report), "",
             TABLE_HEAD[0] + "".join(f" {cell} |" for cell in extra), TABLE_HEAD[1] + "--:|" * len(extra)]
    for r in report["rows"]:
        line = (
            f"| {r['name']} | {r['batch']} | {r['seq']} | {r['p50_ms']:.2f} | {r['p90_ms']:.2f} | "
            f"{r['p99_ms']:.2f} | {r['throughput']:.1f} | {r['params'] / 1e6:.2f} | {r['size_mb']:.1f} | "
            f"{r['gflops_per_seq']:.4g} | {r['achieved_gflops']:.1f} | {_fmt(r['pct_peak'], '.0f')} | "
            f"{r['speedup']:.2f}x | {r.get('precision', '?')} | {_fmt(r.get('x_floor'), '.1f')} |"
        )
        if runs > 1:
            line += f" {r['spread_pct']:.0f}% | {r['speedup_min']:.2f}x |"
        if ref:
            torch_eager = r.get("speedup_vs_torch")
            line += (f" {r['speedup_vs_best_fp32']:.2f}x ({r['speedup_vs_best_fp32_min']:.2f}x) |"
                     f" {_fmt(torch_eager, '.2f')}{'x' if torch_eager is not None else ''} |")
        lines.append(line)
    lines += kernel_lines(report["rows"], ref)
    if ref:
        lines += ["", f"Reference: {ref['model']} in fp32 on " + "; ".join(
            f"{b} " + ", ".join(f"{k} {v:.2f} ms" for k, v in points.items()) for b, points in ref["p50_ms"].items())
            + " (median p50 over runs); 'vs best fp32' divides its fastest backend's p50 by the row's."]
    if report.get("real_rows"):
        lines += ["", *format_real(report)]
    return "\n".join(lines) + "\n"


def kernel_lines(rows: list[dict[str, Any]], reference: dict[str, Any] | None = None) -> list[str]:
    """Under the table, one line per model and backend (the reference's too): what its matrix multiplications ran on.

    "inferred" marks a runtime that reports nothing (ONNX Runtime's MLAS, fbgemm): its kernels follow from the flags.
    """
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        if row.get("kernels"):
            seen.setdefault((row["name"], row["backend"]), row["kernels"])
    for backend, kernels in ((reference or {}).get("kernels") or {}).items():
        if kernels and (reference["model"], backend) not in seen:  # the first model's own run on that backend: listed
            seen[reference["model"], f"reference {backend}"] = kernels
    if not seen:
        return []
    lines = ["", "Kernels (what each model's matrix multiplications ran on, as its library reports; ISA in brackets):", ""]
    for (name, backend), k in seen.items():
        isa = k.get("isa") or "ISA not reported"
        lines.append(f"- {name} ({backend}): {k['summary']} [{isa}{'' if k.get('reported') else ', inferred'}]"
                     + (f"; note: {k['note']}" if k.get("note") else ""))
    return lines


TABLE_HEAD = (
    "| model | batch | seq | p50 ms | p90 ms | p99 ms | seq/s | params (M) | size (MB) "
    "| GFLOPs/seq | GFLOP/s | % peak | speed-up vs first | precision | x floor |",
    "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|--:|",
)


def format_real(report: dict[str, Any]) -> list[str]:
    """The real-input table: each model on the set's sentences at their own lengths."""
    info, ref = report["real_inputs"], report.get("reference")
    lines = [f"## Real inputs: {info['source']}", "",
             f"{info['n']} sentences, {info['mean_tokens']:.1f} tokens on average (median {info['median_tokens']:.0f}, "
             f"longest {info['max_tokens']}, {info['n_truncated']} cut at {info['max_length']}). Batch 1: one sentence at a "
             "time, in order (p50/p99 per sentence); larger batches: sorted by length, each padded to its longest "
             "(p50/p99 per batch). Speed-ups compare sentences per second.", "",
             "| model | backend | batch | p50 ms | p99 ms | sentences/s | speed-up vs first (worst run)"
             + (" | vs best fp32 (worst run) |" if ref else " |"),
             "|---|---|--:|--:|--:|--:|--:|" + ("--:|" if ref else "")]
    for r in report["real_rows"]:
        line = (f"| {r['name']} | {r['backend']} | {r['batch']} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
                f"{r['sentences_per_s']:.0f} | {r['speedup']:.2f}x ({r['speedup_min']:.2f}x) |")
        if ref:
            line += f" {r['speedup_vs_best_fp32']:.2f}x ({r['speedup_vs_best_fp32_min']:.2f}x) |"
        lines.append(line)
    return lines


def _header(report: dict[str, Any]) -> list[str]:
    """Bullet lines: machine, threads, versions, date, GEMM peak and how to read the table."""
    hw, cfg, packages = report["hardware"], report.get("config", {}), report["packages"]
    lines = [
        f"- CPU: {hw.get('cpu')} ({hw.get('arch')}{', ' + hw['generation'] if hw.get('generation') else ''}"
        f"{', ' + hw['core'] if hw.get('core') else ''}), "
        f"{hw.get('physical_cores')} physical / "
        f"{hw.get('logical_cores')} logical cores, {hw.get('usable_cores')} usable",
        f"- flags: {', '.join(hw.get('flags', [])) or 'none of interest'}",
        f"- threads: {report['threads']} intra-op, 1 inter-op; one process per model"
        + (f"; each point's passes in {cfg['bursts']} bursts, the models taking turns"
           + (f" (and on the real inputs, turns of {REAL_SLICE_S:g} s)" if cfg.get("lengths") else "")
           if (cfg.get("bursts") or 1) > 1 else ""),
        f"- torch {packages.get('torch', '?')}, transformers {packages.get('transformers', '?')}; {report['when']}",
        *peak_lines(report),
        f"- {cfg.get('warmup', '?')} warm-up + {cfg.get('repeats', '?')} timed passes per point, random token ids"
        + (f" (fewer, never below {MIN_PASSES}, where they passed {cfg['max_seconds']:g} s)" if cfg.get("max_seconds") else "")
        + (f", the whole measurement repeated {report['repeat_runs']} times (rows: median of the runs' medians)"
           if (report.get("repeat_runs") or 1) > 1 else "")
        + "; GFLOPs = encoder matmuls only; speed-up vs first = first model's p50 / this p50; % peak and x floor are "
        "against the measured peak of the precision the row's matrix multiplications ran in (x floor = p50 / "
        "(FLOPs / that peak))",
    ]
    lines.extend(f"- note: {note}" for note in report.get("notes") or ())
    if report.get("load_avg_1min") is not None:
        lines.append(f"- 1-minute load average before the run: {report['load_avg_1min']:.2f} on {hw.get('usable_cores')} cores")
    # Each row is against the peak of its own precision: clearly above it means that peak run was slowed.
    if any((r["pct_peak"] or 0) > 100 / BELOW_FLOOR for r in report["rows"]):
        lines.append(
            f"- note: some rows exceed the measured GEMM peak by more than {1 / BELOW_FLOOR - 1:.0%}, so the peak run was slowed "
            "(another busy process?); re-run on an idle machine"
        )
    return lines


def peak_lines(report: dict[str, Any]) -> list[str]:
    """The GEMM peaks: per precision, measured (best engine, every engine's figure) beside theoretical, and their ratio."""
    peaks, theory = report.get("peaks"), report.get("theoretical_peaks")
    if not peaks:
        return [f"- GEMM peak: {_fmt(report.get('peak_gflops'), '.1f')} GFLOP/s fp32"]
    lines = [f"- GEMM peaks (square n = {', '.join(map(str, peaks['sizes']))}; "
             f"theoretical: {(theory or {}).get('basis', 'not computed')}):", "",
             "  | precision | measured | best engine | every engine [kernels' ISA] | theoretical | measured / theoretical |",
             "  |---|--:|---|---|--:|--:|"]
    for precision in PRECISIONS:
        p = peaks[precision]
        engines = ", ".join(f"{name} {r['gflops']:.0f}{_isa(r.get('kernels'))}" if "gflops" in r else f"{name} n/a"
                            for name, r in p["engines"].items())
        bound = ((theory or {}).get(precision) or {}).get("gflops")
        ratio = f"{p['gflops'] / bound:.0%}" if bound and p["gflops"] else "n/a"
        lines.append(f"  | {precision} | {_fmt(p['gflops'], '.0f')} {p['unit']} | {p['best'] or 'no engine ran'} | "
                     f"{engines} | {_fmt(bound, '.0f')} | {ratio} |")
    lines.append("")
    lines.extend(f"- note: {note}" for note in report.get("peak_notes") or ())
    return lines


def _isa(kernels: dict[str, Any] | None) -> str:
    """`` [avx2]`` (`` [avx2, inferred]``) after an engine's figure: the ISA its kernels reported; empty when none."""
    if not kernels or not kernels.get("isa"):
        return ""
    return f" [{kernels['isa']}{'' if kernels.get('reported') else ', inferred'}]"


def write_report(report: dict[str, Any], out_dir: str | Path) -> Path:
    """Write ``latency.json`` and ``latency.md`` into ``out_dir`` (each atomically); the directory."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise CompressError(f"--out {out} exists and is not a directory; choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / REPORT_JSON, report)
    write_text_atomic(out / REPORT_MD, format_markdown(report))
    return out


def summarize(report: dict[str, Any], cfg: LatencyConfig, inputs: dict[str, Any]) -> tuple[str, list[str]]:
    """What ``compress latency`` prints: the Markdown table, and where the files went with ``--out``."""
    notes = [f"wrote {cfg.out}/{REPORT_JSON} and {cfg.out}/{REPORT_MD}"] if cfg.out else []
    return format_markdown(report), notes


def real_batches(cfg: LatencyConfig) -> list[int]:
    """The batch sizes the real inputs are timed at: 1 (one sentence at a time) and ``--lengths-batch``."""
    return list(dict.fromkeys((1, cfg.lengths_batch)))
