"""The leaderboard's view of one model directory: :class:`ModelRow`, read from its metrics.json and compression.json.

``read_row(path, name, batch, seq, split)`` reduces a folder's sidecars to what the table
needs (nothing is re-run): the primary metric of each task's latest evaluation of the
split (``split_scores``), its latency point in every ``compress latency`` run
(``latency_runs``), its parameter count and size, and its ancestors through
``compression.json`` parent links. ``compress.eval.leaderboard`` compares the rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compress.core.data.resolve import task_of_model
from compress.core.data.tasks import Task, get_task
from compress.core.errors import CompressError
from compress.core.formats.folder import check_config_values
from compress.core.formats.records import lineage, parent_path, read_compression, read_json, read_metrics
from compress.eval.config import SPLITS
from compress.eval.latency.row import Row
from compress.eval.latency.rows import megabytes, size_on_disk

MAX_ANCESTORS = 64  # parent links followed before giving up (a guard against cycles)


@dataclass(frozen=True)
class LatencyPoint:
    """One model's p50 at the table's (batch, seq), from one latency run."""

    p50_ms: float
    backend: str
    run: str  # identifies the latency run: rows of one run share it
    when: str


@dataclass(frozen=True)
class ModelRow:
    """What one model directory's sidecars say, reduced to the leaderboard's needs."""

    path: Path  # resolved
    name: str
    stage: str | None = None
    method: str | None = None
    parent: Path | None = None
    ancestors: tuple[Path, ...] = ()  # parent, grandparent, ... (resolved), as far as the links go
    params: int | None = None
    params_source: str | None = None  # "latency", "compression.json" or "estimate"
    size_mb: float | None = None
    scores: dict[str, float] = field(default_factory=dict)  # task -> primary metric (percent)
    evals: dict[str, dict[str, Any]] = field(default_factory=dict)  # task -> split, n, when, extra metrics
    tasks: dict[str, Task] = field(default_factory=dict)  # task name -> the task scored (a preset, or the folder's own)
    latency: LatencyPoint | None = None  # the latest run's point at (batch, seq)
    latency_runs: dict[str, LatencyPoint] = field(default_factory=dict)  # run id -> point at (batch, seq)
    latency_points: tuple[tuple[int, int], ...] = ()  # every (batch, seq) ever measured

    @property
    def has_metrics(self) -> bool:
        """Whether the model has an evaluation of the table's split or any latency result."""
        return bool(self.scores or self.latency_points)


def read_row(path: Path, name: str, batch: int, seq: int, split: str = "dev") -> ModelRow:
    """The leaderboard's view of one model directory, scored on ``split``."""
    records = read_metrics(path)
    comp = read_compression(path)
    runs, points = latency_runs(records, batch, seq)
    latest = max(runs.values(), key=lambda p: p.when, default=None)
    params, source = model_params(path, records, comp)
    scores, evals, tasks = split_scores(records, own_task(path), split)
    parent = parent_path(comp)
    return ModelRow(
        path=path, name=name, stage=comp.get("stage"), method=comp.get("method"),
        parent=Path(parent) if parent else None, ancestors=ancestors(path),
        params=params, params_source=source, size_mb=model_size_mb(path, records),
        scores=scores, evals=evals, tasks=tasks, latency=latest, latency_runs=runs, latency_points=points,
    )


def own_task(path: Path) -> Task | None:
    """The task the folder was made for (its records or config), or None; an unreadable record is no task."""
    try:
        return task_of_model(path)
    except CompressError:
        return None


def _order(indexed: tuple[int, dict[str, Any]]) -> tuple[str, int]:
    """Sort key of an (index, record) pair: oldest first."""
    # Latest = latest "when"; records are appended, so the file order breaks ties.
    index, record = indexed
    return str(record.get("when") or ""), index


def record_task(record: dict[str, Any], own: Task | None) -> Task | None:
    """The task an eval record scored: the folder's own when the names agree (a user's task is never in the
    registry, and one named like a preset is still the user's), else a preset; None for anything else."""
    name = str(record.get("task"))
    if own is not None and own.name == name:
        return own
    try:
        return get_task(name)
    except CompressError:
        return None  # e.g. the pretraining held-out loss, or another user's task: nothing this table can name


def split_scores(records: list[dict[str, Any]], own: Task | None = None, split: str = "dev"
                 ) -> tuple[dict[str, float], dict[str, dict[str, Any]], dict[str, Task]]:
    """Per task, the primary metric of the latest ``split`` evaluation (MNLI: matched), its details, and the task."""
    scores: dict[str, float] = {}
    details: dict[str, dict[str, Any]] = {}
    tasks: dict[str, Task] = {}
    wanted = SPLITS[split]
    for _, record in sorted(enumerate(records), key=_order):  # oldest first: later ones overwrite
        if record.get("kind") != "eval" or not isinstance(record.get("metrics"), dict):
            continue
        task = record_task(record, own)
        if task is None:
            continue
        value = record["metrics"].get(task.primary_metric)
        if record.get("split") == f"{split}_mismatched" and value is not None:
            details.setdefault(task.name, {})["mismatched"] = float(value)
        if record.get("split") not in wanted or value is None:
            continue
        scores[task.name] = float(value)
        tasks[task.name] = task
        details[task.name] = {**details.get(task.name, {}), "split": record["split"], "n": record.get("n"),
                              "when": record.get("when"), "metric": task.primary_metric}
    return scores, {t: d for t, d in details.items() if t in scores}, tasks


