"""base.md: the base-size benchmark's table from base.json's rows (see :mod:`bench.base.run`)."""

from __future__ import annotations

from typing import Any

from compress.core.data.tasks import get_task


def primary(task: str, metrics: dict | None) -> float | None:
    """The task's headline number from a dev record's metrics (GLUE's official metric; accuracy or F1 otherwise)."""
    if not metrics:
        return None
    try:
        name = get_task(task).primary_metric
    except Exception:  # an own-data task: not in the GLUE registry
        name = None
    for key in (name, "accuracy", "f1", "overall_f1", "spearmanr", "matthews_correlation"):
        if key and metrics.get(key) is not None:
            return float(metrics[key])
    return None


GLUE_SIX = ("sst2", "mrpc", "stsb", "cola", "rte", "wnli")
# The goals: (what, the models, a score floor as a share of the teacher's or an absolute average, the speed floor).
BERT_BASE_AVERAGE = 74.9  # BERT-base's six-task dev average in the leaderboard's published rows
DISTILBERT_AVERAGE = 72.2  # DistilBERT's (its paper, Table 1, dev)
GOALS = (
    ("teacher six-task average >= BERT-base's 74.9", "teacher", ("absolute", BERT_BASE_AVERAGE), None),
    ("6L-768 >= DistilBERT's 72.2 at >= 1.9x", "6L-768", ("absolute", DISTILBERT_AVERAGE), 1.9),
    ("6L-384 >= 97% of the teacher at >= 5x", "6L-384", ("share", 0.97), 5.0),
    ("3L-384 >= 95% of the teacher at >= 10x", "3L-384", ("share", 0.95), 10.0),
)


def scores(state: dict[str, Any]) -> dict[str, dict[str, float]]:
    """role -> task -> dev score, for every finished model."""
    table: dict[str, dict[str, float]] = {}
    for row in state["rows"].values():
        value = primary(row["task"], row.get("metrics"))
        if value is not None:
            table.setdefault(row["role"], {})[row["task"]] = value
    return table


def goal_lines(state: dict[str, Any]) -> list[str]:
    """Each goal met, not met, or not measured yet (which tasks are missing), with its numbers."""
    table = scores(state)
    teacher = table.get("teacher", {})
    lines = []
    for what, role, (kind, floor), speed in GOALS:
        mine = table.get(role, {})
        missing = [t for t in GLUE_SIX if t not in mine or t not in teacher]
        if missing:
            whose = role if role == "teacher" else f"{role} or teacher"
            lines.append(f"- {what}: not measured yet (no {whose} score on {', '.join(missing)})")
            continue
        average = sum(mine[t] for t in GLUE_SIX) / len(GLUE_SIX)
        reference = sum(teacher[t] for t in GLUE_SIX) / len(GLUE_SIX)
        wanted = floor if kind == "absolute" else floor * reference
        verdict = "met" if average >= wanted else "not met"
        speed_note = f"; speed-up not measured yet (>= {speed}x wanted)" if speed else ""
        lines.append(f"- {what}: accuracy {verdict}: {average:.2f} against {wanted:.2f}{speed_note}")
    return lines


def runs(state: dict[str, Any]) -> list[dict[str, Any]]:
    """The distinct runs that made the rows, in the order their rows appear."""
    seen: list[dict[str, Any]] = []
    for row in state["rows"].values():
        if row.get("run") and row["run"] not in seen:
            seen.append(row["run"])
    return seen


def run_line(number: int, run: dict[str, Any]) -> str:
    """One run: when, where, in what precision and why, its reductions and its command."""
    cap = run.get("max_train_examples") or "all"
    return (f"{number}. {run['date']} · {run['cpu']} · training in **{run['precision']}** ({run['precision_why']}) · "
            f"at most {cap} training examples per task (a seeded sample), epochs x {run['epochs_scale']}; "
            f"students without augmentation · `{run['command']}`")


def render(state: dict[str, Any]) -> str:
    """The runs (CPU, precision and why, reductions) and one row per finished model, numbered by its run."""
    made_by = runs(state)
    lines = ["# The base-size teacher (all-mpnet-base-v2) through every stage", "",
             "Runs (each row names the run that made it):", "",
             *(run_line(i, r) for i, r in enumerate(made_by, 1)), "",
             "| task | model | dev score | n train | epochs | precision | train s | ex/s | run |",
             "|---|---|---:|---:|---:|---|---:|---:|---:|"]
    for row in state["rows"].values():
        score = primary(row["task"], row.get("metrics"))
        number = made_by.index(row["run"]) + 1 if row.get("run") in made_by else ""
        cells = [row["task"], row["role"], "" if score is None else f"{score:.2f}", row.get("n_train") or "",
                 row.get("epochs") or "", row.get("precision") or "",
                 "" if row.get("seconds") is None else f"{row['seconds']:.0f}",
                 "" if row.get("examples_per_s") is None else f"{row['examples_per_s']:.1f}", number]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    lines += ["", "## Goals", "", *goal_lines(state)]
    return "\n".join(lines) + "\n"
