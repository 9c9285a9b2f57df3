"""The full-data GLUE report (bench/glue/run.py): one leaderboard table beside the published rows, speed, the goal.

``build(state, latency) -> report`` is pure (a run's rows and an optional ``compress latency`` report in,
JSON-able numbers out) and ``render(state, report)`` writes glue.md's Markdown. The scores, the GLUE
average, the ranking and the published rows are the toolkit leaderboard's (``compress.eval.leaderboard.build_table``
on one row per model role, its scores gathered over the tasks' folders): published dev rows stand in the dev
table beside the measured ones, published test rows (GLUE test server) in a block of their own, never averaged
or ranked with them. ``build(state, stored=old_report)`` re-renders a run whose model folders are gone: params
and speed as the stored report recorded them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from compress.core.formats.records import parent_path, read_compression, read_metrics
from compress.core.data.tasks import GLUE_TASKS, get_task
from compress.eval.leaderboard import LeaderboardConfig, build_table, mean_over, ratio
from compress.eval.leaderboard_render import average_cell
from compress.eval.leaderboard_rows import ModelRow, model_params
from compress.eval.references import Published, published, published_score

ROLES = {  # role -> table label; the teacher first: the leaderboard compares every row with its first
    "teacher": "teacher MiniLM-L6 (fp32)",
    "3L-384": "student 3L-384 (fp32)",
    "3L-384 int8": "student 3L-384 int8 (OpenVINO)",
    "2L-384": "student 2L-384 (fp32)",
    "2L-384 int8": "student 2L-384 int8 (OpenVINO)",
}
BERT_BASE = published("BERT-base-uncased")[0]  # the published row every student is held against
GOAL_MARGIN = 2.0  # points below the published MiniLM-L6 SST-2 dev accuracy
GOAL_SPEEDUP = 10.0  # x the teacher on its fastest fp32 backend, batch 1
POINT = (1, 128)  # (batch, seq) of the speed columns


def build(state: dict[str, Any], latency: dict | None = None, *, stored: dict[str, Any] | None = None,
          references: tuple[Published, ...] | None = None) -> dict[str, Any]:
    """The table (role rows with scores, GLUE avg, rank, % of BERT-base, % of own teacher, speed), the published dev
    rows beside them, the published test rows apart, the goal. ``stored``: an earlier report of the same run, whose
    params and speed stand in for model folders and a latency file that are not here; ``references``: the published
    rows to choose from (default: all of compress.eval.references)."""
    dirs = role_dirs(state["rows"])
    scored = {r: scores for r in ROLES if r in dirs and (scores := role_scores(state["rows"], r))}
    if not scored:
        return {"tasks": [], "average_tasks": [], "models": [], "published": [], "published_test": [], "ranking": [],
                "speed": {}, "goal": goal_verdict([], {}, reduced_settings(state))}
    stored = stored or {}
    known_params = {m["role"]: m.get("params") for m in stored.get("models", [])}
    rows = [ModelRow(path=Path(dirs[r][0]), name=ROLES[r], scores=scores, tasks={t: get_task(t) for t in scores},
                     evals={t: {"split": "dev", "n": state["rows"][f"{t}/{r}"].get("n_dev")} for t in scores},
                     params=_params(Path(dirs[r][0])) or known_params.get(r)) for r, scores in scored.items()]
    # retention against the first row: the teacher's, when it has one
    table = build_table(rows, LeaderboardConfig(), references=references)
    has_teacher = "teacher" in scored
    bert_avg = mean_over(BERT_BASE.scores, table["average_tasks"])
    speed = speeds(latency, dirs) if latency else stored.get("speed", {})
    only = table["tasks"][0] if len(table["tasks"]) == 1 else None  # one task: its ratios stand for the average's
    models = []
    for role, entry in zip(scored, table["models"]):
        retention = entry["retention"] if has_teacher else {}
        retention_avg = entry["retention_avg"] if has_teacher else None
        vs_bert = {t: 100 * v / BERT_BASE.scores[t] for t, v in entry["scores"].items() if t in BERT_BASE.scores}
        models.append({
            "role": role, "label": entry["name"], "scores": entry["scores"], "glue_avg": entry["glue_avg"],
            "avg_missing": entry["glue_avg_missing"], "rank": entry["rank"],
            "retention": retention, "retention_avg": retention.get(only) if only else retention_avg,
            "vs_bert": vs_bert, "vs_bert_avg": vs_bert.get(only) if only else _pct(ratio(entry["glue_avg"], bert_avg)),
            "params": entry["params"], "speed": speed.get(role),
        })
    reduced = reduced_settings(state)
    return {"tasks": table["tasks"], "task_names": table["task_names"], "task_metrics": table["task_metrics"],
            "average_tasks": table["average_tasks"], "bert_base_avg": bert_avg, "models": models,
            "published": table["published"], "published_test": table["published_other_split"],
            "ranking": table["ranking"], "speed": speed,
            "latency": _latency_summary(latency) if latency else stored.get("latency"), "reduced": reduced,
            "goal": goal_verdict(models, speed, reduced)}


def role_dirs(rows: dict[str, dict]) -> dict[str, list[str]]:
    """Each role's model folders, over the tasks (SST-2's first: the latency command times those)."""
    dirs: dict[str, list[str]] = {}
    for r in sorted(rows.values(), key=lambda r: r["task"] != "sst2"):
        dirs.setdefault(r["role"], []).append(r["model_dir"])
    return dirs


def role_scores(rows: dict[str, dict], role: str) -> dict[str, float]:
    """task -> the role's dev metric, over the tasks it was scored on."""
    return {r["task"]: r["value"] for r in rows.values() if r["role"] == role and r["value"] is not None}


