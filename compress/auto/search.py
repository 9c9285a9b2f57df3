"""The model-free core of ``compress auto``: budgets, a latency model, pricing a round of training, the choice.

Finding the most accurate model that fits a budget takes four pure pieces, each testable
without a model:

- :func:`parse_budgets` reads ``"p50<=6ms@b1,s128; size<=20MB"`` into :class:`Budget`
  records; :func:`points` says which (batch, seq) points must be timed.
- :func:`fit_latency_model` fits, per (backend, batch, seq), a non-negative linear model
  of encoder latency over shape features, so shapes can be ranked before any is trained.
- :func:`round_seconds` prices a round of training from the seconds per epoch seen so far
  (successive halving itself runs on Optuna: :mod:`compress.auto.engine`).
- :func:`pareto_front`, :func:`choose` and :func:`fastest` pick among measured results.

A *measurement* is a plain dict, one per model::

    {"size_bytes": 17_400_000,
     "points": {(1, 128): {"p50_ms": 5.1, "p90_ms": 5.4, "p99_ms": 6.0, "mean_ms": 5.2,
                           "throughput": 196.0, "speedup": 8.2,
                           "slowest": {"p50_ms": 5.6, ..., "throughput": 178.6, "speedup": 7.4}}, ...}}

(figures of a ``compress latency`` :class:`~compress.eval.latency.row.Row`, named as its fields and as the budgets
name them; :func:`measurement` builds it from such rows).
``slowest`` is present when the timing was repeated (``--repeat-runs``): each figure in
its worst run, which is what a budget is judged on, so a model that fits in one run only
is not chosen.
A *result* is a dict with at least ``"accuracy"`` and ``"measurement"``.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable, Mapping, Sequence, TypeVar

import numpy as np

# The budget grammar lives in compress.core, so that the command line checks --budget before importing torch;
# compress.auto's modules and the tests import it from here.
from compress.core.budgets import Budget, budget_option, parse_budgets  # noqa: F401
from compress.core.errors import CompressError
from compress.core.model.shapes import Shape
from compress.eval.latency.row import Row

# ---------------------------------------------------------------------------- budgets


def points(budgets: Iterable[Budget]) -> set[tuple[int, int]]:
    """The (batch, seq) points that must be timed (for speed-up budgets, the teacher too)."""
    return {(b.batch, b.seq) for b in budgets if b.batch is not None}


# The figures of a row a measurement's point holds (each under its field's name, as the budgets name them).
MEASURED = ("p50_ms", "p90_ms", "p99_ms", "mean_ms", "throughput", "speedup")


def measurement(rows: Iterable[Row], size_bytes: float) -> dict:
    """A measurement dict from one model's ``compress latency`` rows (a figure a row lacks is left out)."""

    def point(r: Row) -> dict:
        found = {k: getattr(r, k) for k in MEASURED if getattr(r, k) is not None}
        if len(r.runs_p50_ms) > 1:  # repeated runs: the worst run of each figure
            slowest = r.slowest_run.to_dict()
            slowest["throughput"] = r.batch * 1e3 / slowest["p50_ms"]
            if r.speedup_min is not None:
                slowest["speedup"] = r.speedup_min
            found["slowest"] = slowest
        return found

    return {"size_bytes": size_bytes, "points": {r.point: point(r) for r in rows}}


# ---------------------------------------------------------------------------- latency model

FEATURES = ("overhead", "per_layer", "projections", "ffn", "attention")


def features(batch: int, seq: int, shape: Shape) -> np.ndarray:
    """The (5,) feature vector of an encoder forward pass; coefficients are ms and ms per GFLOP.

    With n = batch*seq tokens, L layers, hidden h, FFN width f, counting 2 FLOPs per
    multiply-add: [1, L, projections L*2*n*4h^2 (Q, K, V, output), FFN L*2*n*2hf (in, out),
    attention L*2*2*batch*seq^2*h (scores QK^T and the weighted sum of V)], FLOPs in 1e9.
    """
    L, h, f, n = shape.layers, shape.hidden, shape.ffn, batch * seq
    return np.array([1.0, L, L * 8.0 * n * h * h / 1e9, L * 4.0 * n * h * f / 1e9, L * 4.0 * batch * seq * seq * h / 1e9])


