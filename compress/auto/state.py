"""The records a ``compress auto`` search keeps and passes on: its state on disk, what ``--reuse`` lends it, the run.

- :class:`SearchState`: everything the search has done so far (``state.json`` in the work folder), resumable.
- :class:`Probe` (of :class:`ProbeSample`): the latency probe, kept in ``state.json`` as its ``to_dict()``.
- :class:`Earlier`: what earlier searches (``--reuse``) can give this one.
- :class:`SearchRun`: what every step after the probe reads, made once by ``auto()``.
- Trained entries, one dict per candidate round (label, round, epochs, score, dir, teacher, seconds, init; score NaN
  when the training failed), and the helpers that pick among them and copy them in.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from compress.auto.config import AutoConfig
from compress.auto.search import Budget, Sample
from compress.auto.targets import Target
from compress.core.checkpoints import work_dir_for
from compress.core.errors import CompressError
from compress.core.formats.records import LATENCY_ROW, read_record
from compress.core.formats.schemas import BOOL, NUMBER, STR, Inside, ListOf, MapOf, Record, Schema, Whole, optional
from compress.core.formats.writes import write_json_atomic
from compress.core.model.shapes import Shape
from compress.eval.latency.row import Row

log = logging.getLogger(__name__)

# A timer: (model dirs, (batch, seq) points, repeats, runs) -> rows as `compress latency` makes them
# (model, batch, seq, p50_ms, ..., throughput, speedup against the first model; with runs > 1
# also runs_p50_ms, slowest_run and speedup_min).
Timer = Callable[[list[Path], list[tuple[int, int]], int, int], list[Row]]

# state.json, the fields read back (SearchState.open's, Probe.to_dict's, the trained entries'); a candidate's
# folder lies in the work folder that holds the file.
SIZES = ("layers", "hidden", "heads", "ffn")
SHAPE = Record({**dict.fromkeys(SIZES, Whole(1)), "origin": STR}, required=SIZES, closed=True)  # Shape(**it)
SAMPLE = Record({"variant": STR, "shape": SHAPE, "held_out": BOOL, "batch": Whole(1), "seq": Whole(1), "ms": NUMBER,
                 "size_bytes": Whole(0), "params": optional(Whole(0))},
                required=("variant", "shape", "held_out", "batch", "seq", "ms", "size_bytes"))
PROBE = Record({"samples": ListOf(SAMPLE), "error": optional(Record()), "teacher": MapOf(NUMBER),
                "teacher_timings": optional(MapOf(ListOf(NUMBER))), "teacher_size_bytes": optional(Whole(0)),
                "rows": ListOf(LATENCY_ROW), "when": optional(STR), "reused_from": optional(STR)},
               required=("samples", "error", "teacher"))
TRAINED = Record({"label": STR, "round": Whole(0), "epochs": Whole(0), "score": NUMBER, "dir": Inside(),
                  "teacher": optional(NUMBER), "seconds": NUMBER}, required=("label", "round", "epochs", "score", "dir"))
STATE = Schema(Record({"key": STR, "probe_key": STR, "train_key": STR, "probe": optional(PROBE),
                       "trained": MapOf(TRAINED), "finalists": optional(ListOf(Record()))}, required=("trained",)),
               fix="drop --resume to start the search afresh")


@dataclass
class SearchState:
    """Everything the search has done so far; ``state.json`` in the work directory."""

    work: Path
    state: dict = field(default_factory=dict)

    @classmethod
    def open(cls, work: Path, resume: bool, key: str, probe_key: str, train_key: str) -> "SearchState":
        file = work / "state.json"
        if resume and file.is_file():
            state = read_record(file, STATE)
            if state.get("key") != key:
                raise CompressError(f"{work} holds a search for another teacher, task or budget; drop --resume or pick another --out")
            return cls(work, state)
        if work.exists():
            shutil.rmtree(work)
        work.mkdir(parents=True)
        return cls(work, {"key": key, "probe_key": probe_key, "train_key": train_key, "probe": None, "trained": {},
                          "finalists": None})

    def save(self) -> None:
        write_json_atomic(self.work / "state.json", self.state)


@dataclass(frozen=True)
class ProbeSample:
    """One random-weight probe student as one variant, timed at one (batch, seq)."""

    variant: str  # the variant timed, e.g. "torch-fp32" or "onnxruntime-int8"
    shape: Shape  # the student's shape (kept without its origin)
    held_out: bool  # left out of the fit, to measure the latency model's error
    batch: int  # sequences per forward pass
    seq: int  # tokens per sequence
    ms: float  # its p50 in its fastest run
    size_bytes: int  # its weight files on disk
    params: int | None  # its parameters, as its latency row gives them

    @property
    def sample(self) -> Sample:
        """As the latency model is fitted on it."""
        return Sample(self.variant, self.batch, self.seq, self.shape, self.ms)

    def to_dict(self) -> dict[str, Any]:
        """As ``state.json`` holds it: the shape as its four sizes."""
        shape = {k: v for k, v in dataclasses.asdict(self.shape).items() if k != "origin"}
        return {**dataclasses.asdict(self), "shape": shape}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ProbeSample":
        return cls(data["variant"], Shape(**data["shape"]), data["held_out"], data["batch"], data["seq"], data["ms"],
                   data["size_bytes"], data.get("params"))


@dataclass(frozen=True, kw_only=True)
class Probe:
    """The latency probe (:func:`compress.auto.probe.probe_latency`): the samples the latency and size models are
    fitted on, the teacher's timings (the reference of speed-up budgets) and the run's rows."""

    samples: tuple[ProbeSample, ...]  # the fitted shapes' samples first, then the held-out ones'
    error: dict[str, Any] | None  # the latency model's error on the held-out shapes, as search.json gives it (None: none)
    teacher: Mapping[str, float]  # "batch,seq" -> the teacher's p50 ms, the faster of its two timings
    teacher_timings: Mapping[str, list[float]] | None = None  # "batch,seq" -> [in the probe run, timed again after it]
    teacher_size_bytes: int | None = None  # the teacher's weight files on disk
    rows: tuple[Row, ...] = ()  # every latency row of the probe run, the teacher's first
    when: str | None = None  # when it was timed (UTC)
    reused_from: str | None = None  # the earlier search (--reuse) it came from; None: timed by this one

    def to_dict(self) -> dict[str, Any]:
        """As ``state.json`` holds it (``teacher_timings`` and ``reused_from`` only when known)."""
        out = {"samples": [s.to_dict() for s in self.samples], "error": self.error, "teacher": self.teacher,
               "teacher_timings": self.teacher_timings, "teacher_size_bytes": self.teacher_size_bytes,
               "rows": [r.to_dict() for r in self.rows], "when": self.when, "reused_from": self.reused_from}
        return {k: v for k, v in out.items() if v is not None or k not in ("teacher_timings", "reused_from")}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Probe":
        """A probe from ``state.json`` (an earlier version's too: one without the teacher's two timings reads)."""
        return cls(samples=tuple(ProbeSample.from_dict(s) for s in data["samples"]), error=data["error"],
                   teacher=data["teacher"], teacher_timings=data.get("teacher_timings"),
                   teacher_size_bytes=data.get("teacher_size_bytes"), rows=tuple(Row.from_dict(r) for r in data.get("rows", ())),
                   when=data.get("when"), reused_from=data.get("reused_from"))


@dataclass(frozen=True)
class Earlier:
    """What earlier searches (``--reuse``) can give this one: a probe and trained candidates by (label, round, epochs)."""

    probe: Probe | None
    trained: dict[tuple[str, int, int], dict]

    @classmethod
    def read(cls, folders: tuple[str, ...], probe_key: str, train_key: str) -> "Earlier":
        probe, trained = None, {}
        for folder in folders:
            state = read_record(work_dir_for(Path(folder)) / "state.json", STATE, fix=f"leave {folder} out of --reuse")
            if probe is None and state.get("probe_key") == probe_key and state.get("probe"):
                probe = dataclasses.replace(Probe.from_dict(state["probe"]), reused_from=str(folder))
            if state.get("train_key") == train_key:
                for t in state["trained"].values():
                    if not math.isnan(t["score"]) and Path(t["dir"], "config.json").is_file():
                        trained.setdefault((t["label"], t["round"], t["epochs"]), t)
        return cls(probe, trained)


@dataclass(frozen=True)
class SearchRun:
    """One search under way, as every step from the probe on reads it (made once the target is prepared)."""

    teacher_dir: Path
    target: Target  # a task or an embedding check; it holds the search's options
    search: SearchState
    budgets: tuple[Budget, ...]
    at: list[tuple[int, int]]  # the timed (batch, seq) points, sorted; the report's is the first
    timer: Timer

    @property
    def cfg(self) -> AutoConfig:
        return self.target.cfg


# ---------------------------------------------------------------------------- trained entries


def _per_label(entries, rank) -> dict[str, dict]:
    """One record per candidate label: the highest by ``rank`` (on a tie, the one listed later)."""
    kept: dict[str, dict] = {}
    for t in entries:
        if t["label"] not in kept or rank(t) >= rank(kept[t["label"]]):
            kept[t["label"]] = t
    return kept


def best_round(entries) -> dict[str, dict]:
    """Each candidate's best-scoring round, by label (on a tie the later one; a failed round only when none scored): a longer round
    is not always better (MRPC 4L-288-576: 84.09 after 3 epochs, 83.75 after 4 more)."""
    return _per_label(entries, lambda t: (-math.inf if math.isnan(t["score"]) else t["score"], t["round"]))


def latest(entries) -> dict[str, dict]:
    """Each candidate's record of its latest round, by label."""
    return _per_label(entries, lambda t: t["round"])


def adopt(entry: dict, search: SearchState) -> float:
    """A candidate an earlier search trained with the same settings, copied in and recorded in the state."""
    search.state["trained"][f"{entry['label']}/{entry['round']}"] = copied(entry, search.work)
    search.save()
    return entry["score"]


def copied(entry: dict, work: Path) -> dict:
    """An earlier search's trained candidate copied into ``work``'s candidates (a later round continues from it)."""
    out = work / "candidates" / f"{entry['label']}-r{entry['round']}"
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(entry["dir"], out)
    log.info("candidate %s (round %d): reused from %s", entry["label"], entry["round"], entry["dir"])
    return {**entry, "dir": str(out), "reused_from": entry["dir"]}
