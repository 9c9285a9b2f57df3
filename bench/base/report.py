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


def render(state: dict[str, Any]) -> str:
    """The header (CPU, precision and why, reductions) and one row per finished model."""
    head, settings = state["header"], state["settings"]
    lines = [
        "# The base-size teacher (all-mpnet-base-v2) through every stage",
        "",
        f"{head['date']} · {head['cpu']} · {head.get('cores')} cores · {head['threads']} threads · "
        f"training in **{settings['precision']}** ({settings['precision_why']})",
        "",
        f"Command: `{head['command']}`",
        "",
        f"Reduced settings: at most {settings['max_train_examples'] or 'all'} training examples per task "
        f"(a seeded sample), epochs x {settings['epochs_scale']}; students without augmentation.",
        "",
        "| task | model | dev score | n train | epochs | precision | train s | ex/s |",
        "|---|---|---:|---:|---:|---|---:|---:|",
    ]
    for row in state["rows"].values():
        score = primary(row["task"], row.get("metrics"))
        cells = [row["task"], row["role"], "" if score is None else f"{score:.2f}", row.get("n_train") or "",
                 row.get("epochs") or "", row.get("precision") or "",
                 "" if row.get("seconds") is None else f"{row['seconds']:.0f}",
                 "" if row.get("examples_per_s") is None else f"{row['examples_per_s']:.1f}"]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"
