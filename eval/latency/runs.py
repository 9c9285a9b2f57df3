"""CPU latency of model directories, each timed in its own process, against a measured GEMM peak: the parent.

``measure_latency(model_dirs, cfg)`` times every model at every (batch, seq) of the grid
and returns a report dict whose ``rows`` and ``real_rows`` are :class:`~compress.eval.latency.row.Row` and
:class:`~compress.eval.latency.row.RealRow` records; ``compress.eval.latency.report.format_markdown(report)`` renders
it as one table and ``compress.eval.latency.report.write_report(report, out_dir)`` writes
``latency.json`` (:func:`compress.eval.latency.report.report_record`: the rows as their dicts) + ``latency.md``.

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

The modules: this one is the parent (the runs: the worker processes, one after another or
in bursts); ``compress.eval.latency.config`` holds :class:`LatencyConfig` and the limits the
parent, the worker and the report share; ``compress.eval.latency.rows`` builds the rows from
the workers' results; ``compress.eval.latency.report`` renders and writes the report;
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
from pathlib import Path
from typing import Any

from compress.core.data.tasks import Task
from compress.core.errors import CompressError
from compress.core.formats.artifacts import artifact_format, load_config, load_tokenizer
from compress.core.formats.records import utc_now
from compress.core.formats.writes import check_writable
from compress.core.formats.static import STATIC, max_length_of, static_config
from compress.core.hardware import cpu_info, hardware, package_versions
from compress.core.logs import progress
from compress.core.model.structure import config_sizes
from compress.core.preflight import require_model_dir
from compress.eval.latency.backends import AUTO_BACKENDS
from compress.eval.latency.config import REAL_SLICE_S, LatencyConfig, check_seq, real_batches
from compress.eval.latency.lengths import lengths_task, real_inputs
from compress.eval.latency.peak import PEAK_SIZES, PRECISIONS, cpu_theoretical_peaks, peak_notes
from compress.eval.latency.report import write_report
from compress.eval.latency.rows import (
    best_peaks,
    build_real_rows,
    build_rows,
    display_names,
    record_metrics,
    reference_summary,
)
from compress.eval.latency.row import Stats

log = logging.getLogger(__name__)

# How the parent starts a worker process (compress.eval.latency.worker).
WORKER_COMMAND = [sys.executable, "-m", "compress.eval.latency.worker", "--worker"]

# Between two bursts: time for the last worker's thread pool to stop spinning before the next one times.
BURST_PAUSE_S = 0.05


def default_threads() -> int:
    """Usable physical cores: hyper-threads only slow dense matmuls down."""
    info = cpu_info()
    return max(1, min(info["physical_cores"], info["usable_cores"]))


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
        "backend": ", ".join(dict.fromkeys(r.backend for r in rows)),
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
                p50 = Stats.of(first["seconds"]).p50_ms
                log.info(f"{name}: p50 {p50:.2f} ms at batch {first['batch']} seq {first['seq']}{tag}")
            for b in shared:
                references[b].append(results[0][-1])
    return best_peaks(peaks), results, references


def _own_backend(path: Path, cfg: LatencyConfig) -> str:
    """The backend a model's own job runs on: ``cfg.backend``, or for ``auto`` the one its format picks."""
    if cfg.backend != "auto":
        return cfg.backend
    return AUTO_BACKENDS.get(artifact_format(path), "")


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


def worker_env(threads: int) -> dict[str, str]:
    """The environment of a worker: thread counts fixed before torch loads, this checkout importable."""
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(threads)
    env["TOKENIZERS_PARALLELISM"] = "false"
    root = str(Path(__file__).resolve().parents[2])  # the repository root, so the worker runs this very code
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
