"""The latency worker: one process that loads one model and times it, or measures the GEMM peaks.

``compress.eval.latency.runs`` (the parent) spawns ``python -m compress.eval.latency.worker
--worker`` with the thread count fixed in its environment, writes a job as one JSON line
on its stdin and reads JSON lines back on its stdout (the protocol is described in
``compress.eval.latency.runs``). :class:`Timing` holds the model a backend
(``compress.eval.latency.backends``) loaded and times it point by point, all at once
(:func:`time_model`) or in bursts and real-input slices asked for one request at a time
(:func:`serve`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from compress.core.formats.artifacts import load_tokenizer
from compress.core.config import from_dict
from compress.core.errors import CompressError
from compress.core.model.structure import flops_per_sequence
from compress.core.data.tasks import Task, task_from_record
from compress.eval.latency.backends import BACKENDS
from compress.eval.latency.config import MAX_REAL_LENGTH, MIN_PASSES, LatencyConfig, check_seq, real_batches
from compress.eval.latency.lengths import RealInputs, RealTimer, more_passes, real_inputs
from compress.eval.latency.peak import PEAK_SECONDS, measure_peaks

# Seed for the random token ids, so every model sees the same inputs.
INPUT_SEED = 0


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



def worker_main(stdin, proto) -> int:
    """Run one job read from ``stdin``; write JSON lines to ``proto``; the exit status."""
    def emit(message: dict[str, Any]) -> None:
        proto.write(json.dumps(message) + "\n")
        proto.flush()

    try:
        job = json.loads(stdin.readline())  # one line (JSON has no raw newline); a served worker reads requests after it
        set_threads(int(job["threads"]))
        reads = task_from_record(job["lengths_task"]) if job.get("lengths_task") else None  # --lengths FILE's task
        if job["mode"] == "serve":
            serve(Path(job["model"]), job["config"], stdin, emit, reads)
        elif job["mode"] == "peak":
            peaks = measure_peaks(int(job["threads"]), tuple(job["sizes"]), job.get("min_seconds", PEAK_SECONDS))
            emit({"done": {"gflops": peaks["fp32"]["gflops"], "peaks": peaks}})
        else:
            emit({"done": time_model(Path(job["model"]), job["config"], emit, reads)})
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

    def __init__(self, model_dir: Path, config: dict[str, Any], reads: Task | None = None):
        self.model_dir = model_dir
        self.reads = reads  # the user's task whose data file --lengths is (the same for every model of the run)
        self.cfg = from_dict(LatencyConfig, config, "latency job")
        self.session = BACKENDS.get(self.cfg.backend)(model_dir, self.cfg)
        check_seq(self.cfg.seq, self.session.max_positions, model_dir)
        self.prepared: dict[tuple[int, int], Any] = {}
        self.shaped: dict[tuple[int, int], Callable[[Any], Any]] = {}  # forwards compiled for one point's shape
        self.seconds: dict[tuple[int, int], list[float]] = {}
        self.inputs: RealInputs | None = None  # the --lengths set, read at its first use
        self.real_timer: RealTimer | None = None  # the real-input batch size under way, timed in slices
        self.real: dict[str, dict[str, Any]] = {}  # batch size -> time_real's figures, once finished
        self.probed: dict[str, Any] | None = None  # what the kernels were, read once after the timing

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
                                          max_length=min(session.max_positions, MAX_REAL_LENGTH), task=self.reads)
            # With compile_for, one model per padded shape (compiled before timing, dropped after this batch size).
            self.real_timer = RealTimer(
                session.forward, self.inputs, batch, prepare=session.prepare, warmup=cfg.warmup, passes=cfg.lengths_passes,
                multiple=cfg.lengths_multiple if session.compile_for is not None else 1, forward_for=session.compile_for,
                min_seconds=cfg.min_seconds, max_seconds=cfg.max_seconds)
        if self.real_timer.advance(seconds, extra=extra):
            return True
        self.real[key] = self.real_timer.result()  # kept (and its compiled models) for extra slices until the next batch size
        return False

    def kernels(self) -> dict[str, Any] | None:
        """What the matrix multiplications ran on (``compress.eval.latency.kernels``): one more forward, after every timed one.

        It runs the forward last compiled (a static OpenVINO shape) where its inputs are still prepared, else the
        any-shape one, on a grid point's inputs; None before any point was timed.
        """
        if self.probed is None and self.session.kernels is not None and self.prepared:
            point = next((p for p in self.shaped if p in self.prepared), next(iter(self.prepared)))
            forward, prepared = self.shaped.get(point, self.session.forward), self.prepared[point]
            self.probed = self.session.kernels(lambda: forward(prepared))
        return self.probed

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
            "kernels": self.kernels(),
            "backend": session.backend or cfg.backend,
            "note": session.note,
            "params": session.params,
            # JSON keys are strings; FLOPs per sequence of the whole encoder.
            "flops": {str(s): flops_per_sequence(session.structure, s) for s in cfg.seq},
        }


def time_model(model_dir: Path, config: dict[str, Any], emit: Callable[[dict], None],
               reads: Task | None = None) -> dict[str, Any]:
    """Load one model with the configured backend and time it at every grid point."""
    timing = Timing(model_dir, config, reads)
    for batch, seq in timing.cfg.grid():
        timing.burst(batch, seq, timing.cfg.repeats, timing.cfg.min_seconds)
        emit({"point": {"batch": batch, "seq": seq}})
    return timing.result()


def serve(model_dir: Path, config: dict[str, Any], stdin, emit: Callable[[dict], None], reads: Task | None = None) -> None:
    """Load the model, say so, then answer each request line (a burst, or finish) until finished or stdin ends."""
    timing = Timing(model_dir, config, reads)
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


def _worker_entry() -> int:
    # The protocol owns the real stdout; anything a library prints (even from C) goes to stderr.
    proto = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return worker_main(sys.stdin, proto)


if __name__ == "__main__":
    if sys.argv[1:] != ["--worker"]:
        sys.exit("compress.eval.latency.worker is internal (python -m compress.eval.latency.worker --worker reads a job on stdin); "
                 "use `compress latency`")
    sys.exit(_worker_entry())
