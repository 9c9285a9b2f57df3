"""The leaderboard: every model's dev metrics, size and latency in one table, next to published results.

``leaderboard(run_dirs, out, cfg) -> out`` reads the ``metrics.json`` and
``compression.json`` of each model directory (nothing is re-run), builds the table and
writes ``report.md``, ``report.html`` and ``leaderboard.json`` (see ``compress.eval.report``).
The steps are importable on their own::

    rows = collect(["runs/sst2-study"], batch=1, seq=128)   # list[ModelRow]
    table = build_table(rows, LeaderboardConfig())            # plain JSON-able dict
    print(format_markdown(table))

How the numbers are put together:

* metric: per task the primary metric of ``compress.core.data.tasks`` (CoLA Matthews corr.,
  MRPC F1, STS-B Pearson, SQuAD F1, accuracy elsewhere; MNLI = matched), from the
  model's latest evaluation record of the table's split (``split``: dev, the default, or
  test). A user's own task is the one its folder records (``compress.core.data.resolve.task_of_model``),
  never looked up in the registry; its column shows its primary metric (entity F1, micro F1, ...)
  after the benchmark tasks'.
* GLUE average: the unweighted mean over the GLUE tasks that every model with GLUE
  results was evaluated on, so all averages in one table cover the same tasks. Published
  rows get the same average only when they publish all of those tasks; a user's tasks
  never enter it.
* retention: a model's metric / its teacher's (per task; for the average, the ratio of
  the averages), in percent. The teacher is the teacher of the model's chain: its oldest
  ancestor (``compression.json`` parent links) among the models shown that has a score;
  with ``compare_with="parent"`` its nearest ancestor shown; with ``baseline``
  that one model for every row; a model with no ancestor shown is compared with the
  first row (rows keep the order of the runs, except that ancestors move up before
  their descendants, so the first row is never a student of another row).
* speed-up: the teacher's p50 / the model's p50 at one (batch, seq) point. Latencies are
  only comparable within one ``compress latency`` run (one machine state, one set-up), so
  the latest run that measured both is used; a ratio across runs is marked ``*``. A run
  is one ``compress latency`` call, whatever backend each of its models ran on.

Published rows (``compress.eval.references``) of the table's split are carried separately, flagged
``published``, and never enter a measured column, an average of measured rows, or a ratio.

A model with no evaluation of the table's split and no latency is left out (and with no
such model at all the table is refused), unless ``keep_unmeasured``: then it is listed,
"not evaluated" in its metric cells. A recipe's own report is built that way, so a recipe without an eval or
latency stage still gets one, listing its models and stages.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Sequence

from compress.core.formats.artifacts import is_model_dir, lineage, parent_path, read_compression, read_json, read_metrics, utc_now
from compress.core.config import option
from compress.core.errors import CompressError
from compress.core.data.resolve import task_of_model
from compress.core.data.tasks import GLUE_TASKS, TASKS, Task, get_task
from compress.eval.latency.runs import display_names, megabytes, size_on_disk
from compress.eval.plots import _pyplot, label_hlines, place_legend, save_figure
from compress.eval.references import for_split

CROSS_RUN = "*"  # marks a speed-up whose two p50s come from different latency runs
NOT_EVALUATED = "not evaluated"  # a metric cell of a model kept without a score (keep_unmeasured)
# The records each table split reads: MNLI reports matched as its primary dev (and test) split.
SPLITS = {"dev": ("dev", "dev_matched"), "test": ("test", "test_matched")}
MAX_ANCESTORS = 64  # parent links followed before giving up (a guard against cycles)

METRIC_LABELS = {"accuracy": "acc", "f1": "F1", "pearson": "Pearson", "matthews_correlation": "MCC",
                 "entity_f1": "entity F1", "micro_f1": "micro F1"}


@dataclass(frozen=True)
class LeaderboardConfig:
    baseline: str | None = option(None, "model directory every model is compared with (retention, speed-up) "
                                  "instead of its teacher", metavar="DIR")
    compare_with: Literal["teacher", "parent"] = option(
        "teacher", "without --baseline, compare each model with the teacher of its chain (its oldest ancestor shown "
        "that has a score) or with its parent (its nearest ancestor shown); a model with neither: the first row")
    speed_reference: str | None = option(None, "model directory for an extra speed-up column, e.g. a BERT-base-shaped model",
                                         flag="--reference-model", metavar="DIR")
    batch: int = option(1, "batch size of the latency point shown in the table")
    seq: int = option(128, "sequence length of the latency point shown in the table")
    tasks: tuple[str, ...] = option((), "tasks to show: benchmark tasks or the names of your own tasks (default: every task "
                                    "some model was evaluated on)", metavar="TASK[,...]")
    published: bool = option(True, "add the published results of eval/references.py (flagged, never mixed with measured ones)")
    split: Literal["dev", "test"] = option(
        "dev", "which evaluation the table shows: each model's latest dev one (MNLI: matched), or its latest test one (your "
        "own task scored on its --test-file, or by compress eval --split test); published rows of that split only")

    def validate(self) -> None:
        """Refuse a latency point below 1 and an unknown split (task names are checked against the models' tasks)."""
        if self.batch < 1:
            raise CompressError(f"--batch must be at least 1, got {self.batch}")
        if self.seq < 1:
            raise CompressError(f"--seq must be at least 1, got {self.seq}")
        if self.split not in SPLITS:
            raise CompressError(f"--split must be one of {', '.join(SPLITS)}, got {self.split!r}")


# ---------------------------------------------------------------------------- collecting


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


def expand_runs(run_dirs: Sequence[str | Path]) -> list[Path]:
    """Model directories named by ``run_dirs``: each is a model dir or a folder of them (two levels deep)."""
    found: list[Path] = []
    for arg in run_dirs:
        path = Path(arg)
        if not path.exists():
            raise CompressError(f"run directory {path} does not exist")
        if is_model_dir(path):
            models = [path]
        elif path.is_dir():
            models = _model_dirs_below(path)
        else:
            raise CompressError(f"{path} is a file; pass a model directory or a folder of model directories")
        if not models:
            raise CompressError(
                f"{path} holds no model directories (folders with config.json, directly or one level down)"
            )
        found.extend(m.resolve() for m in models)
    return list(dict.fromkeys(found))  # a model named twice is shown once


def _model_dirs_below(folder: Path) -> list[Path]:
    """Model directories among ``folder``'s subfolders and their subfolders, sorted."""
    models = []
    for child in sorted(p for p in folder.iterdir() if p.is_dir()):
        if is_model_dir(child):
            models.append(child)
        else:
            models.extend(sorted(g for g in child.iterdir() if is_model_dir(g)))
    return models


def collect(model_dirs: Sequence[str | Path], *, batch: int = 1, seq: int = 128,
            keep_unmeasured: bool = False, split: str = "dev") -> list[ModelRow]:
    """One :class:`ModelRow` per model directory found in ``model_dirs`` (see :func:`expand_runs`), with the
    scores of its ``split`` evaluations (dev or test).

    Raises a CompressError when no model has an evaluation of that split or a latency result,
    unless ``keep_unmeasured`` (their rows then say "not evaluated").
    """
    paths = expand_runs(model_dirs)
    rows = [read_row(path, name, batch, seq, split) for path, name in zip(paths, display_names(paths))]
    if not keep_unmeasured and not any(row.has_metrics for row in rows):
        names = ", ".join(str(p) for p in paths)
        raise CompressError(
            f"no {split} evaluation or latency result in metrics.json of {names}; "
            f"run `compress eval{' --split test' if split == 'test' else ''}` and `compress latency` on the models first"
        )
    return rows


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
        for row in record.get("rows") or []:
            if "batch" not in row or "seq" not in row:
                continue  # not a row compress.eval.latency.runs wrote
            points.add((int(row["batch"]), int(row["seq"])))
            if row["batch"] == batch and row["seq"] == seq and row.get("p50_ms"):
                backend = str(row.get("backend") or record.get("backend") or "?")
                runs[run] = LatencyPoint(float(row["p50_ms"]), backend, run, str(record.get("when") or ""))
    return runs, tuple(sorted(points))


def _latency_rows_newest_first(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of every latency record, the latest record's first."""
    ordered = sorted(enumerate(records), key=_order, reverse=True)
    return [row for _, r in ordered if r.get("kind") == "latency" for row in r.get("rows") or []]


def model_params(path: Path, records: list[dict[str, Any]], comp: dict[str, Any]) -> tuple[int | None, str | None]:
    """Parameter count and where it came from: a latency row, compression.json, or an estimate from the structure."""
    for row in _latency_rows_newest_first(records):
        if row.get("params"):
            return int(row["params"]), "latency"
    summary = comp.get("summary") if isinstance(comp.get("summary"), dict) else {}
    for value in (comp.get("params"), summary.get("params_after")):
        if value:
            return int(value), "compression.json"
    estimate = estimate_params(comp.get("structure"), _read_config(path))
    return (estimate, "estimate") if estimate else (None, None)


def _read_config(path: Path) -> dict[str, Any]:
    """config.json as a dict ({} when unreadable: the estimate is then skipped)."""
    try:
        config = read_json(path / "config.json")
    except CompressError:
        return {}
    return config if isinstance(config, dict) else {}


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
        if row.get("size_mb") is not None:
            return float(row["size_mb"])
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


# ---------------------------------------------------------------------------- the table


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the (latency, metric) points no other point dominates, by increasing latency.

    A point dominates another when its latency is lower or equal and its metric higher or
    equal, one of them strictly; identical points do not dominate each other.
    """
    def dominates(a: tuple[float, float], b: tuple[float, float]) -> bool:
        """Whether ``a`` is at least as fast and as good as ``b``, and strictly one of them."""
        return a[0] <= b[0] and a[1] >= b[1] and (a[0] < b[0] or a[1] > b[1])

    front = [i for i, p in enumerate(points) if not any(dominates(q, p) for q in points)]
    return sorted(front, key=lambda i: (points[i][0], -points[i][1], i))


def known_tasks(rows: Sequence[ModelRow]) -> dict[str, Task]:
    """Every task some model was scored on, by name: presets and the folders' own tasks, in first-seen order."""
    known: dict[str, Task] = {}
    for row in rows:
        for name, task in row.tasks.items():
            known.setdefault(name, task)
    return known


def shown_tasks(rows: Sequence[ModelRow], cfg: LeaderboardConfig) -> list[str]:
    """Tasks in the table: cfg.tasks, else every task some model was evaluated on; the benchmark tasks in
    registry order, then a user's own tasks in first-seen order."""
    known = known_tasks(rows)
    if cfg.tasks:
        wanted = [_wanted_task(name, known) for name in cfg.tasks]
    else:
        wanted = list(known)
    own = [t for t in dict.fromkeys(wanted) if t in known and known[t].user]
    return [name for name in TASKS if name in wanted and name not in own] + own


def _wanted_task(name: str, known: dict[str, Task]) -> str:
    """The task a --tasks name means: a user's task some model was scored on, else a preset (or one clear error)."""
    if name in known:
        return name
    try:
        return get_task(name).name
    except CompressError:
        yours = [t for t, task in known.items() if task.user]
        raise CompressError(f"--tasks {name}: no model was scored on a task of that name and it is no benchmark task; "
                            f"valid: {', '.join([*yours, *TASKS])}") from None


def average_tasks(rows: Sequence[ModelRow], tasks: Sequence[str]) -> list[str]:
    """The GLUE tasks shown that every model with GLUE results was evaluated on (a user's task named like one is not)."""
    users = {name for name, task in known_tasks(rows).items() if task.user}
    glue = [t for t in tasks if t in GLUE_TASKS and t not in users]
    with_glue = [r for r in rows if any(t in r.scores for t in glue)]
    return [t for t in glue if with_glue and all(t in r.scores for r in with_glue)]


def mean_over(scores: dict[str, float], tasks: Sequence[str]) -> float | None:
    """Unweighted mean of ``scores`` over ``tasks`` (None unless at least two tasks, all present)."""
    if len(tasks) < 2 or any(t not in scores for t in tasks):
        return None
    return statistics.fmean(scores[t] for t in tasks)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, None when either is missing or the denominator is 0."""
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def speedup(model: ModelRow, reference: ModelRow) -> tuple[float | None, bool]:
    """reference p50 / model p50 at the table's point, and whether both came from one latency run."""
    if model.latency is None or reference.latency is None:
        return None, True
    common = [run for run in model.latency_runs if run in reference.latency_runs]
    if common:
        run = max(common, key=lambda r: model.latency_runs[r].when)  # the latest run that timed both
        return reference.latency_runs[run].p50_ms / model.latency_runs[run].p50_ms, True
    return reference.latency.p50_ms / model.latency.p50_ms, False


def lineage_order(rows: Sequence[ModelRow]) -> list[ModelRow]:
    """``rows`` in their order, except that a model's ancestors among them move up before it."""
    by_path = {r.path: r for r in rows}
    ordered: dict[Path, ModelRow] = {}
    for row in rows:
        for ancestor in reversed(row.ancestors):  # the oldest first
            if ancestor in by_path:
                ordered.setdefault(ancestor, by_path[ancestor])
        ordered.setdefault(row.path, row)
    return list(ordered.values())


def teacher_of(row: ModelRow, rows: Sequence[ModelRow], cfg: LeaderboardConfig) -> ModelRow:
    """The model ``row`` is compared with: cfg.baseline; else the teacher of its chain (the oldest ancestor
    shown with a score, else the oldest shown) or, with compare_with="parent", its nearest ancestor shown;
    else the first row."""
    by_path = {r.path: r for r in rows}
    if cfg.baseline:
        return _find(by_path, cfg.baseline, "--baseline")
    shown = [by_path[a] for a in row.ancestors if a in by_path]  # nearest first
    if not shown:
        return rows[0]
    if cfg.compare_with == "parent":
        return shown[0]
    scored = [a for a in shown if a.scores]
    return (scored or shown)[-1]


def _find(by_path: dict[Path, ModelRow], path: str, flag: str) -> ModelRow:
    """The row of the model directory ``path`` (given with ``flag``), or a CompressError."""
    row = by_path.get(Path(path).resolve())
    if row is None:
        raise CompressError(
            f"{flag} {path} is not among the models of the table, or has no evaluation or latency "
            "in its metrics.json; pass it with --runs and measure it first"
        )
    return row


def build_table(rows: Sequence[ModelRow], cfg: LeaderboardConfig, *, keep_unmeasured: bool = False) -> dict[str, Any]:
    """The leaderboard as a JSON-able dict: measured models, published rows, and the notes that explain them.

    ``keep_unmeasured`` lists the models with no evaluation or latency too (a recipe's
    report: every model it made), instead of leaving them out.
    """
    cfg.validate()
    kept = lineage_order([r for r in rows if keep_unmeasured or r.has_metrics])
    if not kept:
        raise CompressError(f"no model has a {cfg.split} evaluation or a latency result; nothing to put in a leaderboard")
    tasks = shown_tasks(kept, cfg)
    averaged = average_tasks(kept, tasks)
    known = {**{t: get_task(t) for t in tasks if t in TASKS}, **known_tasks(kept)}
    reference = _find({r.path: r for r in kept}, cfg.speed_reference, "--reference-model") if cfg.speed_reference else None
    models = [model_entry(r, teacher_of(r, kept, cfg), reference, tasks, averaged) for r in kept]
    table = {
        "kind": "leaderboard",
        "when": utc_now(),
        "point": {"batch": cfg.batch, "seq": cfg.seq},
        "split": cfg.split,
        "tasks": tasks,
        "task_names": {t: known[t].display for t in tasks},
        "task_metrics": {t: known[t].primary_metric for t in tasks},
        "own_tasks": [t for t in tasks if known[t].user],
        "average_tasks": averaged,
        "baseline": str(Path(cfg.baseline).resolve()) if cfg.baseline else None,
        "compared_with": "baseline" if cfg.baseline else cfg.compare_with,
        "speed_reference": reference.name if reference else None,
        "models": models,
        "published": published_entries(tasks, averaged, cfg.split, {t: known[t] for t in tasks}) if cfg.published else [],
        "skipped": [{"name": r.name, "path": str(r.path)} for r in rows if not (keep_unmeasured or r.has_metrics)],
        "keep_unmeasured": keep_unmeasured,
        "other_points": other_points(kept, cfg),
    }
    table["notes"] = measured_notes(table)
    table["published_notes"] = published_notes(table) if table["published"] else []
    return table


def model_entry(row: ModelRow, teacher: ModelRow, reference: ModelRow | None,
                tasks: Sequence[str], averaged: Sequence[str]) -> dict[str, Any]:
    """One measured model's numbers: metrics, average, retention and speed-ups (ratios as plain numbers)."""
    scores = {t: row.scores[t] for t in tasks if t in row.scores}
    average = mean_over(row.scores, averaged)
    teacher_average = mean_over(teacher.scores, averaged)
    to_teacher, same_teacher = speedup(row, teacher)
    to_reference, same_reference = speedup(row, reference) if reference else (None, True)
    retention = {t: 100 * r for t in tasks if (r := ratio(row.scores.get(t), teacher.scores.get(t))) is not None}
    avg_ratio = ratio(average, teacher_average)
    return {
        "published": False,
        "name": row.name,
        "path": str(row.path),
        "stage": row.stage,
        "method": row.method,
        "params": row.params,
        "params_source": row.params_source,
        "size_mb": row.size_mb,
        "scores": scores,
        "evals": {t: row.evals[t] for t in scores},
        "glue_avg": average,
        "teacher": teacher.name,
        "retention": retention,
        "retention_avg": None if avg_ratio is None else 100 * avg_ratio,
        "p50_ms": row.latency.p50_ms if row.latency else None,
        "backend": row.latency.backend if row.latency else None,
        "latency_run": row.latency.run if row.latency else None,
        "speedup_teacher": to_teacher,
        "speedup_teacher_same_run": same_teacher,
        "speedup_reference": to_reference,
        "speedup_reference_same_run": same_reference,
    }


def published_entries(tasks: Sequence[str], averaged: Sequence[str], split: str = "dev",
                      known: dict[str, Task] | None = None) -> list[dict[str, Any]]:
    """Published rows of ``split`` with a score on a shown task: their params, those scores and the same average.

    A score counts only for a task of the same metric: a preset's row for the preset (not a user's task that
    borrows its name), a user's dataset's row (its ``metric`` set) for a local task scored with that metric.
    """
    known = known or {}
    entries = []
    for ref in for_split(split):
        scores = {t: ref.scores[t] for t in tasks if t in ref.scores and _comparable(ref.metric, known.get(t))}
        if not scores:
            continue
        entries.append({
            "published": True,
            "model": ref.model,
            "params_m": ref.params_m,
            "split": ref.split,
            "scores": scores,
            "glue_avg": mean_over(ref.scores, averaged),
            "source": ref.source,
            "notes": ref.notes,
        })
    return entries


def _comparable(metric: str | None, task: Task | None) -> bool:
    """Whether a published score of ``metric`` (None: the preset's primary) can stand beside the local ``task``."""
    if task is None:
        return metric is None  # a preset column no model has a score in: its published rows still show
    return task.primary_metric == metric if metric else not task.user


def other_points(rows: Sequence[ModelRow], cfg: LeaderboardConfig) -> list[list[int]]:
    """(batch, seq) points measured for some model, when no model was measured at the table's point."""
    if any(r.latency for r in rows):
        return []
    return [list(p) for p in sorted({p for r in rows for p in r.latency_points})]


# ---------------------------------------------------------------------------- notes and Markdown


def _task_list(table: dict[str, Any], tasks: Sequence[str]) -> str:
    """ "SST-2 (accuracy), MRPC (F1)": tasks with their primary metric."""
    names = {"f1": "F1", "pearson": "Pearson", "matthews_correlation": "Matthews corr."}
    return ", ".join(f"{table['task_names'][t]} ({names.get(table['task_metrics'][t], table['task_metrics'][t])})"
                     for t in tasks)


def measured_notes(table: dict[str, Any]) -> list[str]:
    """Footnotes on how the measured table's averages and ratios were computed."""
    point, split = table["point"], table.get("split", "dev")
    mnli = f"; MNLI is reported on the matched {split} set" if "mnli" in table["tasks"] else ""
    notes = [f"Metrics: the latest {split} evaluation in each model's metrics.json, in percent{mnli}."]
    if table.get("own_tasks"):
        notes.append(f"Your own tasks ({', '.join(table['own_tasks'])}): the task each model folder records, scored with "
                     "its primary metric; they never enter the GLUE avg.")
    if len(table["average_tasks"]) >= 2:
        notes.append(f"GLUE avg: unweighted mean over {_task_list(table, table['average_tasks'])}, the GLUE tasks every "
                     "model with GLUE results was evaluated on (the published convention: CoLA Matthews corr., "
                     "MRPC F1, STS-B Pearson, accuracy elsewhere).")
    else:
        notes.append("GLUE avg: not computed; fewer than two GLUE tasks were evaluated on every model with GLUE results.")
    compared = table["compared_with"]
    whom = {"baseline": "the --baseline model, for every row",
            "teacher": "the teacher of the model's chain (its oldest ancestor in this table by compression.json "
                       f"parent links that has a {split} score), else the first row",
            "parent": "the model's parent (its nearest ancestor in this table by compression.json parent links), "
                      "else the first row"}[compared]
    notes.append(f"retention: the model's metric / its {compared}'s, in percent; for the GLUE avg the ratio of the two "
                 f"averages. The {compared} column names the model compared with: {whom}.")
    notes.append(f"p50 ms: median latency at batch {point['batch']}, seq {point['seq']} from the latest latency run "
                 f"of the model; speed-up = the {compared}'s (or reference's) p50 / this p50, from the latest latency "
                 "run that timed both.")
    if _cross_run(table):
        notes.append(f"Speed-ups marked {CROSS_RUN}: the two p50s come from different latency runs, so the ratio also carries "
                     "run-to-run drift (machine load, settings); time both models in one `compress latency` run "
                     "for a like-for-like ratio.")
    if table["other_points"]:
        measured = ", ".join(f"batch {b} seq {s}" for b, s in table["other_points"])
        notes.append(f"No latency at batch {point['batch']}, seq {point['seq']}; measured: {measured} "
                     "(choose one with --batch / --seq).")
    if table["skipped"]:
        names = ", ".join(s["name"] for s in table["skipped"])
        notes.append(f"Not shown (no {split} evaluation or latency in metrics.json): {names}.")
    unscored = [m["name"] for m in table["models"] if not m["scores"]]
    if table.get("keep_unmeasured") and unscored:
        notes.append(f"{NOT_EVALUATED}: no {split} evaluation in the metrics.json of {', '.join(unscored)}; "
                     "`compress eval` (in a recipe: an eval stage) gives a score, `compress latency` (a latency stage) a p50.")
    return notes


def _cross_run(table: dict[str, Any]) -> bool:
    """Whether some speed-up in the table compares p50s from different latency runs."""
    return any(
        (m["speedup_teacher"] is not None and not m["speedup_teacher_same_run"])
        or (m["speedup_reference"] is not None and not m["speedup_reference_same_run"])
        for m in table["models"]
    )


def published_notes(table: dict[str, Any]) -> list[str]:
    """Footnotes for the published table."""
    split = table.get("split", "dev")
    notes = [f"Copied from the cited sources (eval/references.py): other people's runs and hardware, on the {split} sets "
             "their sources name; never measured here and never part of the measured averages or ratios. No published "
             "latency is comparable with this machine, so these rows appear in the plots as dashed reference lines."]
    if len(table["average_tasks"]) >= 2:
        notes.append(f"GLUE avg over the same tasks as above ({_task_list(table, table['average_tasks'])}), "
                     "only where the source publishes all of them.")
    return notes


def _f(value: float | None, spec: str, missing: str = "n/a") -> str:
    """``value`` formatted with ``spec``, or ``missing``."""
    return missing if value is None else format(value, spec)


def _millions(count: int | None) -> float | None:
    """A count in millions (None stays None)."""
    return None if count is None else count / 1e6


def _cell(text: Any) -> str:
    """Text safe inside a Markdown table cell (pipes escaped)."""
    return str(text).replace("|", "\\|")


def _metric_header(table: dict[str, Any], task: str) -> str:
    """Column header of a task: "SST-2 (acc)", "MNLI-m (acc)", "MRPC (F1)"."""
    metric = table["task_metrics"][task]
    display = "MNLI-m" if task == "mnli" else table["task_names"][task]
    return f"{display} ({METRIC_LABELS.get(metric, metric)})"


def _retention_column(table: dict[str, Any]) -> tuple[str, Any]:
    """Header and getter of the retention column: the GLUE avg's, else the only task's."""
    if len(table["average_tasks"]) >= 2:
        return "retention (GLUE avg)", lambda m: m["retention_avg"]
    if len(table["tasks"]) == 1:
        task = table["tasks"][0]
        return f"retention ({table['task_names'][task]})", lambda m: m["retention"].get(task)
    return "retention", lambda m: None


def _speedup_cell(value: float | None, same_run: bool) -> str:
    """"4.00x", or "4.00x*" when the two p50s come from different latency runs."""
    return "n/a" if value is None else f"{value:.2f}x" + ("" if same_run else CROSS_RUN)


def _stage_cell(model: dict[str, Any]) -> str:
    """"distill / kd+hard" from compression.json's stage and method."""
    parts = [p for p in (model["stage"], model["method"]) if p]
    return " / ".join(parts) if parts else "—"


def measured_table(table: dict[str, Any]) -> list[str]:
    """Markdown lines of the measured models' table."""
    retention_header, retention = _retention_column(table)
    reference = table["speed_reference"]
    compared = table["compared_with"]
    # Kept without a score (keep_unmeasured): the cell says so; with no task at all, one column does.
    keep = table.get("keep_unmeasured", False)
    missing = NOT_EVALUATED if keep else "n/a"
    metric_headers = [_metric_header(table, t) for t in table["tasks"]] or ([f"{table.get('split', 'dev')} metric"] if keep else [])
    header = ["model", "stage / method", "params (M)", "size (MB)",
              *metric_headers, "GLUE avg", retention_header, compared,
              "p50 ms", "backend", f"speed-up vs {compared}"] + ([f"speed-up vs {reference}"] if reference else [])
    align = ["---", "---", "--:", "--:", *("--:" for _ in metric_headers), "--:", "--:", "---", "--:", "---", "--:"]
    lines = [_row(header), _row(align + (["--:"] if reference else []))]
    for m in table["models"]:
        metrics = [_f(m["scores"].get(t), ".2f", missing) for t in table["tasks"]] or ([missing] if keep else [])
        cells = [m["name"], _stage_cell(m), _f(_millions(m["params"]), ".2f"), _f(m["size_mb"], ".1f"),
                 *metrics, _f(m["glue_avg"], ".2f"),
                 _f(retention(m), ".1f") + ("%" if retention(m) is not None else ""), m["teacher"],
                 _f(m["p50_ms"], ".2f"), m["backend"] or "n/a",
                 _speedup_cell(m["speedup_teacher"], m["speedup_teacher_same_run"])]
        if reference:
            cells.append(_speedup_cell(m["speedup_reference"], m["speedup_reference_same_run"]))
        lines.append(_row(cells))
    return lines


def retention_table(table: dict[str, Any]) -> list[str]:
    """Markdown lines of per-task retention (only worth a table with two tasks or more)."""
    tasks = table["tasks"]
    lines = [_row(["model", table["compared_with"], *(_metric_header(table, t) for t in tasks)]),
             _row(["---", "---", *("--:" for _ in tasks)])]
    for m in table["models"]:
        lines.append(_row([m["name"], m["teacher"], *(_f(m["retention"].get(t), ".1f") for t in tasks)]))
    return lines


def published_table(table: dict[str, Any]) -> list[str]:
    """Markdown lines of the published rows, with their sources."""
    tasks = table["tasks"]
    lines = [_row(["model (published)", "params (M)", *(_metric_header(table, t) for t in tasks), "GLUE avg", "split", "source"]),
             _row(["---", "--:", *("--:" for _ in tasks), "--:", "---", "---"])]
    for p in table["published"]:
        lines.append(_row([p["model"], _f(p["params_m"], "g", "—"), *(_f(p["scores"].get(t), ".1f", "—") for t in tasks),
                           _f(p["glue_avg"], ".2f", "—"), p["split"], p["source"] + (f" ({p['notes']})" if p["notes"] else "")]))
    return lines


def _row(cells: Sequence[Any]) -> str:
    """One Markdown table row."""
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def format_markdown(table: dict[str, Any]) -> str:
    """The measured table, per-task retention, and the published table, each followed by its notes."""
    point = table["point"]
    lines = [f"## Measured here ({table.get('split', 'dev')} sets; latency at batch {point['batch']}, seq {point['seq']})", "",
             *measured_table(table), "", *(f"- {n}" for n in table["notes"])]
    if len(table["tasks"]) > 1:
        lines += ["", f"### Retention per task (% of the {table['compared_with']}'s metric)", "", *retention_table(table)]
    if table["published"]:
        lines += ["", "## Published (not measured here)", "", *published_table(table), "",
                  *(f"- {n}" for n in table["published_notes"])]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- plots


def plot_pareto(table: dict[str, Any], task: str, path: Path) -> Path | None:
    """Write :func:`pareto_figure` as a PNG; None (and nothing written) when it has nothing to plot."""
    fig = pareto_figure(table, task)
    if fig is None:
        return None
    out = save_figure(fig, path)
    _pyplot().close(fig)
    return out


def pareto_figure(table: dict[str, Any], task: str):
    """Metric vs p50 latency (log x) for one task: marker area ~ params, the Pareto front joined; the figure.

    Published results have no latency measured here, so they are dashed horizontal lines,
    each labelled on the line inside the axes. The legend goes where it covers no point and
    no label. None when no model has both the metric and a latency.
    """
    models = [m for m in table["models"] if task in m["scores"] and m["p50_ms"]]
    if not models:
        return None
    plt = _pyplot()
    # deferred: a heavy import, paid only where it is used
    from matplotlib.ticker import FuncFormatter

    fig, ax = plt.subplots(figsize=(7, 4.5))
    points = [(m["p50_ms"], m["scores"][task]) for m in models]
    largest = max((m["params"] or 0 for m in models), default=0) or 1
    sizes = [400 * (m["params"] or largest / 4) / largest for m in models]  # area ~ parameters
    ax.scatter(*zip(*points), s=sizes, alpha=0.6, edgecolors="black", zorder=3)
    names = [ax.annotate(m["name"], (x, y), textcoords="offset points", xytext=(6, 4), fontsize=8)
             for m, (x, y) in zip(models, points)]
    front = pareto_front(points)
    ax.plot([points[i][0] for i in front], [points[i][1] for i in front], "-", color="tab:red",
            linewidth=1, label="Pareto front", zorder=2)
    point = table["point"]
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))  # 20, not 2x10^1
    low, high = ax.get_xlim()
    if high / low < 30:  # within about a decade the minor ticks are the only labels: keep them readable
        ax.xaxis.set_minor_formatter(FuncFormatter(lambda x, _: "" if math.log10(x).is_integer() else f"{x:g}"))
    ax.set_xlabel(f"p50 latency (ms, log scale), batch {point['batch']}, seq {point['seq']}")
    ax.set_ylabel(_metric_header(table, task))
    split = table.get("split", "dev")
    ax.set_title(f"{table['task_names'][task]}: {split} metric vs latency (marker area ~ parameters)")
    ax.grid(alpha=0.3, which="both")
    published = [(p["scores"][task], p["model"]) for p in table["published"] if task in p["scores"]]
    if published:  # the legend's key to the dashed lines; each line carries its own label
        ax.plot([], [], "--", color="dimgrey", linewidth=0.9, label=f"published ({split} set, not timed here)")
    labels = label_hlines(ax, published, points, sizes, avoid=names)
    place_legend(ax, points, sizes, avoid=[*labels, *names], fontsize=7)
    return fig


def plot_all(table: dict[str, Any], directory: Path) -> dict[str, str]:
    """One Pareto plot per shown task that has something to plot; task -> file name."""
    written = {}
    for task in table["tasks"]:
        path = plot_pareto(table, task, Path(directory) / f"pareto-{task}.png")
        if path is not None:
            written[task] = path.name
    return written
