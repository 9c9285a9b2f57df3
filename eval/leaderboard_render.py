"""The leaderboard rendered: the notes under its tables, the Markdown tables, and the Pareto plots.

Everything here reads the JSON-able table dict ``compress.eval.leaderboard.build_table``
returns (the notes are computed once, by ``build_table``, and stored in it), so a table read
back from ``leaderboard.json`` renders the same; ``compress.eval.report`` writes the files.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from compress.eval.plots import _pyplot, label_hlines, place_legend, save_figure

CROSS_RUN = "*"  # marks a speed-up whose two p50s come from different latency runs
NOT_EVALUATED = "not evaluated"  # a metric cell of a model kept without a score (keep_unmeasured)

METRIC_LABELS = {"accuracy": "acc", "f1": "F1", "pearson": "Pearson", "matthews_correlation": "MCC",
                 "entity_f1": "entity F1", "micro_f1": "micro F1"}


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
             "latency is comparable with this machine, so these rows appear in the plots as dashed reference lines.",
             "source: the paper and its table where the source names them (\"no paper table cited\": it names none), "
             "and the document the figures were copied from."]
    if len(table["average_tasks"]) >= 2:
        notes.append(f"GLUE avg over the same tasks as above ({_task_list(table, table['average_tasks'])}), "
                     "only where the source publishes all of them; otherwise the cell names the tasks it lacks.")
    return notes


def other_split_notes(table: dict[str, Any]) -> list[str]:
    """Footnotes for the block of published rows of the other split (GLUE test beside a dev table)."""
    split = table.get("split", "dev")
    others = sorted({p["split"] for p in table["published_other_split"]})
    return [f"Published {' and '.join(others)}-set results, shown for reference only: a different split from the "
            f"{split} scores above (GLUE test is scored by the official server on hidden labels), so they never enter "
            f"a GLUE avg, the ranking, a retention or a plot beside the {split} rows."]


def average_cell(value: float | None, missing: Sequence[str], names: dict[str, str], *,
                 spec: str = ".2f", none: str = "n/a") -> str:
    """A GLUE avg cell: the average, or ``none`` followed by the tasks of the average the row lacks ("— (no STS-B)")."""
    if value is not None:
        return format(value, spec)
    return f"{none} (no {', '.join(names.get(t, t) for t in missing)})" if missing else none


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
                 *metrics, average_cell(m["glue_avg"], m.get("glue_avg_missing", ()), _short_names(table)),
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


def _short_names(table: dict[str, Any]) -> dict[str, str]:
    """task -> the name a cell uses for it ("MNLI-m" for MNLI, as its column does)."""
    return {t: "MNLI-m" if t == "mnli" else name for t, name in table["task_names"].items()}


def _source_cell(p: dict[str, Any]) -> str:
    """A published row's source: paper and table (or that none is cited), the document copied, its notes."""
    origin = p.get("origin") or p["source"]
    return origin + (f" ({p['notes']})" if p["notes"] else "")


def published_table(table: dict[str, Any], key: str = "published") -> list[str]:
    """Markdown lines of the published rows (``key``: the table's split, or ``published_other_split``), each with
    its split and source (paper, table, the document copied); the other split's rows get no GLUE avg column."""
    tasks, names = table["tasks"], _short_names(table)
    averaged = key == "published"
    avg = ["GLUE avg"] if averaged else []
    lines = [_row(["model (published)", "params (M)", *(_metric_header(table, t) for t in tasks), *avg, "split",
                   "source (paper, table)"]),
             _row(["---", "--:", *("--:" for _ in tasks), *(["--:"] if averaged else []), "---", "---"])]
    for p in table[key]:
        cell = [average_cell(p["glue_avg"], p.get("avg_missing", ()), names, none="—")] if averaged else []
        lines.append(_row([p["model"], _f(p["params_m"], "g", "—"), *(_f(p["scores"].get(t), ".1f", "—") for t in tasks),
                           *cell, p["split"], _source_cell(p)]))
    return lines


def ranking_table(table: dict[str, Any]) -> list[str]:
    """Markdown lines of the ranking by GLUE avg: measured and published rows of the table's split only."""
    lines = [_row(["rank", "model", "kind", "GLUE avg"]), _row(["--:", "---", "---", "--:"])]
    for r in table["ranking"]:
        kind = "published" if r["published"] else "measured here"
        lines.append(_row([r["rank"], r["name"], kind, f"{r['glue_avg']:.2f}"]))
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
    split = table.get("split", "dev")
    if table["published"]:
        lines += ["", "## Published (not measured here)", "", *published_table(table), "",
                  *(f"- {n}" for n in table["published_notes"])]
    if table.get("ranking"):
        lines += ["", f"### Ranking by GLUE avg ({split} rows only: measured and published, over the same tasks)", "",
                  *ranking_table(table)]
    if table.get("published_other_split"):
        others = " and ".join(sorted({p["split"] for p in table["published_other_split"]}))
        lines += ["", f"## Published on the {others} sets (a block of its own: never averaged or ranked with the "
                  f"{split} rows)", "", *published_table(table, "published_other_split"), "",
                  *(f"- {n}" for n in table["published_other_notes"])]
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


def plot_all(table: dict[str, Any], directory: Path) -> dict[str, str]:
    """One Pareto plot per shown task that has something to plot; task -> file name."""
    written = {}
    for task in table["tasks"]:
        path = plot_pareto(table, task, Path(directory) / f"pareto-{task}.png")
        if path is not None:
            written[task] = path.name
    return written
