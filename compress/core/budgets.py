"""Budgets: what ``compress auto --budget`` asks of a model, read from ``"p50<=6ms@b1,s128; size<=20MB"``.

:func:`parse_budgets` reads the text into :class:`Budget` records (a unit is required
wherever a bare number could be misread); :meth:`Budget.met` and :meth:`Budget.room` judge
a measurement dict (see :mod:`compress.auto.search`). The grammar lives here, with no heavy
import, so that the command line refuses a malformed ``--budget`` before it imports torch.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from compress.core.errors import CompressError

GRAMMAR = ("budgets look like 'p50<=6ms@b1,s128' (p50|p90|p99|mean; ms|s|us), 'throughput>=500/s@b32,s128', "
           "'size<=20MB' (B|KB|MB|GB|KiB|MiB|GiB), 'speedup>=10x@b1,s128'; separate several with ';'")
_KINDS = {"p50": "latency", "p90": "latency", "p99": "latency", "mean": "latency",
          "throughput": "throughput", "size": "size", "speedup": "speedup"}
_OPERATOR = {"latency": "<=", "size": "<=", "throughput": ">=", "speedup": ">="}
_UNITS = {  # unit -> factor to the base unit; "" only where the number cannot be misread
    "latency": {"ms": 1.0, "s": 1e3, "us": 1e-3},
    "throughput": {"/s": 1.0, "seq/s": 1.0, "": 1.0},
    "size": {"b": 1.0, "kb": 1e3, "mb": 1e6, "gb": 1e9, "kib": 2.0**10, "mib": 2.0**20, "gib": 2.0**30},
    "speedup": {"x": 1.0, "": 1.0},
}
_DEFAULT_POINT = {"latency": (1, 128), "throughput": (32, 128), "speedup": (1, 128), "size": (None, None)}
_BASE_UNIT = {"latency": "ms", "throughput": "seq/s", "size": "bytes", "speedup": "x"}

Measurement = Mapping[str, Any]


@dataclass(frozen=True)
class Budget:
    """One constraint a chosen model must meet, with its limit in base units."""

    kind: str  # 'latency' | 'throughput' | 'size' | 'speedup'
    stat: str | None  # 'p50' | 'p90' | 'p99' | 'mean' for latency, else None
    limit: float  # ms for latency, sequences/s, bytes, or a ratio
    batch: int | None  # the timed point; None for size
    seq: int | None
    text: str  # as the user wrote it

    @property
    def key(self) -> str:
        """The measurement key this budget reads (``p50_ms``, ``throughput``, ``size_bytes``, ``speedup``)."""
        return {"latency": f"{self.stat}_ms", "size": "size_bytes"}.get(self.kind, self.kind)

    def value(self, m: Measurement, worst: bool = False) -> float:
        """The measured quantity this budget constrains, from a measurement dict (``worst``: in the worst run, where
        the timing was repeated)."""
        if self.kind == "size":
            found = m.get("size_bytes")
        else:
            at = m.get("points", {}).get((self.batch, self.seq), {})
            found = (at.get("slowest", at) if worst else at).get(self.key)
        if found is None:
            where = "" if self.kind == "size" else f" at batch {self.batch}, seq {self.seq}"
            raise CompressError(f"budget '{self.text}' needs {self.key}{where}, which was not measured: time that point")
        return float(found)

    def room(self, m: Measurement) -> float:
        """How far inside this budget ``m`` is in its worst run, as a fraction of the limit (negative: outside)."""
        v = self.value(m, worst=True)
        return (self.limit - v) / self.limit if _OPERATOR[self.kind] == "<=" else (v - self.limit) / self.limit

    def met(self, m: Measurement) -> bool:
        """Whether the measurement satisfies the budget in every run (a NaN measurement never does)."""
        v = self.value(m, worst=True)
        return v <= self.limit if _OPERATOR[self.kind] == "<=" else v >= self.limit

    def describe(self) -> str:
        """A human line, e.g. ``p50 latency <= 6 ms at batch 1, seq 128``."""
        name = {"latency": f"{self.stat} latency"}.get(self.kind, self.kind)
        shown = f"{self.limit / 1e6:g} MB" if self.kind == "size" else f"{self.limit:g} {_BASE_UNIT[self.kind]}"
        at = "" if self.batch is None else f" at batch {self.batch}, seq {self.seq}"
        return f"{name} {_OPERATOR[self.kind]} {shown}{at}"


def _parse_one(text: str) -> Budget:
    def bad(problem: str) -> CompressError:
        return CompressError(f"bad budget '{text}': {problem}; {GRAMMAR}")

    t = "".join(text.split()).lower()  # spaces are allowed anywhere
    m = re.fullmatch(r"([a-z][a-z0-9]*)(<=|>=|=<|=>|==|<|>|=)(.*)", t)
    if not m:
        raise bad("no metric and comparison such as 'p50<='")
    metric, op, rest = m.groups()
    if metric not in _KINDS:
        raise bad(f"unknown metric '{metric}' (valid: {', '.join(_KINDS)})")
    kind = _KINDS[metric]
    if op != _OPERATOR[kind]:
        raise bad(f"operator '{op}' is wrong for {metric}, which takes '{_OPERATOR[kind]}'")
    amount, _, point = rest.partition("@")
    v = re.fullmatch(r"([+-]?(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?)(.*)", amount)
    if not v:
        raise bad(f"'{amount}' is not a number with a unit")
    unit = v.group(2)
    if unit not in _UNITS[kind]:
        raise bad(f"unit '{unit}' is not one of {'|'.join(u for u in _UNITS[kind] if u)} for {metric}")
    limit = float(v.group(1)) * _UNITS[kind][unit]
    if not (limit > 0 and math.isfinite(limit)):
        raise bad(f"limit '{v.group(1)}' must be a positive number")
    batch, seq = _DEFAULT_POINT[kind]
    if "@" in rest:
        p = re.fullmatch(r"b(\d+),s(\d+)", point)
        if kind == "size":
            raise bad(f"size takes no point, got '@{point}'")
        if not p or int(p.group(1)) < 1 or int(p.group(2)) < 1:
            raise bad(f"point '@{point}' is not '@bBATCH,sSEQ' with both at least 1")
        batch, seq = int(p.group(1)), int(p.group(2))
    return Budget(kind, metric if kind == "latency" else None, limit, batch, seq, text.strip())


def parse_budgets(text: str | Sequence[str]) -> tuple[Budget, ...]:
    """Budgets from ``"p50<=6ms@b1,s128; size<=20MB"`` or a list of such strings (case-insensitive)."""
    pieces = [p for item in ([text] if isinstance(text, str) else text) for p in str(item).split(";") if p.strip()]
    if not pieces:
        raise CompressError(f"no budget given; {GRAMMAR}")
    return tuple(_parse_one(p) for p in pieces)


def budget_option(text: str) -> tuple[Budget, ...]:
    """The budgets of ``--budget``, which ``compress auto`` requires (none given: the error names the flag)."""
    if not text:
        raise CompressError("no budget given; pass e.g. --budget 'p50<=6ms@b1,s128' (several: separate with ';')")
    return parse_budgets(text)
