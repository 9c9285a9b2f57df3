"""The leaderboard: every model's dev metrics, size and latency in one table, next to published results.

``leaderboard(run_dirs, out, cfg) -> out`` reads the ``metrics.json`` and
``compression.json`` of each model directory (nothing is re-run), builds the table and
writes ``report.md``, ``report.html`` and ``leaderboard.json`` (see ``compress.eval.report``).
The steps are importable on their own::

    rows = collect(["runs/sst2-study"], batch=1, seq=128)   # list[ModelRow]
    table = build_table(rows, LeaderboardConfig())            # plain JSON-able dict
    print(format_markdown(table))                             # compress.eval.leaderboard_render

This module collects the model directories and compares them (the table);
``compress.eval.leaderboard_rows`` reads one directory's sidecars into a :class:`ModelRow`,
and ``compress.eval.leaderboard_render`` renders the table (notes, Markdown, Pareto plots).

How the numbers are put together:

* metric: per task the primary metric of ``compress.core.data.tasks`` (CoLA Matthews corr.,
  MRPC F1, STS-B Pearson, SQuAD F1, accuracy elsewhere; MNLI = matched), from the
  model's latest evaluation record of the table's split (``split``: dev, the default, or
  test). A user's own task is the one its folder records (``compress.core.data.resolve.task_of_model``),
  never looked up in the registry; its column shows its primary metric (entity F1, micro F1, ...)
  after the benchmark tasks'.
* GLUE average: the unweighted mean over the GLUE tasks that every model with GLUE
  results was evaluated on, so all averages in one table cover the same tasks. Published
  rows get the same average only when they publish all of those tasks (a row without it
  lists the tasks it lacks, ``glue_avg_missing`` / ``avg_missing``); a user's tasks never enter it.
* ranking: the measured and published rows of the table's split that have the GLUE average,
  by that average (ties share a rank); ``ranking`` in the table, ``rank`` in each row.
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
``published``, and never enter a measured column, an average of measured rows, or a ratio. Published
rows of the other split (GLUE test beside a dev table) stand in a block of their own,
``published_other_split``: no average, no rank, never beside the table's own rows.

A model with no evaluation of the table's split and no latency is left out (and with no
such model at all the table is refused), unless ``keep_unmeasured``: then it is listed,
"not evaluated" in its metric cells. A recipe's own report is built that way, so a recipe without an eval or
latency stage still gets one, listing its models and stages.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Sequence

from compress.core.data.tasks import GLUE_TASKS, TASKS, Task, get_task
from compress.core.errors import CompressError
from compress.core.formats.artifacts import is_model_dir
from compress.core.formats.records import utc_now
from compress.eval.latency.rows import display_names
from compress.eval.leaderboard_render import measured_notes, other_split_notes, published_notes
from compress.eval.config import SPLITS, LeaderboardConfig
from compress.eval.leaderboard_rows import ModelRow, read_row
from compress.eval.references import ALL, Published


# ---------------------------------------------------------------------------- collecting


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


# ---------------------------------------------------------------------------- the table


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


def missing_from_average(scores: dict[str, float], tasks: Sequence[str]) -> list[str]:
    """The ``tasks`` of an average (two or more) that ``scores`` lacks: why a row has no average ([]: it has one,
    or no average is taken at all)."""
    return [t for t in tasks if t not in scores] if len(tasks) >= 2 else []


def rank_by_average(entries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rank the rows of one split by GLUE avg, highest first (ties share a rank); each entry's ``rank`` set (None
    without an average); the ranking, best first. Only the table's own split is ever passed in: rows of another
    split (GLUE test beside dev) are never ranked with it."""
    averages = [e["glue_avg"] for e in entries if e["glue_avg"] is not None]
    for entry in entries:
        avg = entry["glue_avg"]
        entry["rank"] = None if avg is None else 1 + sum(other > avg for other in averages)
    ranked = sorted((e for e in entries if e["rank"] is not None), key=lambda e: e["rank"])  # stable: ties keep order
    return [{"rank": e["rank"], "name": e["name"] if not e["published"] else e["model"], "published": e["published"],
             "glue_avg": e["glue_avg"]} for e in ranked]


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


def build_table(rows: Sequence[ModelRow], cfg: LeaderboardConfig, *, keep_unmeasured: bool = False,
                references: Sequence[Published] | None = None) -> dict[str, Any]:
    """The leaderboard as a JSON-able dict: measured models, published rows, and the notes that explain them.

    ``keep_unmeasured`` lists the models with no evaluation or latency too (a recipe's
    report: every model it made), instead of leaving them out. ``references`` are the published
    rows to choose from (default: all of ``compress.eval.references``).
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
    shown = {t: known[t] for t in tasks}
    refs = tuple(ALL if references is None else references)
    published = published_entries(tasks, averaged, cfg.split, shown, references=refs) if cfg.published else []
    # The other split's rows (GLUE test beside a dev table): their own block, no average (``averaged`` empty), no rank.
    other = [entry for split in SPLITS if split != cfg.split
             for entry in published_entries(tasks, (), split, shown, references=refs)] if cfg.published else []
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
        "published": published,
        "published_other_split": other,
        "ranking": rank_by_average([*models, *published]),  # the table's split only
        "skipped": [{"name": r.name, "path": str(r.path)} for r in rows if not (keep_unmeasured or r.has_metrics)],
        "keep_unmeasured": keep_unmeasured,
        "other_points": other_points(kept, cfg),
    }
    table["notes"] = measured_notes(table)
    table["published_notes"] = published_notes(table) if table["published"] else []
    table["published_other_notes"] = other_split_notes(table) if other else []
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
        "glue_avg_missing": missing_from_average(row.scores, averaged),
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
                      known: dict[str, Task] | None = None, *,
                      references: Sequence[Published] = ALL) -> list[dict[str, Any]]:
    """Published rows of ``split`` with a score on a shown task: their params, those scores, the same average (or the
    tasks of it they lack) and where they come from (paper, table, split, the document copied).

    A score counts only for a task of the same metric: a preset's row for the preset (not a user's task that
    borrows its name), a user's dataset's row (its ``metric`` set) for a local task scored with that metric.
    """
    known = known or {}
    entries = []
    for ref in (r for r in references if r.split == split):
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
            "avg_missing": missing_from_average(ref.scores, averaged),
            "rank": None,  # set by rank_by_average for the table's own split only
            "source": ref.source,
            "paper": ref.paper,
            "table": ref.table,
            "origin": ref.origin,
            "cite": ref.cite,
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
