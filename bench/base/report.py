"""base.md: the base-size benchmark's table from base.json's rows (see :mod:`bench.base.run`)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from compress.core.data.tasks import get_task
from compress.core.errors import CompressError


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


def dev_chance(task: str, metrics: dict | None, glue: Path) -> dict | None:
    """Whether a GLUE dev result is no better than chance (:func:`compress.eval.metrics.chance_check`, on the dev
    labels read from ``glue``); None for an own-data task or metrics the rule does not read."""
    from compress.eval.metrics import chance_check  # deferred: for GLUE rows only

    if task not in GLUE_SIX or not metrics:
        return None
    return chance_check(get_task(task), metrics, _dev_labels(task, Path(glue)))


@functools.lru_cache(maxsize=None)
def _dev_labels(task: str, glue: Path) -> tuple:
    """A GLUE task's dev labels, read once per (task, folder): every row of the task is checked against them."""
    from compress.core.data.config import DataSource  # deferred: the data readers
    from compress.core.data.sources import load_split

    return tuple(load_split(get_task(task), "dev", DataSource(data_dir=str(glue)))["label"])


def chance_mark(chance: dict | None) -> str:
    """A row's note when its score is at chance: the rule it fell under."""
    rule = str(chance["rule"]).replace("|", "\\|") if chance else ""  # "|spearmanr| < 10" inside a table cell
    return f"at chance ({rule})" if chance and chance.get("at_chance") else ""


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
INT8_DROP = 1.0  # points of the task's metric an int8 may lose against its fp32
INT8_SPEED = 1.8  # its speed-up over its own fp32's fastest, wanted on a CPU with VNNI
INT8_GOAL = f"every int8 within {INT8_DROP:g} point of its fp32 and >= {INT8_SPEED}x faster on a VNNI CPU"
STUDENT_SHAPES = tuple(role for _, role, _, _ in GOALS if role != "teacher")


def scores(state: dict[str, Any]) -> dict[str, dict[str, float]]:
    """role -> task -> dev score, for every finished model."""
    table: dict[str, dict[str, float]] = {}
    for row in state["rows"].values():
        value = primary(row["task"], row.get("metrics"))
        if value is not None:
            table.setdefault(row["role"], {})[row["task"]] = value
    return table


def read_speed(folder: Path) -> dict[str, Any] | None:
    """speed.json of a results folder (written by :mod:`bench.base.speed`), or None where the speed step has not run."""
    path = folder / "speed.json"
    if not path.is_file():
        return None
    return read_object(path, "roles", "run python -m bench.base.speed again")


def read_object(path: Path, key: str, advice: str) -> dict[str, Any]:
    """A results file that must be a JSON object holding the object ``key``; refused in one line with ``advice``."""
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as error:
        raise CompressError(f"{path} is not valid JSON ({error}); {advice}") from None
    if not isinstance(state, dict) or not isinstance(state.get(key), dict):
        raise CompressError(f"{path} has no '{key}' object; {advice}")
    return state


def _timed_on(speed: dict[str, Any]) -> str:
    """Which models were timed and on what CPU: every speed clause says so."""
    return f"timed on {speed['task']}'s models, {speed['cpu']}"


def speed_clause(speed: dict[str, Any] | None, role: str, floor: float) -> str:
    """A student's speed clause: the teacher's fastest fp32 over its own at batch 1 and 32, met when both reach
    ``floor``."""
    ups = ((speed or {}).get("roles", {}).get(role) or {}).get("speedup")
    if not ups:
        whose = "" if speed is None else f"no {role} in speed.json; "
        return f"speed-up not measured yet ({whose}>= {floor}x wanted)"
    verdict = "met" if all(v >= floor for v in ups.values()) else "not met"
    numbers = " and ".join(f"{v:.2f}x at batch {b}" for b, v in ups.items())
    return f"speed {verdict}: {numbers} against >= {floor}x ({_timed_on(speed)})"


def int8_speed_clause(speed: dict[str, Any] | None) -> str:
    """The int8 speed clause: every int8 over its own fp32's fastest at batch 1 and 32, judged on a VNNI CPU only."""
    roles = (speed or {}).get("roles", {})
    missing = [f"{s} int8" for s in STUDENT_SHAPES if not (roles.get(f"{s} int8") or {}).get("speedup_vs_fp32")]
    if speed is None or missing:
        whose = "" if speed is None else f"no {', '.join(missing)} in speed.json; "
        return f"speed-up not measured yet ({whose}>= {INT8_SPEED}x on a VNNI CPU wanted)"
    ratios = [(v, f"{s} int8", b) for s in STUDENT_SHAPES for b, v in roles[f"{s} int8"]["speedup_vs_fp32"].items()]
    low, role, batch = min(ratios)
    numbers = f"lowest {low:.2f}x ({role} at batch {batch}) against >= {INT8_SPEED}x"
    if not speed.get("vnni"):
        return f"speed not judged: the CPU has no VNNI ({numbers}; {_timed_on(speed)})"
    return f"speed {'met' if low >= INT8_SPEED else 'not met'}: {numbers} ({_timed_on(speed)})"


