"""CPU latency of model directories, each timed in its own process, against a measured GEMM peak.

``measure_latency(model_dirs, cfg)`` times every model at every (batch, seq) of the grid
and returns a report dict; ``format_markdown(report)`` renders it as one table and
``write_report(report, out_dir)`` writes ``latency.json`` + ``latency.md``.

Why one process per model: thread pools (torch's OpenMP pool, ONNX Runtime's own pool)
persist for the life of a process and fight each other on a 2-core machine, and a
model's allocations and caches would warm the next model's run. So the parent never
times anything; it spawns ``python -m compress.eval.latency --worker`` once for the GEMM peak
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

A latency backend (``BACKENDS``) loads one model directory into a :class:`Session`
(``prepare`` a batch, ``forward`` it once), which :class:`Timing` times point by point. ``auto`` (the
default) picks by the directory's format: ``torch`` (fp32 eager), ``torch-int8``
(dynamic int8 Linears), ``onnxruntime`` (an ONNX directory, or an fp32 PyTorch one
exported inside the worker), ``inc`` (Neural Compressor PT2E, inductor-compiled),
``openvino`` (an OpenVINO IR, or an fp32 PyTorch / ONNX directory converted inside the
worker; f32, PERFORMANCE_HINT=LATENCY; compiled once more for each grid point's fixed
shape, and for each padded shape of the real inputs, unless ``--openvino-shapes dynamic``);
``torch-bf16`` casts an fp32 model to bfloat16 and ``openvino-bf16`` asks OpenVINO for
bf16. All load through ``compress.core.runtime``, as evaluation does; each row names the
backend that ran, and an OpenVINO row's note the precision the compiled model reports.
ONNX Runtime and OpenVINO rows time the runtime's own call on numpy feeds built before
timing (``NumpyRunner.feeds`` / ``call``): no tensor conversion or transformers output
object inside the timed region, which at batch 1 on short sentences was up to a tenth of
a small model's time (bench/results/2026-11-27/call-overhead).
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
from typing import Any, Callable

import numpy as np
import torch

from compress.core.artifacts import (
    append_metrics,
    load_tokenizer,
    artifact_format,
    check_writable,
    is_quantized,
    load_config,
    require_model_dir,
    saved_head,
    utc_now,
    write_json_atomic,
    write_text_atomic,
)
from compress.core.config import from_dict, option
from compress.core.errors import CompressError
from compress.core.export import export_onnx
from compress.core.hardware import cpu_info, hardware, package_versions
from compress.core.logs import progress
from compress.core.openvino import OPENVINO, OPENVINO_PRECISION, OpenVINORunner, export_openvino, layer_precisions
from compress.core.registry import Registry
from compress.core.runtime import NumpyRunner, load_model, parameter_count, structure_of
from compress.core.structure import count_parameters, describe, flops_per_sequence, model_inputs
from compress.eval.lengths import RealInputs, RealTimer, more_passes, real_inputs
from compress.eval.peak import PRECISIONS, cpu_theoretical_peaks, floor_ms, measure_peaks, peak_notes, precision_of_backend

log = logging.getLogger(__name__)

REPORT_JSON = "latency.json"
REPORT_MD = "latency.md"

# File names that hold weights, for the size column (config and tokenizer files are noise).
WEIGHT_SUFFIXES = (".safetensors", ".onnx", ".onnx_data", ".onnx.data", ".bin", ".pt2")

# Square matmuls for the GEMM peaks (compress.eval.peak: every engine, fp32 / bf16 / int8):
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

# Seed for the random token ids, so every model sees the same inputs.
INPUT_SEED = 0


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
                                  "--lengths-multiple), as a deployment padding to a few lengths would (faster for small "
                                  "models); dynamic compiles it once for any shape", choices=OPENVINO_SHAPES)
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
    lengths: str | None = option(None, "also time on real inputs at their own lengths: a TASK's dev set (with --data-dir) or a "
                                 "FILE of texts (.txt lines, .tsv/.jsonl with sentence or sentence1/sentence2): batch 1 one "
                                 "sentence at a time, and --lengths-batch sorted by length with dynamic padding",
                                 metavar="TASK|FILE")
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


# ---------------------------------------------------------------------------- backends


@dataclass
class Session:
    """One model loaded by a backend, ready to be timed on any batch.

    A batch is a dict of int64 numpy arrays of shape (batch, seq): ``input_ids``,
    ``attention_mask``, ``token_type_ids``. ``prepare`` turns it into what ``forward``
    takes (tensors or a runtime's feeds, the family's inputs only), outside the timed region; ``forward``
    runs the model once. ``compile_for``, where a backend has it, returns a forward
    compiled for one fixed (batch, seq) only: a grid point of that shape, and real inputs
    padded to that shape, use it instead of ``forward``.
    """

    prepare: Callable[[dict[str, np.ndarray]], Any]
    forward: Callable[[Any], Any]
    vocab_size: int
    params: int  # distinct parameters
    structure: dict[str, Any]  # compress.core.structure dict, for the FLOP count
    max_positions: int  # longest sequence the model accepts
    backend: str = ""  # the backend that ran, as rows name it (e.g. onnxruntime-int8)
    note: str | None = None  # a caveat for the report (e.g. bf16 without native support)
    compile_for: Callable[[tuple[int, int]], Callable[[Any], Any]] | None = None


# A backend: (model_dir, cfg) -> Session, called inside a worker process after the
# thread count is fixed; it may import its runtime (torch, onnxruntime) freely.
BACKENDS: Registry[Callable[[Path, LatencyConfig], Session]] = Registry("latency backend")


@BACKENDS.register("torch")
def torch_fp32(model_dir: Path, cfg: LatencyConfig) -> Session:
    """PyTorch eager fp32 with the directory's saved head, under ``torch.inference_mode``."""
    require_format(model_dir, "torch", "torch")
    model = load_model(model_dir)  # eval mode, fp32, pruned shapes rebuilt
    return runtime_session(model, model_dir, cfg, "torch", counted=model)