def _params(folder: Path) -> int | None:
    """The model's parameter count as the leaderboard reads it (None for a folder that is gone)."""
    if not folder.is_dir():
        return None
    return model_params(folder, read_metrics(folder), read_compression(folder))[0]


def _pct(value: float | None) -> float | None:
    return None if value is None else 100 * value


# ---------------------------------------------------------------------------- speed (a compress latency report)


def speeds(latency: dict, dirs: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    """Per role: its fastest row at batch 1, seq 128, and the ratios of the BERT-base shape's and the teacher's
    fastest fp32 p50 (their rows, their fp32 exports, and the reference backends when they were the first model)."""
    rows = [r for r in latency.get("rows", []) if (r["batch"], r["seq"]) == POINT]
    owner = {Path(d).resolve(): role for role, ds in dirs.items() for d in ds}
    role_of = {r["model"]: _owner(Path(r["model"]), owner) for r in rows}
    reference = _reference_times(latency)
    first = latency["rows"][0]["model"] if latency.get("rows") else None
    base = [(r["p50_ms"], r["backend"]) for r in rows if r["precision"] == "fp32" and is_base_shape(Path(r["model"]))]
    base += reference if first and is_base_shape(Path(first)) else []
    teacher = [(r["p50_ms"], r["backend"]) for r in rows if r["precision"] == "fp32" and role_of[r["model"]] == "teacher"]
    teacher += reference if first and role_of.get(first) == "teacher" else []
    out = {}
    for role in dirs:
        own = [(r["p50_ms"], r["backend"], r.get("x_floor")) for r in rows if role_of[r["model"]] == role]
        # the first model's other fp32 backends (no floor: the reference timings carry none)
        own += [(p50, backend, None) for p50, backend in reference] if first and role_of.get(first) == role else []
        if not own:
            continue
        p50, backend, x_floor = min(own, key=lambda o: (o[0], o[1]))
        out[role] = {"p50_ms": p50, "backend": backend, "x_floor": x_floor,
                     "vs_base": min(base)[0] / p50 if base else None, "base_backend": min(base)[1] if base else None,
                     "vs_teacher": min(teacher)[0] / p50 if teacher else None,
                     "teacher_backend": min(teacher)[1] if teacher else None}
    return out


def _owner(path: Path, owner: dict[Path, str]) -> str | None:
    """The role of a timed folder: one of the role's folders, or an fp32 export of one (its parent link)."""
    path = path.resolve()
    if path in owner:
        return owner[path]
    parent = _export_parent(path)
    role = owner.get(parent) if parent else None
    return role if role and not role.endswith("int8") else None


def _reference_times(latency: dict) -> list[tuple[float, str]]:
    """The first model's p50 on each reference fp32 backend (``compress latency --reference-backends``)."""
    p50 = (latency.get("reference") or {}).get("p50_ms") or {}
    key = f"b{POINT[0]},s{POINT[1]}"
    return [(v[key], backend) for backend, v in p50.items() if v.get(key)]


def is_base_shape(path: Path) -> bool:
    """A BERT-base-shaped folder: 12 layers of hidden size 768 (its config.json, else its export parent's)."""
    config = path / "config.json"
    if not config.is_file():
        parent = _export_parent(path)
        return parent is not None and (parent / "config.json").is_file() and is_base_shape(parent)
    c = json.loads(config.read_text())
    return c.get("num_hidden_layers") == 12 and c.get("hidden_size") == 768


def _export_parent(path: Path) -> Path | None:
    """The folder ``path`` was exported from (compression.json's parent link), or None."""
    record = read_compression(path) if (path / "compression.json").is_file() else {}
    parent = parent_path(record) if record.get("stage") == "export" else None
    return Path(parent).resolve() if parent else None


def _latency_summary(latency: dict | None) -> dict | None:
    if not latency:
        return None
    return {"when": latency.get("when"), "cpu": (latency.get("hardware") or {}).get("cpu"),
            "threads": latency.get("threads"), "repeat_runs": latency.get("repeat_runs")}


def latency_command(state: dict[str, Any]) -> str:
    """The ``compress latency`` run whose latency.json fills the speed columns: the SST-2 teacher first, on every
    fp32 backend (the reference), the BERT-base shape as PyTorch, ONNX and OpenVINO, the fp32 students' OpenVINO
    exports (``latency_inputs``), then the students."""
    work = Path(state["work"])
    dirs = role_dirs(state["rows"])
    models = [*dirs.get("teacher", [])[:1], *(state.get("latency_inputs") or [str(work / "bert-base-shape")])]
    models += [ds[0] for role, ds in dirs.items() if role != "teacher"]
    return (f"compress latency --model {' '.join(models)} --reference-backends torch,onnxruntime,openvino "
            f"--batch 1 --seq 128 --repeat-runs 3 --no-record --out {work / 'latency'}")


# ---------------------------------------------------------------------------- the goal


def goal_verdict(models: list[dict], speed: dict[str, dict], reduced: list[str]) -> dict[str, Any]:
    """Met, not met or not measured: a student within GOAL_MARGIN points of the published MiniLM-L6 SST-2 dev
    accuracy at >= GOAL_SPEEDUP x its teacher on the teacher's fastest fp32 backend, batch 1."""
    published_sst2 = published_score("MiniLM-L6", "sst2")[0]
    bar = published_sst2 - GOAL_MARGIN
    goal = (f"a student within {GOAL_MARGIN:g} points of the published MiniLM-L6 SST-2 dev accuracy ({published_sst2:g}, "
            f"so >= {bar:g}) at >= {GOAL_SPEEDUP:g}x its teacher's fastest fp32 speed at batch 1 (seq {POINT[1]})")
    students = [m for m in models if m["role"] != "teacher" and "sst2" in m["scores"]]
    accurate = [m for m in students if m["scores"]["sst2"] >= bar]
    timed = [m for m in accurate if (speed.get(m["role"]) or {}).get("vs_teacher") is not None]
    if not students:
        verdict, why = "not measured", "no student was scored on SST-2"
    elif not accurate:
        best = max(students, key=lambda m: m["scores"]["sst2"])
        verdict, why = "not met", f"the best student on SST-2 is {best['label']} at {best['scores']['sst2']:.2f}, below {bar:g}"
        why += _speed_side(students, speed)
    elif not timed:
        names = ", ".join(f"{m['label']} ({m['scores']['sst2']:.2f})" for m in accurate)
        verdict, why = "not measured", f"{names} reach the accuracy; no latency of them against the teacher (--latency)"
    else:
        best = max(timed, key=lambda m: speed[m["role"]]["vs_teacher"])
        s = speed[best["role"]]
        verdict = "met" if s["vs_teacher"] >= GOAL_SPEEDUP else "not met"
        why = (f"{best['label']}: SST-2 {best['scores']['sst2']:.2f} at {s['vs_teacher']:.2f}x the teacher "
               f"({s['backend']} against the teacher's {s['teacher_backend']})")
    if reduced:
        why += "; under the reduced settings above"
    return {"goal": goal, "bar": bar, "verdict": verdict, "why": why}


def _speed_side(students: list[dict], speed: dict[str, dict]) -> str:
    """The goal's other side when no student is accurate enough: how fast the fastest timed student is."""
    timed = [m for m in students if (speed.get(m["role"]) or {}).get("vs_teacher") is not None]
    if not timed:
        return ""
    fastest = max(timed, key=lambda m: speed[m["role"]]["vs_teacher"])
    x = speed[fastest["role"]]["vs_teacher"]
    return (f"; on speed, the fastest student, {fastest['label']}, runs at {x:.2f}x the teacher "
            f"({'reaching' if x >= GOAL_SPEEDUP else 'below'} {GOAL_SPEEDUP:g}x)")


def reduced_settings(state: dict[str, Any]) -> list[str]:
    """Every way the run differs from the full one, as report lines (none: the full recipe on every local task)."""
    s, sizes = state["settings"], state["sizes"]
    lines = []
    left_out = [t for t in state["available"] if t not in s["tasks"]]
    if left_out:
        names = [get_task(t).display for t in s["tasks"]]
        lines.append(f"tasks: {', '.join(names)} only (--tasks; left out: {', '.join(get_task(t).display for t in left_out)})")
    cap = s.get("max_train_examples")
    cut = {t: n for t, n in sizes.items() if t in s["tasks"] and cap is not None and n > cap}
    if cut:
        why = f", chosen by --budget-hours {s['budget_hours']:g}" if s.get("budget_hours") is not None else ""
        lines.append(f"--max-train-examples {cap}{why}: a seeded sample of {cap} training examples for "
                     + ", ".join(f"{get_task(t).display} (of {n:,})" for t, n in cut.items()))
    if s.get("epochs_scale", 1.0) != 1.0:
        lines.append(f"--epochs-scale {s['epochs_scale']:g}: every recipe's epochs times {s['epochs_scale']:g} "
                     "(rounded, at least 1; the epochs column says what ran)")
    return lines


# ---------------------------------------------------------------------------- Markdown


def _f(value: float | None, spec: str = ".2f", missing: str = "—") -> str:
    return missing if value is None else format(value, spec)


def _x(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}x"


def _header(report: dict, task: str) -> str:
    metric = {"accuracy": "acc", "f1": "F1", "pearson": "Pearson", "matthews_correlation": "MCC"}
    return f"{report['task_names'][task]} ({metric.get(report['task_metrics'][task], report['task_metrics'][task])})"


def _avg(report: dict, row: dict) -> str:
    """A GLUE avg cell: the average, or "—" and the tasks of the average the row lacks."""
    names = {t: report["task_names"][t] for t in report["tasks"]}
    return average_cell(row["glue_avg"], row.get("avg_missing") or (), names, none="—")


def _source(p: dict) -> str:
    """A published row's source cell: paper and table (or that none is cited), the document copied, the split."""
    return p.get("cite") or f"{p['source']}; {p['split']} set"


def leaderboard_lines(report: dict) -> list[str]:
    """The dev table: the measured role rows, then the published dev rows, over the same task columns, GLUE avg and
    rank (both over the dev rows only), each published row with its source."""
    tasks = report["tasks"]
    head = ["model", "params (M)", *(_header(report, t) for t in tasks), "GLUE avg", "% of BERT-base (published)",
            "% of own teacher", "p50 ms b1 (backend)", "x BERT-base shape (fastest fp32)", "x teacher (fastest fp32)",
            "rank (dev GLUE avg)", "source (paper, table, split)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---", "--:", *("--:" for _ in tasks), "--:", "--:", "--:",
                                                            "---", "--:", "--:", "--:", "---"]) + "|"]
    for m in report["models"]:
        s = m["speed"] or {}
        timing = f"{s['p50_ms']:.2f} ({s['backend']})" if s else "—"
        cells = [m["label"], _f(m["params"] and m["params"] / 1e6, ".1f"), *(_f(m["scores"].get(t)) for t in tasks),
                 _avg(report, m), _f(m["vs_bert_avg"], ".1f"), _f(m["retention_avg"], ".1f"), timing,
                 _x(s.get("vs_base")), _x(s.get("vs_teacher")), _f(m.get("rank"), "d"), "measured here (dev)"]
        lines.append("| " + " | ".join(cells) + " |")
    for p in report["published"]:
        cells = [f"{p['model']} (published)", _f(p["params_m"], "g"), *(_f(p["scores"].get(t), ".1f") for t in tasks),
                 _avg(report, p), _f(_pct(ratio(p["glue_avg"], report["bert_base_avg"])), ".1f"), "—", "—", "—", "—",
                 _f(p.get("rank"), "d"), _source(p)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def published_test_lines(report: dict) -> list[str]:
    """The published GLUE test-server rows in a table of their own: scores and sources only, no average, no rank, no
    ratio to a dev row; then each row's note."""
    rows = report.get("published_test") or []
    if not rows:
        return []
    tasks = report["tasks"]
    lines = ["| model | params (M) | " + " | ".join(_header(report, t) for t in tasks) + " | source (paper, table, split) |",
             "|" + "|".join(["---", "--:", *("--:" for _ in tasks), "---"]) + "|"]
    for p in rows:
        cells = [f"{p['model']} (published, test)", _f(p["params_m"], "g"), *(_f(p["scores"].get(t), ".1f") for t in tasks),
                 _source(p)]
        lines.append("| " + " | ".join(cells) + " |")
    notes = {}
    for p in rows:  # rows sharing a note (TinyBERT-4 and -6) get one line
        if p.get("notes"):
            notes.setdefault(p["notes"], []).append(p["model"])
    lines += ["", "- Test-set figures, scored by the GLUE server on hidden labels: not comparable with the dev scores "
              "above, so none of them enters a GLUE avg, the ranking or a % column."]
    lines += [f"- {', '.join(models)}: {note}." for note, models in notes.items()]
    return lines


def per_task_lines(report: dict) -> list[str]:
    """Each row's metric per task against the published BERT-base and against its own teacher."""
    lines = ["| model | task | dev | BERT-base (published) | % of BERT-base | points | % of own teacher |",
             "|---|---|--:|--:|--:|--:|--:|"]
    for m in report["models"]:
        for t, v in m["scores"].items():
            bert = BERT_BASE.scores.get(t)
            lines.append(f"| {m['label']} | {_header(report, t)} | {v:.2f} | {_f(bert, '.1f')} | {_f(m['vs_bert'].get(t), '.1f')} "
                         f"| {_f(None if bert is None else v - bert, '+.2f')} | {_f(m['retention'].get(t), '.1f')} |")
    return lines


def recipe_lines(state: dict) -> list[str]:
    """What each model trained on: examples (of the full set), epochs, time."""
    lines = ["| task | role | train examples (of full set) | epochs | train min | dev n | dev | int8 drop (points) |",
             "|---|---|--:|--:|--:|--:|--:|--:|"]
    for r in state["rows"].values():
        full = state["sizes"].get(r["task"])
        n = "—" if r["n_train"] is None else f"{r['n_train']:,}" + (f" (of {full:,})" if full and r["n_train"] < full else "")
        lines.append(f"| {get_task(r['task']).display} | {r['role']} | {n} | {_f(r['epochs'], 'g')} | "
                     f"{_f(r['seconds'] and r['seconds'] / 60, '.1f')} | {_f(r['n_dev'], 'd')} | {_f(r['value'])} | "
                     f"{_f(r['drop'])} |")
    return lines


def render(state: dict[str, Any], report: dict[str, Any]) -> str:
    h, s, est = state["header"], state["settings"], state["estimate"]
    reduced = reduced_settings(state)
    averaged = ", ".join(report["task_names"][t] for t in report["average_tasks"]) if len(report["average_tasks"]) > 1 else ""
    no_data = [get_task(t).display for t in GLUE_TASKS if t not in state["available"] and t != "ax"]
    lines = [
        "# Full-data GLUE: MiniLM-L6 teachers, 3L-384 and 2L-384 students and their int8, beside the published rows", "",
        f"- date: {h['date']}; hardware: {h['cpu']} ({h['cores']} cores, no GPU; flags: "
        f"{', '.join(h.get('flags') or []) or 'none of interest'}); torch threads: {h['threads']}",
        f"- versions: {', '.join(f'{k} {v}' for k, v in h['packages'].items())}",
        f"- command: `{h['command']}`",
        f"- tasks: {', '.join(get_task(t).display for t in s['tasks'])} (no local data here: {', '.join(no_data) or 'none'})",
        "- reduced settings: " + ("none: every training set whole, every recipe's epochs" if not reduced else "; ".join(reduced)),
        *([f"- budget: --budget-hours {s['budget_hours']:g}; the estimate below "
           f"{'fits it' if est['hours'] <= s['budget_hours'] else 'exceeds it even at the smallest sample'}"]
          if s.get("budget_hours") is not None else []),
        f"- estimated cost of these settings: {est['hours']:.1f} h (teachers {sum(est['teacher_hours'].values()):.1f}, "
        f"students {sum(est['student_hours'].values()):.1f}, int8 {est['int8_hours']:.1f}); of the full recipe on the "
        f"same tasks: {state['estimate_full']['hours']:.1f} h; at the measured rates in bench/glue/run.py (2-core Zen 5, "
        "quiet machine; 2-5x longer under load)",
        "- teachers: all-MiniLM-L6-v2 fine-tuned, AdamW, batch 32, 10% warm-up then linear decay, best dev epoch kept; "
        "per task (lr, epochs, max length): " + "; ".join(f"{get_task(t).display} {r['lr']:g}, {r['epochs']}, {r['max_length']}"
                                                          for t, r in state.get("recipes", {}).items() if t in s["tasks"]),
        "- students: 12 heads of 32 cut from the teacher's layers (3L-384: layers 1, 3, 5), KD (T=2) + hard labels, "
        "3 epochs, lr 1e-4, batch 32, 4 augmented copies per example for a set of at most 10,000 (the toolkit's default); "
        "int8: OpenVINO + NNCF static, 128 calibration examples from the training set",
        "- every score: the full dev set, the task's official metric, in percent (CoLA Matthews corr., MRPC F1, "
        "STS-B Pearson, accuracy elsewhere)",
        "", "## Leaderboard (dev)", "", *(leaderboard_lines(report) if report["models"] else ["No model finished yet."]), "",
        (f"- GLUE avg: the unweighted mean over {averaged}: the GLUE tasks every measured row was scored on (the toolkit "
         "leaderboard's rule; WNLI counts like any other task when every row has it). A published row gets the average "
         "only where its source publishes all of those tasks; otherwise the cell names the tasks it lacks. rank: by "
         "that average, over the dev rows that have it (measured and published; ties share a rank)." if averaged else
         "- GLUE avg: not computed: fewer than two tasks were scored on every measured row; the ratios are the one task's."),
        f"- % of BERT-base: the row's GLUE avg over the published BERT-base-uncased row's over the same tasks "
        f"({_f(report.get('bert_base_avg'))}; {BERT_BASE.source}); % of own teacher: the ratio of the averages "
        "(retention); per task below.",
        "- speed: p50 at batch 1, seq 128 from the --latency file, each row on its fastest backend; x BERT-base shape and "
        "x teacher: their fastest fp32 backend's p50 over the row's (ratio of medians over the file's runs).",
        "- source: the paper and its table where the source names them (\"no paper table cited\": it names none), the "
        "document the figures were copied from, and the split.",
        *(["", "## Published GLUE test-set results (a block of its own: never averaged or ranked with the dev rows)", "",
           *published_test_lines(report)] if report.get("published_test") else []),
        "", "## Per task: against the published BERT-base and the own teacher", "", *per_task_lines(report),
        "", "## Training", "", *recipe_lines(state),
        "", "## Speed", "", *speed_lines(state, report),
        "", "## Goal", "", f"- {report['goal']['goal']}: **{report['goal']['verdict']}** ({report['goal']['why']})",
    ]
    return "\n".join(lines) + "\n"


FLOOR_TARGET = 1.5  # target 4: the best small int8 model within this many times its int8 floor


def speed_lines(state: dict, report: dict) -> list[str]:
    info = report.get("latency")
    if not info:
        return ["Not measured (no --latency). Time the models in one run, then re-run this command with "
                f"`--latency {Path(state['work']) / 'latency' / 'latency.json'}` (every stage is skipped):", "",
                f"    {latency_command(state)}"]
    lines = [f"From `compress latency` of {info['when']} on {info['cpu']}, {info['threads']} threads, "
             f"{info['repeat_runs']} runs; every ratio within that one file."]
    floors = {role: s["x_floor"] for role, s in report.get("speed", {}).items()
              if role.endswith("int8") and s.get("x_floor") is not None}
    if floors:
        best = min(floors, key=floors.get)
        lines += ["", "Target 4, the best small int8 model within 1.5x of its int8 floor (p50 over FLOPs / the run's "
                  "measured int8 peak): " + ", ".join(f"{ROLES[r]} {x:.1f}x" for r, x in floors.items())
                  + f": **{'met' if floors[best] <= FLOOR_TARGET else 'not met'}** (best: {ROLES[best]})."]
    return lines