def int8_line(table: dict[str, dict[str, float]], speed: dict[str, Any] | None) -> str:
    """The int8 goal: its largest drop against its fp32 over every task with both scores, and its speed clause."""
    roles = [r for s in STUDENT_SHAPES for r in (s, f"{s} int8")]
    missing = [t for t in GLUE_SIX if any(t not in table.get(r, {}) for r in roles)]
    if missing:
        accuracy = f"accuracy not measured yet (no student or int8 score on {', '.join(missing)})"
    else:
        drops = [(table[s][t] - table[f"{s} int8"][t], s, t) for s in STUDENT_SHAPES
                 for t in table[s] if t in table[f"{s} int8"]]
        drop, shape, task = max(drops)
        verdict = "met" if drop <= INT8_DROP else "not met"
        accuracy = f"accuracy {verdict}: largest drop {drop:.2f} points ({shape} on {task}) against {INT8_DROP:.2f}"
    return f"- {INT8_GOAL}: {accuracy}; {int8_speed_clause(speed)}"


def goal_lines(state: dict[str, Any], speed: dict[str, Any] | None = None) -> list[str]:
    """Each goal met, not met, or not measured yet (which tasks are missing), with its numbers.

    ``speed``: speed.json's content (:func:`read_speed`), whose speed-ups judge the speed clauses; None: not measured.
    """
    table = scores(state)
    teacher = table.get("teacher", {})
    lines = []
    for what, role, (kind, floor), speed_floor in GOALS:
        mine = table.get(role, {})
        missing = [t for t in GLUE_SIX if t not in mine or t not in teacher]
        if missing:
            whose = role if role == "teacher" else f"{role} or teacher"
            if speed is not None and speed_floor:
                lines.append(f"- {what}: accuracy not measured yet (no {whose} score on {', '.join(missing)}); "
                             f"{speed_clause(speed, role, speed_floor)}")
            else:
                lines.append(f"- {what}: not measured yet (no {whose} score on {', '.join(missing)})")
            continue
        average = sum(mine[t] for t in GLUE_SIX) / len(GLUE_SIX)
        reference = sum(teacher[t] for t in GLUE_SIX) / len(GLUE_SIX)
        wanted = floor if kind == "absolute" else floor * reference
        verdict = "met" if average >= wanted else "not met"
        speed_note = f"; {speed_clause(speed, role, speed_floor)}" if speed_floor else ""
        lines.append(f"- {what}: accuracy {verdict}: {average:.2f} against {wanted:.2f}{speed_note}")
    lines.append(int8_line(table, speed))
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
            + (f"teachers at lr {run['teacher_lr']:g}; " if run.get("teacher_lr") is not None else "") +
            f"students without augmentation · `{run['command']}`")


def render(state: dict[str, Any], speed: dict[str, Any] | None = None) -> str:
    """The runs (CPU, precision and why, reductions), one row per finished model numbered by its run, and the goals
    (``speed``: speed.json's content, or None)."""
    made_by = runs(state)
    lines = ["# The base-size teacher (all-mpnet-base-v2) through every stage", "",
             "Runs (each row names the run that made it):", "",
             *(run_line(i, r) for i, r in enumerate(made_by, 1)), "",
             "| task | model | dev score | n train | epochs | precision | train s | ex/s | run | note |",
             "|---|---|---:|---:|---:|---|---:|---:|---:|---|"]
    for row in state["rows"].values():
        score = primary(row["task"], row.get("metrics"))
        number = made_by.index(row["run"]) + 1 if row.get("run") in made_by else ""
        cells = [row["task"], row["role"], "" if score is None else f"{score:.2f}", row.get("n_train") or "",
                 row.get("epochs") or "", row.get("precision") or "",
                 "" if row.get("seconds") is None else f"{row['seconds']:.0f}",
                 "" if row.get("examples_per_s") is None else f"{row['examples_per_s']:.1f}", number,
                 chance_mark(row.get("chance"))]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    lines += ["", "## Goals", "", *goal_lines(state, speed)]
    return "\n".join(lines) + "\n"
