"""The records of a latency report: one model at one grid point (:class:`Row`), its four statistics
(:class:`Stats`), and one model on the real inputs at one batch size (:class:`RealRow`).

Each is frozen and knows its file format: ``to_dict()`` is the dict ``latency.json`` and ``metrics.json`` hold (the
same keys in the same order; an optional key left out exactly where the report leaves it out) and ``from_dict()``
reads one back. A file an earlier version wrote still reads: a key it did not write yet reads as its field's
default (None), and ``metrics.json``'s rows leave out the model and its name (the file is the model's own).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from compress.core.errors import CompressError

# Keys the report leaves out (rather than writing null) when there is nothing to say: a note only where the backend
# made one, the reference's columns only with --reference-backends (and the PyTorch one only with torch among them).
_LEFT_OUT = frozenset({"note", "best_fp32_backend", "speedup_vs_best_fp32", "speedup_vs_best_fp32_min", "speedup_vs_torch"})


@dataclass(frozen=True)
class Stats:
    """p50 / p90 / p99 / mean of a model's timed passes at one point, in milliseconds."""

    p50_ms: float  # the median pass
    p90_ms: float  # the 90th percentile
    p99_ms: float  # the 99th percentile
    mean_ms: float  # the mean pass

    @classmethod
    def of(cls, seconds: list[float]) -> "Stats":
        """The statistics of the timed passes (``seconds`` each)."""
        ms = np.asarray(seconds, dtype=np.float64) * 1e3
        p50, p90, p99 = np.percentile(ms, [50, 90, 99])
        return cls(float(p50), float(p90), float(p99), float(ms.mean()))

    def to_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Stats":
        return cls(data["p50_ms"], data["p90_ms"], data["p99_ms"], data["mean_ms"])


@dataclass(frozen=True, kw_only=True)
class Row:
    """One model at one (batch, seq) of the grid: the median over runs of each run's statistics, size, FLOPs against
    the peak of its precision, and speed-ups (built by :func:`compress.eval.latency.rows.build_rows`)."""

    model: str = ""  # the model folder as given ("" in metrics.json's rows: the file is the model's own)
    name: str = ""  # its name in the tables: the folder's (with its parent's where two would collide)
    backend: str = ""  # the backend that ran it, e.g. "torch" or "onnxruntime-int8"
    precision: str | None = None  # what its matrix multiplications ran in: fp32, bf16, fp16 or int8
    batch: int  # sequences per forward pass
    seq: int  # tokens per sequence
    p50_ms: float  # the median over runs of each run's median pass
    p90_ms: float | None = None  # the same of each run's 90th percentile
    p99_ms: float | None = None  # the same of each run's 99th percentile
    mean_ms: float | None = None  # the same of each run's mean pass
    runs_p50_ms: tuple[float, ...] = ()  # each run's p50, in run order
    slowest_run: Stats | None = None  # each statistic in its slowest run: a budget holds only if it holds there too
    spread_pct: float | None = None  # (slowest - fastest run's p50) / the median, in %
    throughput: float | None = None  # sequences per second at the median
    params: int | None = None  # the model's parameters
    size_mb: float | None = None  # its weight files on disk, in MB (10^6 bytes)
    gflops_per_seq: float | None = None  # encoder matmul GFLOPs per sequence (0: a static model, which has none)
    achieved_gflops: float | None = None  # GFLOP/s at the median
    pct_peak: float | None = None  # that as % of the measured peak of its precision (None: no peak, or no FLOPs)
    floor_ms: float | None = None  # its FLOPs at that peak: what no engine measured here could beat
    x_floor: float | None = None  # p50 / floor_ms
    note: str | None = None  # the backend's note, e.g. OpenVINO's inference precision (left out when none)
    kernels: Mapping[str, Any] | None = None  # what its matmuls ran on, as the library reports (latency.kernels)
    speedup: float | None = None  # the first model's p50 over this one's, at the same point
    speedup_min: float | None = None  # that ratio in the worst run
    best_fp32_backend: str | None = None  # the first model's fastest fp32 reference backend at this point
    speedup_vs_best_fp32: float | None = None  # its p50 there over this one's
    speedup_vs_best_fp32_min: float | None = None  # that ratio in the worst run
    speedup_vs_torch: float | None = None  # the first model's p50 in PyTorch eager over this one's

    @property
    def point(self) -> tuple[int, int]:
        """(batch, seq)."""
        return self.batch, self.seq

    def to_dict(self) -> dict[str, Any]:
        """The row as ``latency.json`` holds it."""
        return _to_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Row":
        """A row from ``latency.json`` or ``metrics.json``; it needs ``batch``, ``seq`` and ``p50_ms``."""
        return _from_dict(cls, data, ("batch", "seq", "p50_ms"))


@dataclass(frozen=True, kw_only=True)
class RealRow:
    """One model on the real inputs of ``--lengths`` at one batch size: medians over runs, sentences per second and
    its speed-ups (built by :func:`compress.eval.latency.rows.build_real_rows`)."""

    model: str  # the model folder as given
    name: str  # its name in the tables
    backend: str  # the backend that ran it
    batch: int  # sentences per forward pass (above 1: sorted by length, each batch padded to its longest)
    p50_ms: float  # the median over runs of each run's median pass (per sentence at batch 1, per batch above)
    p99_ms: float | None = None  # the same of each run's 99th percentile
    sentences_per_s: float  # the median over runs of each run's sentences per second
    runs_sentences_per_s: tuple[float, ...] = ()  # each run's, in run order
    runs_passes: tuple[int, ...] = ()  # each run's passes over the inputs (with --bursts, a fast model's extra ones)
    padded_tokens: int | None = None  # tokens computed per pass over the inputs, padding included
    speedup: float | None = None  # its sentences per second over the first model's
    speedup_min: float | None = None  # that ratio in the worst run
    best_fp32_backend: str | None = None  # the first model's fastest fp32 reference backend at this batch size
    speedup_vs_best_fp32: float | None = None  # its sentences per second over that backend's
    speedup_vs_best_fp32_min: float | None = None  # that ratio in the worst run

    def to_dict(self) -> dict[str, Any]:
        """The row as ``latency.json`` holds it."""
        return _to_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RealRow":
        """A real-input row from ``latency.json``."""
        return _from_dict(cls, data, ("model", "name", "backend", "batch", "p50_ms", "sentences_per_s"))


def _to_dict(record: Row | RealRow) -> dict[str, Any]:
    """Every field in order, a tuple as a list, the statistics as their dict; :data:`_LEFT_OUT` keys only when set."""
    out: dict[str, Any] = {}
    for field in dataclasses.fields(record):
        value = getattr(record, field.name)
        if value is None and field.name in _LEFT_OUT:
            continue
        out[field.name] = value.to_dict() if isinstance(value, Stats) else list(value) if isinstance(value, tuple) else value
    return out


def _from_dict(cls: type, data: Mapping[str, Any], required: tuple[str, ...]):
    """``cls`` from a row's dict: the keys it knows (others are left), lists as tuples, the statistics as Stats."""
    missing = [key for key in required if key not in data]
    if missing:
        raise CompressError(f"not a latency row: no {', '.join(missing)} in {sorted(data)}")
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        if field.name in data:
            value = data[field.name]
            values[field.name] = tuple(value) if isinstance(value, list) else value
    if values.get("slowest_run") is not None:
        values["slowest_run"] = Stats.from_dict(values["slowest_run"])
    return cls(**values)