def latency_runs(records: list[dict[str, Any]], batch: int, seq: int) -> tuple[dict[str, LatencyPoint], tuple]:
    """Each latency run's point at (batch, seq), by run id; and every (batch, seq) measured."""
    runs: dict[str, LatencyPoint] = {}
    points: set[tuple[int, int]] = set()
    for _, record in sorted(enumerate(records), key=_order):
        if record.get("kind") != "latency":
            continue
        # measure_latency writes one "when" and one "speedup_vs" into every model's record of a run; the
        # backend is the model's own (torch for one, onnxruntime-int8 for another) and so not part of the run.
        run = f"{record.get('when')}|{record.get('speedup_vs')}"
        for row in _rows(record):
            points.add((int(row.batch), int(row.seq)))
            if row.batch == batch and row.seq == seq and row.p50_ms:
                backend = str(row.backend or record.get("backend") or "?")
                runs[run] = LatencyPoint(float(row.p50_ms), backend, run, str(record.get("when") or ""))
    return runs, tuple(sorted(points))


def _rows(record: dict[str, Any]) -> list[Row]:
    """A latency record's rows as records: those ``compress latency`` wrote (with a batch, a seq and a p50; a row
    of any version has them), so that a row written by hand without them is passed over."""
    return [Row.from_dict(row) for row in record.get("rows") or [] if {"batch", "seq", "p50_ms"} <= row.keys()]


def _latency_rows_newest_first(records: list[dict[str, Any]]) -> list[Row]:
    """Rows of every latency record, the latest record's first."""
    ordered = sorted(enumerate(records), key=_order, reverse=True)
    return [row for _, r in ordered if r.get("kind") == "latency" for row in _rows(r)]


def model_params(path: Path, records: list[dict[str, Any]], comp: dict[str, Any]) -> tuple[int | None, str | None]:
    """Parameter count and where it came from: a latency row, compression.json, or an estimate from the structure."""
    for row in _latency_rows_newest_first(records):
        if row.params:
            return int(row.params), "latency"
    summary = comp.get("summary") if isinstance(comp.get("summary"), dict) else {}
    for value in (comp.get("params"), summary.get("params_after")):
        if value:
            return int(value), "compression.json"
    estimate = estimate_params(comp.get("structure"), _read_config(path))
    return (estimate, "estimate") if estimate else (None, None)


def _read_config(path: Path) -> dict[str, Any]:
    """config.json as a dict ({} when unreadable: the estimate is then skipped); sizes of the wrong type or out of
    range are refused in one line, as every stage refuses them."""
    try:
        config = read_json(path / "config.json")
    except CompressError:
        return {}
    if not isinstance(config, dict):
        return {}
    check_config_values(config, str(path / "config.json"))
    return config


def estimate_params(structure: dict[str, Any] | None, config: dict[str, Any]) -> int | None:
    """Parameters of embeddings + encoder + pooler from a structure dict and config.json (task head left out)."""
    if not structure or "vocab_size" not in config:
        return None
    h, d = structure["hidden_size"], structure["head_size"]
    positions = config.get("max_position_embeddings", 512) + config.get("type_vocab_size", 2)
    total = (config["vocab_size"] + positions) * h + 2 * h  # word/position/type embeddings + LayerNorm
    for heads, ffn in zip(structure["heads"], structure["ffn"]):
        a = heads * d  # attention width of this layer
        total += 3 * (h * a + a) + (a * h + h) + 2 * h  # Q, K, V, output projection, LayerNorm
        total += (h * ffn + ffn) + (ffn * h + h) + 2 * h  # FFN in, out, LayerNorm
    return total + h * h + h  # pooler


def model_size_mb(path: Path, records: list[dict[str, Any]]) -> float | None:
    """Weight files' size in MB (10^6 bytes): from the latest latency row, else measured on disk now."""
    for row in _latency_rows_newest_first(records):
        if row.size_mb is not None:
            return float(row.size_mb)
    size = size_on_disk(path)
    return megabytes(size) if size else None


def ancestors(path: Path) -> tuple[Path, ...]:
    """Parent, grandparent, ... of a model directory through compression.json parent links (resolved paths)."""
    chain: list[Path] = []
    try:
        for directory, _ in lineage(path, MAX_ANCESTORS):
            chain.append(directory)
    except CompressError:
        pass  # an unreadable compression.json ends the chain
    return tuple(chain[1:])  # without the directory itself