# Fallback ladder, tried in order: the first basis with full column rank on a group's
# samples is fitted. Each is a (5, k) tying matrix T: fitting X @ T gives c, and the
# full coefficients are T @ c. So "dense" shares one ms/GFLOP between projections and
# FFN (shapes with ffn = 4*hidden cannot tell them apart), "flops" shares one rate for
# all matmuls, then the per-layer and finally the constant overhead are dropped; a single
# sample always fits the last rung (latency proportional to FLOPs).
_LADDER = (
    ("full", np.eye(5)),
    ("dense", np.array([[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 0], [0, 0, 0, 1]], float)),
    ("flops", np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [0, 0, 1], [0, 0, 1]], float)),
    ("flops+overhead", np.array([[1, 0], [0, 0], [0, 1], [0, 1], [0, 1]], float)),
    ("flops only", np.array([[0], [0], [1], [1], [1]], float)),
)


def nnls(A: np.ndarray, b: np.ndarray, max_iter: int | None = None) -> np.ndarray:
    """argmin ||A x - b|| subject to x >= 0 (Lawson & Hanson 1974, active set); A (m, n), b (m,) -> x (n,)."""
    A, b = np.asarray(A, float), np.asarray(b, float)
    n = A.shape[1]
    x, passive = np.zeros(n), np.zeros(n, bool)
    tol = 10 * np.finfo(float).eps * np.abs(A).sum(axis=0).max() * max(A.shape)
    for _ in range(max_iter or 3 * n + 10):
        w = A.T @ (b - A @ x)  # (n,) negative gradient; positive where raising x_j helps
        if passive.all() or w[~passive].max() <= tol:
            break
        passive[np.argmax(np.where(passive, -np.inf, w))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(A[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            # Step from x toward z until the first passive coefficient hits zero, then drop it.
            hit = np.flatnonzero(passive & (z <= 0))
            steps = x[hit] / np.maximum(x[hit] - z[hit], np.finfo(float).tiny)
            x = x + steps.min() * (z - x)
            x[hit[np.argmin(steps)]] = 0.0  # exactly, so the loop always drops one
            passive &= x > tol
            x[~passive] = 0.0
    return x


@dataclass(frozen=True)
class Sample:
    """One timed forward pass: ``ms`` milliseconds for ``shape`` at (batch, seq) on ``backend``."""

    backend: str
    batch: int
    seq: int
    shape: Shape
    ms: float


Group = tuple[str, int, int]  # (backend, batch, seq)


@dataclass(frozen=True)
class LatencyModel:
    """Non-negative latency coefficients per (backend, batch, seq), in :data:`FEATURES` order."""

    coefs: Mapping[Group, tuple[float, ...]]  # 5 per group: ms, ms/layer, ms/GFLOP x 3
    basis: Mapping[Group, str]  # which rung of the fallback ladder was fitted

    def _coef(self, backend: str, batch: int, seq: int) -> np.ndarray:
        if (backend, batch, seq) not in self.coefs:
            fitted = ", ".join(f"{g[0]}@b{g[1]},s{g[2]}" for g in sorted(self.coefs))
            raise CompressError(f"no latency model for {backend}@b{batch},s{seq} (fitted: {fitted}): time some shapes there first")
        return np.array(self.coefs[(backend, batch, seq)])

    def predict(self, backend: str, batch: int, seq: int, shape: Shape) -> float:
        """Predicted milliseconds of one forward pass."""
        return float(features(batch, seq, shape) @ self._coef(backend, batch, seq))

    def per_layer_ms(self, backend: str, batch: int, seq: int, shape: Shape) -> float:
        """Predicted milliseconds of one encoder layer (the prediction without the constant overhead, / layers)."""
        c = self._coef(backend, batch, seq)
        return float(features(batch, seq, shape)[1:] @ c[1:] / shape.layers)


def fit_latency_model(samples: Sequence[Sample]) -> LatencyModel:
    """Fit one non-negative linear model per (backend, batch, seq) group of timed samples."""
    if not samples:
        raise CompressError("no latency samples to fit: time some shapes first")
    groups: dict[Group, list[Sample]] = {}
    for s in samples:
        if not (s.ms > 0 and math.isfinite(s.ms)):
            raise CompressError(f"latency sample {s.shape.label} on {s.backend} has {s.ms} ms: timings must be positive")
        groups.setdefault((s.backend, s.batch, s.seq), []).append(s)
    coefs, basis = {}, {}
    for g, group in groups.items():
        X = np.stack([features(s.batch, s.seq, s.shape) for s in group])  # (samples, 5)
        y = np.array([s.ms for s in group])
        for name, T in _LADDER:
            Xt = X @ T  # (samples, k)
            norms = np.linalg.norm(Xt, axis=0)  # scale columns to unit norm for conditioning
            if len(group) >= T.shape[1] and (norms > 0).all() and np.linalg.matrix_rank(Xt / norms) == T.shape[1]:
                break
        coefs[g] = tuple(float(v) for v in T @ (nnls(Xt / norms, y) / norms))
        basis[g] = name
    return LatencyModel(coefs, basis)


def held_out_error(samples: Sequence[Sample], holdout: Callable[[Sample], bool]) -> dict:
    """Fit on the samples ``holdout`` rejects, predict the others: signed % errors, median and worst |%|."""
    test = [s for s in samples if holdout(s)]
    train = [s for s in samples if not holdout(s)]
    if not test or not train:
        raise CompressError(f"held-out check needs samples on both sides, got {len(train)} to fit and {len(test)} to test")
    model = fit_latency_model(train)
    errors = []
    for s in test:
        predicted = model.predict(s.backend, s.batch, s.seq, s.shape)
        errors.append({"sample": s, "predicted_ms": predicted, "percent": 100.0 * (predicted - s.ms) / s.ms})
    absolute = np.abs([e["percent"] for e in errors])
    return {"errors": errors, "median": float(np.median(absolute)), "worst": float(absolute.max())}


# ---------------------------------------------------------------------------- pricing a round

K = TypeVar("K", bound=Hashable)


def round_seconds(plan: Sequence[tuple[K, int]], history: Sequence[tuple[K, int, float]],
                  size: Callable[[K], float] | None = None) -> float:
    """Predicted seconds of a round's ``plan`` [(candidate, units)]: each candidate's seconds per unit in its latest
    ``history`` entry [(candidate, units, seconds)] times its new units. A candidate never trained is priced by
    ``size`` (e.g. its parameters) at the median seconds per unit per size of the trained ones; without ``size``
    or any history it counts 0 (a first round always runs: there is nothing to price it by)."""
    per_unit = {c: seconds / units for c, units, seconds in history if units > 0}
    rates = [per_unit[c] / size(c) for c in per_unit if size is not None and size(c) > 0]
    rate = statistics.median(rates) if rates else 0.0
    return sum(per_unit.get(c, rate * size(c) if size is not None else 0.0) * u for c, u in plan)


# ---------------------------------------------------------------------------- choosing


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the (accuracy, latency) points no other point beats: accuracy up, latency down."""
    def dominates(a, b):
        return a[0] >= b[0] and a[1] <= b[1] and (a[0] > b[0] or a[1] < b[1])
    return [i for i, p in enumerate(points) if not any(dominates(q, p) for q in points)]


def _p50(result: Mapping[str, Any], point: tuple[int, int]) -> float:
    """p50 milliseconds of a result at ``point``; inf when it was not timed there."""
    return float(result["measurement"].get("points", {}).get(point, {}).get("p50_ms", math.inf))


def room(result: Mapping[str, Any], budgets: Iterable[Budget]) -> float:
    """How far ``result`` is inside its timed budgets, as the smallest fraction of a limit in the worst run
    (0.25: 25% under a latency ceiling or over a throughput / speed-up floor); inf without timed budgets.
    Sizes are left out: they do not swing from one run to the next."""
    return min((b.room(result["measurement"]) for b in budgets if b.kind != "size"), default=math.inf)


def choose(results: Sequence[Mapping[str, Any]], budgets: Iterable[Budget], tie: float = 0.0) -> Mapping[str, Any] | None:
    """The most accurate result meeting every budget, or None.

    Results within ``tie`` accuracy of the most accurate one that fits count as equally accurate: among them the
    one with the most :func:`room` is chosen (one that fits by a hair in this run misses in the next), then the more
    accurate, then the lower p50 at the first budget point."""
    budgets = tuple(budgets)
    point = min(points(budgets), default=(1, 128))
    fits = [r for r in results if not math.isnan(r["accuracy"]) and all(b.met(r["measurement"]) for b in budgets)]
    if not fits:
        return None
    best = max(r["accuracy"] for r in fits)
    near = [r for r in fits if r["accuracy"] >= best - tie]
    return min(near, key=lambda r: (-room(r, budgets), -r["accuracy"], _p50(r, point)))


def fastest(results: Sequence[Mapping[str, Any]], point: tuple[int, int] = (1, 128)) -> Mapping[str, Any] | None:
    """The result with the lowest p50 at ``point`` (the first on ties), or None when there are none."""
    return min(results, key=lambda r: _p50(r, point), default=None)