# The backend ``auto`` picks for each directory format (compression.json "format").
AUTO_BACKENDS = {"torch": "torch", "torch-int8-dynamic": "torch-int8", "onnx": "onnxruntime", "inc-pt2e": "inc",
                 OPENVINO: "openvino"}


@BACKENDS.register("auto")
def auto(model_dir: Path, cfg: LatencyConfig) -> Session:
    """The backend for the directory's format: torch, torch-int8, onnxruntime or inc."""
    fmt = artifact_format(model_dir)
    if fmt not in AUTO_BACKENDS:
        raise CompressError(f"{model_dir} has format {fmt!r}, which no latency backend runs; valid: {', '.join(AUTO_BACKENDS)}")
    return BACKENDS.get(AUTO_BACKENDS[fmt])(model_dir, cfg)


def require_format(model_dir: Path, fmt: str, backend: str) -> None:
    """Refuse a directory whose format the backend does not run (e.g. --backend torch on ONNX)."""
    found = artifact_format(model_dir)
    if found != fmt:
        raise CompressError(f"the {backend} latency backend runs {fmt} directories; {model_dir} is {found} (use --backend auto)")


def runtime_session(model, model_dir: Path, cfg: LatencyConfig, backend: str, note: str | None = None,
                    counted=None, structure: dict[str, Any] | None = None) -> Session:
    """A Session timing any model from ``compress.core.runtime`` (HF call convention, torch tensors in).

    ``counted``: an fp32 torch model to count parameters and shapes on; otherwise they come
    from the directory (an int8 file has no fp32 tensors to count). ``structure``: that of
    the graph the worker converted the directory to, which is what runs (a classifier's
    last layer computes the first token only), so FLOPs are counted from it.
    """
    config = model.config

    def prepare(batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        return model_inputs(model, {k: torch.from_numpy(v) for k, v in batch.items()})  # those the family takes

    if counted is not None:
        params, structure = count_parameters(counted), describe(counted)
    else:
        params, structure = parameter_count(model_dir), structure or structure_of(model_dir)
    if isinstance(model, NumpyRunner):  # ONNX Runtime, OpenVINO: time the runtime's call on feeds built beforehand
        prepare, forward = model.feeds, model.call
    else:
        forward = forward_of(model)
    return Session(prepare, forward, config.vocab_size, params, structure, config.max_position_embeddings, backend, note)


def forward_of(model) -> Callable[[dict[str, torch.Tensor]], Any]:
    """One call of ``model`` on prepared inputs, without autograd."""
    def forward(inputs: dict[str, torch.Tensor]):
        with torch.inference_mode():
            return model(**inputs)
    return forward


@BACKENDS.register("torch-int8")
def torch_int8(model_dir: Path, cfg: LatencyConfig) -> Session:
    """PyTorch eager with the directory's dynamic int8 Linears (``compress quantize --backend torch``)."""
    require_format(model_dir, "torch-int8-dynamic", "torch-int8")
    return runtime_session(load_model(model_dir), model_dir, cfg, "torch-int8")


@BACKENDS.register("torch-bf16")
def torch_bf16(model_dir: Path, cfg: LatencyConfig) -> Session:
    """PyTorch eager after ``model.to(torch.bfloat16)`` of an fp32 directory."""

    require_format(model_dir, "torch", "torch-bf16")
    model = load_model(model_dir).to(torch.bfloat16)
    note = None
    if not {"avx512_bf16", "amx_bf16"} & set(cpu_info()["flags"]):
        note = "torch-bf16: this CPU has no avx512_bf16/amx_bf16, so bf16 matmuls are emulated (usually slower than fp32)"
    return runtime_session(model, model_dir, cfg, "torch-bf16", note)


@BACKENDS.register("onnxruntime")
def onnxruntime_session(model_dir: Path, cfg: LatencyConfig) -> Session:
    """An ONNX Runtime session (ORT_ENABLE_ALL); an fp32 PyTorch directory is exported first, in this worker."""
    fmt = artifact_format(model_dir)
    if fmt == "onnx":
        model, structure = load_model(model_dir, threads=cfg.threads), None
    elif fmt == "torch":
        with tempfile.TemporaryDirectory(prefix="compress-onnx-") as tmp:
            # The session reads the whole graph at load, so the export can go right after.
            exported = export_onnx(model_dir, Path(tmp) / "onnx")
            model, structure = load_model(exported, threads=cfg.threads), structure_of(exported)
    else:
        raise CompressError(f"the onnxruntime latency backend runs ONNX or fp32 PyTorch directories; {model_dir} is {fmt} (use --backend auto)")
    return runtime_session(model, model_dir, cfg, "onnxruntime-int8" if is_quantized(model_dir) else "onnxruntime",
                           structure=structure)


@BACKENDS.register("inc")
def inc_session(model_dir: Path, cfg: LatencyConfig) -> Session:
    """A Neural Compressor PT2E int8 program, compiled by inductor with freezing (first call per shape)."""
    require_format(model_dir, "inc-pt2e", "inc")
    return runtime_session(load_model(model_dir), model_dir, cfg, "inc-int8")


@BACKENDS.register("openvino")
def openvino_session(model_dir: Path, cfg: LatencyConfig, precision: str = OPENVINO_PRECISION) -> Session:
    """An OpenVINO compiled model (the worker's threads, PERFORMANCE_HINT=LATENCY, f32 unless ``precision``).

    An fp32 PyTorch or ONNX directory is converted first, in this worker. The row's backend
    names int8 and any precision other than f32 (``openvino-int8``, ``openvino-bf16``); its
    note gives the precision the compiled model reports and what its matrix multiplications run in.
    """
    fmt = artifact_format(model_dir)
    name = "openvino" if precision == OPENVINO_PRECISION else f"openvino-{precision}"
    if fmt not in (OPENVINO, "torch", "onnx"):
        raise CompressError(f"the {name} latency backend runs OpenVINO, ONNX or fp32 PyTorch directories; {model_dir} is {fmt} "
                            "(use --backend auto)")
    # A converted IR lives as long as the worker (a temporary folder, removed at exit): shapes are compiled from it on demand.
    tmp = None if fmt == OPENVINO else tempfile.TemporaryDirectory(prefix="compress-openvino-")
    ir = model_dir if tmp is None else export_openvino(model_dir, Path(tmp.name) / "openvino")
    config, head = load_config(ir), saved_head(ir)
    model = OpenVINORunner(ir, config, head, threads=cfg.threads, precision=precision)  # any shape
    ran = layer_precisions(model.compiled)
    backend = "openvino" + ("-int8" if is_quantized(model_dir) else "") + ("" if model.precision == "f32" else f"-{model.precision}")
    static = cfg.openvino_shapes == "static"
    note = (f"{model_dir.name}: OpenVINO inference precision {model.precision} (asked: {precision}); matrix multiplications in "
            + ", ".join(f"{kind} x{count}" for kind, count in sorted(ran.items()))
            + ("; compiled for each grid point's fixed [batch, seq]" if static else "; compiled for any shape")
            + (f", real inputs padded to a multiple of {cfg.lengths_multiple} tokens, compiled per padded shape"
               if static and cfg.lengths else ""))
    session = runtime_session(model, model_dir, cfg, backend, note, structure=structure_of(ir))

    def compile_for(shape: tuple[int, int], _keep=tmp) -> Callable[[Any], Any]:
        return OpenVINORunner(ir, config, head, threads=cfg.threads, precision=precision, shape=shape).call

    if static:
        session.compile_for = compile_for
    return session


@BACKENDS.register("openvino-bf16")
def openvino_bf16_session(model_dir: Path, cfg: LatencyConfig) -> Session:
    """The ``openvino`` backend with INFERENCE_PRECISION_HINT=bf16 (what the CPU plugin picks by itself where bf16 exists)."""
    return openvino_session(model_dir, cfg, precision="bf16")


def random_input_ids(vocab_size: int, batch: int, seq: int):
    """Token ids in [1, vocab) of shape (batch, seq), int64; 0 is [PAD] in BERT vocabularies."""
    rng = np.random.default_rng(INPUT_SEED)
    return rng.integers(1, max(vocab_size, 2), size=(batch, seq), dtype=np.int64)


def random_batch(vocab_size: int, batch: int, seq: int) -> dict[str, np.ndarray]:
    """A full (unpadded) batch of random ids: every model of a report sees the same one."""
    return {
        "input_ids": random_input_ids(vocab_size, batch, seq),
        "attention_mask": np.ones((batch, seq), dtype=np.int64),
        "token_type_ids": np.zeros((batch, seq), dtype=np.int64),
    }


def time_calls(fn: Callable[[], Any], cfg: LatencyConfig) -> list[float]:
    """Seconds of each timed call of ``fn``, after ``cfg.warmup`` untimed ones."""
    for _ in range(cfg.warmup):
        fn()
    times: list[float] = []
    spent = 0.0  # sum(times), kept as it grows: a 0.1 ms model makes 20,000 calls in 2 s
    while more_passes(len(times), spent, passes=cfg.repeats, min_seconds=cfg.min_seconds, max_seconds=cfg.max_seconds,
                      keep=MIN_PASSES):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
        spent += times[-1]
    return times


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
    for path in paths:
        precheck(path, cfg)  # every cheap failure before minutes of timing
    if cfg.out:
        check_writable(cfg.out, "--out", "choose another --out")
    if cfg.record:
        for path in paths:
            check_writable(path, "results (metrics.json)", "pass --no-record, or copy the model somewhere writable")
    threads = cfg.threads or default_threads()
    names = display_names(paths)

    peaks, results, references = run_all(paths, names, cfg, threads)
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
    paths: list[Path], names: list[str], cfg: LatencyConfig, threads: int
) -> tuple[dict[str, Any] | None, list[list[dict[str, Any]]], dict[str, list[dict[str, Any]]]]:
    """The GEMM peaks (:func:`best_peaks`, or None), each model's worker result per run, and the reference's per
    fp32 backend per run.

    A run is the whole sequence (peak, every model, the reference on each backend), one
    process after another; runs repeat it, so a load change hits every model alike and
    shows as spread instead of as one model's speed-up.
    """
    jobs = [(name, {"mode": "model", "model": str(path), "config": worker_config(cfg, threads)})
            for path, name in zip(paths, names)]
    # The first model's own job already times it on the backend its format picks: that one is not timed twice.
    own = _own_backend(paths[0], cfg)
    shared = [b for b in cfg.reference_backends if b == own]
    jobs += [(f"{names[0]} [{b}]", {"mode": "model", "model": str(paths[0]),
                                    "config": {**worker_config(cfg, threads), "backend": b}, "reference": b})
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


def precheck(path: Path, cfg: LatencyConfig) -> None:
    """Fail before spawning anything on a missing directory or a too-long sequence."""
    require_model_dir(path)
    config = load_config(path)  # config.json only: no torch, no weights
    check_seq(cfg.seq, config.max_position_embeddings, path)
    if cfg.lengths:  # a wrong task, file or data folder is said now, not after minutes of timing
        real_inputs(cfg.lengths, load_tokenizer(path), data_dir=cfg.data_dir, limit=1)


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
            floor = floor_ms(flops * batch, peak) if peak else None
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
                "pct_peak": 100.0 * achieved / peak if peak else None,
                # FLOPs at the peak of its precision: what no engine measured here could beat
                "floor_ms": floor if peak else None,
                "x_floor": stats["p50_ms"] / floor if peak else None,
                **({"note": result["note"]} if result.get("note") else {}),  # e.g. OpenVINO's inference precision
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
            "hardware": {"cpu": cpu["cpu"], "physical_cores": cpu["physical_cores"], "flags": cpu["flags"]},
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
    cmd = [sys.executable, "-m", "compress.eval.latency", "--worker"]
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
        self.proc = subprocess.Popen([sys.executable, "-m", "compress.eval.latency", "--worker"], stdin=subprocess.PIPE,
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
    if ref:
        lines += ["", f"Reference: {ref['model']} in fp32 on " + "; ".join(
            f"{b} " + ", ".join(f"{k} {v:.2f} ms" for k, v in points.items()) for b, points in ref["p50_ms"].items())
            + " (median p50 over runs); 'vs best fp32' divides its fastest backend's p50 by the row's."]
    if report.get("real_rows"):
        lines += ["", *format_real(report)]
    return "\n".join(lines) + "\n"


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
    peak, sizes = report.get("peak_gflops"), ", ".join(map(str, report.get("peak_sizes") or ()))
    lines = [
        f"- CPU: {hw.get('cpu')} ({hw.get('arch')}{', ' + hw['generation'] if hw.get('generation') else ''}), "
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
    """The measured GEMM peaks (best engine per precision, every engine's figure) and the paper ones."""
    peaks, theory = report.get("peaks"), report.get("theoretical_peaks")
    if not peaks:
        return [f"- GEMM peak: {_fmt(report.get('peak_gflops'), '.1f')} GFLOP/s fp32"]
    lines = []
    for precision in PRECISIONS:
        p = peaks[precision]
        engines = ", ".join(f"{name} {r['gflops']:.0f}" if "gflops" in r else f"{name} n/a"
                            for name, r in p["engines"].items())
        bound = ((theory or {}).get(precision) or {}).get("gflops")
        lines.append(f"- {precision} GEMM peak: {_fmt(p['gflops'], '.0f')} {p['unit']} ({p['best'] or 'no engine ran'}; "
                     f"{engines}; square n = {', '.join(map(str, peaks['sizes']))})"
                     + (f"; theoretical {bound:.0f}" if bound else ""))
    if theory:
        lines.append(f"- theoretical peaks: {theory.get('basis', '')}")
    lines.extend(f"- note: {note}" for note in report.get("peak_notes") or ())
    return lines


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


# ---------------------------------------------------------------------------- the worker side


def worker_main(stdin, proto) -> int:
    """Run one job read from ``stdin``; write JSON lines to ``proto``; the exit status."""
    def emit(message: dict[str, Any]) -> None:
        proto.write(json.dumps(message) + "\n")
        proto.flush()

    try:
        job = json.loads(stdin.readline())  # one line (JSON has no raw newline); a served worker reads requests after it
        set_threads(int(job["threads"]))
        if job["mode"] == "serve":
            serve(Path(job["model"]), job["config"], stdin, emit)
        elif job["mode"] == "peak":
            peaks = measure_peaks(int(job["threads"]), tuple(job["sizes"]), job.get("min_seconds", PEAK_SECONDS))
            emit({"done": {"gflops": peaks["fp32"]["gflops"], "peaks": peaks}})
        else:
            emit({"done": time_model(Path(job["model"]), job["config"], emit)})
    except CompressError as err:
        emit({"error": str(err)})
        return 2
    return 0


def set_threads(threads: int) -> None:
    """Fix the thread counts: env vars first (read when torch loads), then torch's own setters."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(threads)

    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)  # one forward at a time: no inter-op parallelism
    except RuntimeError:  # already set (only possible when torch was used before)
        pass


class Timing:
    """One model loaded with the configured backend, timed point by point: all at once or in bursts."""

    def __init__(self, model_dir: Path, config: dict[str, Any]):
        self.model_dir = model_dir
        self.cfg = from_dict(LatencyConfig, config, "latency job")
        self.session = BACKENDS.get(self.cfg.backend)(model_dir, self.cfg)
        check_seq(self.cfg.seq, self.session.max_positions, model_dir)
        self.prepared: dict[tuple[int, int], Any] = {}
        self.shaped: dict[tuple[int, int], Callable[[Any], Any]] = {}  # forwards compiled for one point's shape
        self.seconds: dict[tuple[int, int], list[float]] = {}
        self.inputs: RealInputs | None = None  # the --lengths set, read at its first use
        self.real_timer: RealTimer | None = None  # the real-input batch size under way, timed in slices
        self.real: dict[str, dict[str, Any]] = {}  # batch size -> time_real's figures, once finished

    def burst(self, batch: int, seq: int, passes: int, min_seconds: float = 0.0) -> list[float]:
        """Seconds of ``passes`` timed forwards at (batch, seq); the point's first burst warms up first."""
        first = (batch, seq) not in self.prepared
        if self.session.compile_for is not None and (batch, seq) not in self.shaped:
            # One compiled model at a time: each holds its own packed weights (0.8 GB for the BERT-base shape at
            # batch 32), and with --bursts every model's worker is alive at once.
            self.shaped = {(batch, seq): self.session.compile_for((batch, seq))}
        forward = self.shaped.get((batch, seq), self.session.forward)
        if first:
            self.prepared[batch, seq] = self.session.prepare(random_batch(self.session.vocab_size, batch, seq))
            forward(self.prepared[batch, seq])  # untimed, beyond warm-up: inc compiles for this shape here
        cfg = dataclasses.replace(self.cfg, repeats=passes, min_seconds=min_seconds, warmup=self.cfg.warmup if first else 0,
                                  max_seconds=self.cfg.max_seconds / self.cfg.bursts)  # a point's cap, shared by its bursts
        prepared = self.prepared[batch, seq]
        times = time_calls(lambda: forward(prepared), cfg)
        self.seconds.setdefault((batch, seq), []).extend(times)
        return times

    def real_slice(self, batch: int, seconds: float = float("inf"), extra: bool = False) -> bool:
        """Time the real inputs at ``batch`` for a slice of ``seconds`` (see :class:`RealTimer`); whether more remain.

        One batch size is under way at a time, and only its compiled models are kept: asking
        for another drops an unfinished one (it starts again when asked for). ``extra``: once its
        passes are done, time more in this slice (:meth:`RealTimer.advance`); the figures then
        count every whole pass.
        """
        key = str(batch)
        timer = self.real_timer if self.real_timer is not None and self.real_timer.batch == batch else None
        if key in self.real and (timer is None or not extra):
            return False
        cfg, session = self.cfg, self.session
        if timer is None:
            self.shaped, self.real_timer = {}, None  # the grid's compiled models, or another batch size's: done with
            if self.inputs is None:
                self.inputs = real_inputs(cfg.lengths, load_tokenizer(self.model_dir), data_dir=cfg.data_dir,
                                          max_length=min(session.max_positions, MAX_REAL_LENGTH))
            # With compile_for, one model per padded shape (compiled before timing, dropped after this batch size).
            self.real_timer = RealTimer(
                session.forward, self.inputs, batch, prepare=session.prepare, warmup=cfg.warmup, passes=cfg.lengths_passes,
                multiple=cfg.lengths_multiple if session.compile_for is not None else 1, forward_for=session.compile_for,
                min_seconds=cfg.min_seconds, max_seconds=cfg.max_seconds)
        if self.real_timer.advance(seconds, extra=extra):
            return True
        self.real[key] = self.real_timer.result()  # kept (and its compiled models) for extra slices until the next batch size
        return False

    def result(self) -> dict[str, Any]:
        """The points timed so far (passes pooled per point), real-length timings when asked, and what ran.

        Real-input batch sizes not yet timed in slices are timed here, in one go.
        """
        cfg, session = self.cfg, self.session
        real = None
        if cfg.lengths:
            for batch in real_batches(cfg):
                while self.real_slice(batch):
                    pass
            real = {"inputs": self.inputs.stats(), "batches": {str(b): self.real[str(b)] for b in real_batches(cfg)},
                    "flops_per_sentence": float(np.mean([flops_per_sequence(session.structure, int(n))
                                                         for n in self.inputs.lengths]))}
        return {
            "points": [{"batch": b, "seq": s, "seconds": self.seconds[b, s]} for b, s in cfg.grid() if (b, s) in self.seconds],
            **({"real": real} if real else {}),
            "backend": session.backend or cfg.backend,
            "note": session.note,
            "params": session.params,
            # JSON keys are strings; FLOPs per sequence of the whole encoder.
            "flops": {str(s): flops_per_sequence(session.structure, s) for s in cfg.seq},
        }


def time_model(model_dir: Path, config: dict[str, Any], emit: Callable[[dict], None]) -> dict[str, Any]:
    """Load one model with the configured backend and time it at every grid point."""
    timing = Timing(model_dir, config)
    for batch, seq in timing.cfg.grid():
        timing.burst(batch, seq, timing.cfg.repeats, timing.cfg.min_seconds)
        emit({"point": {"batch": batch, "seq": seq}})
    return timing.result()


def serve(model_dir: Path, config: dict[str, Any], stdin, emit: Callable[[dict], None]) -> None:
    """Load the model, say so, then answer each request line (a burst, or finish) until finished or stdin ends."""
    timing = Timing(model_dir, config)
    emit({"ready": True})
    for line in stdin:
        request = json.loads(line)
        if "burst" in request:
            batch, seq, passes, min_seconds = request["burst"]
            emit({"seconds": timing.burst(int(batch), int(seq), int(passes), float(min_seconds))})
        elif "real" in request:
            batch, seconds, extra = request["real"]
            emit({"more": timing.real_slice(int(batch), float(seconds), bool(extra))})
        elif request.get("finish"):
            emit({"done": timing.result()})
            return


def real_batches(cfg: LatencyConfig) -> list[int]:
    """The batch sizes the real inputs are timed at: 1 (one sentence at a time) and ``--lengths-batch``."""
    return list(dict.fromkeys((1, cfg.lengths_batch)))


def _worker_entry() -> int:
    # The protocol owns the real stdout; anything a library prints (even from C) goes to stderr.
    proto = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return worker_main(sys.stdin, proto)


if __name__ == "__main__":
    if sys.argv[1:] != ["--worker"]:
        sys.exit("compress.eval.latency is internal (python -m compress.eval.latency --worker reads a job on stdin); use `compress latency`")
    sys.exit(_worker_entry())
