"""The base benchmark's speed goals, measured and judged: ``python -m bench.base.speed`` (``make bench-base-speed``).

The goals time each student against the teacher's fastest fp32, at batch 1 on the real dev lengths and at batch 32:
6L-768 >= 1.9x, 6L-384 >= 5x, 3L-384 >= 10x, and every int8 >= 1.8x over its own fp32 on a VNNI CPU. Speed depends on
shapes, not weights, so the folders of one task (``--task``, under ``--work``, as ``python -m bench.base`` left them)
stand for every task. The protocol:

1. Each fp32 model (the teacher, 6L-768, 6L-384, 3L-384) gets the deployable exports it lacks, by the toolkit's own
   ``compress export --format onnx / openvino / ctranslate2``, into ``<work>/<task>/speed/<role>-<format>`` (kept: a
   re-run reuses them). An export the toolkit refuses (CTranslate2 converts no MPNet: the teacher and the 6L-768) is
   left out of the timing and its one-line reason recorded.
2. One ``compress latency`` call times every folder (each fp32 model and its exports, each int8 folder) on the real
   inputs of ``--lengths`` (by default the task's dev set): batch 1 one input at a time, batch 32 sorted by length
   and padded per batch. Every ratio so comes from one run in one state of the machine. ``--batch 1,32`` at the
   task's max length comes along (a latency call always times a grid point); the goals read the real inputs only.
   latency.json, latency.md and command.txt go to ``<out>/latency``.
3. From its real-input rows: each model's fastest folder per batch size (the least p50 over its folders: per input
   at batch 1, per batch at 32); each student's speed-up (its fastest fp32, and its int8) as the teacher's fastest
   fp32 p50 over its own; each int8's over its own fp32's fastest. A speed clause is met when it holds at both batch
   sizes. The int8 clause is judged on a CPU with VNNI only (``compress.core.hardware.precisions().vnni``); on
   another its numbers are given and the clause is left open.

speed.json and speed.md go to ``--out`` (the results folder of ``python -m bench.base``); where base.json is there,
base.md is rendered again with the measured clauses. ``--dry-run`` prints the commands and runs nothing.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.base.report import GOALS, INT8_SPEED, int8_speed_clause, read_speed, render, speed_clause
from bench.base.run import STUDENTS, TASKS, previous_state
from bench.glue.run import GLUE_ORDER, done
from compress.core.errors import CompressError
from compress.core.formats.writes import write_json_atomic, write_text_atomic
from compress.core.hardware import precisions

EXPORT_FORMATS = ("onnx", "openvino", "ctranslate2")
BATCHES = (1, 32)  # the goals' two batch sizes: batch 1 on real lengths, and the sorted --lengths-batch pass
FP32_ROLES = ("teacher", *STUDENTS)
INT8_ROLES = tuple(f"{shape} int8" for shape in STUDENTS)
CLI = [sys.executable, "-m", "compress.cli"]


@dataclass(frozen=True)
class Timed:
    """One folder the latency call may hold: whose model it is and in which form."""

    role: str  # teacher, a student shape, or "<shape> int8"
    form: str  # torch (the model folder itself), an export format, or int8 (bench.base's OpenVINO int8 folder)
    folder: Path


@dataclass(frozen=True)
class SpeedSettings:
    """What the latency call times on, and how long it may take per point."""

    task: str
    lengths: str  # a GLUE task whose dev set --data-dir holds, or a file of inputs
    data_dir: Path
    out: Path  # the results folder: speed.json, speed.md, speed-<task>/ (the latency run)
    repeats: int = 10
    max_seconds: float = 10.0
    bursts: int = 1



def latency_dir(settings) -> Path:
    """Where the one latency call writes: named by the timed task, beside (never over) an earlier run's latency/."""
    return settings.out / f"speed-{settings.task}"

def plan(work: Path, task: str) -> list[Timed]:
    """Every folder the latency call may hold, in its order: the teacher first (the latency table's reference)."""
    root = work / task
    sources = {"teacher": root / "teacher", **{shape: root / f"student-{shape}" for shape in STUDENTS}}
    folders = []
    for role, source in sources.items():
        folders.append(Timed(role, "torch", source))
        folders += [Timed(role, fmt, root / "speed" / f"{role}-{fmt}") for fmt in EXPORT_FORMATS]
    folders += [Timed(f"{shape} int8", "int8", root / f"student-{shape}-int8") for shape in STUDENTS]
    return folders


def default_lengths(task: str, work: Path, data_dir: Path) -> str:
    """The task's dev set as ``--lengths`` takes it: a GLUE task by name, an own-data task by its dev file."""
    if task in GLUE_ORDER:
        return task
    if task == "banking77":  # repaired and split by bench.base into the work folder
        return str(work / "banking77" / "data" / "dev.csv")
    return str(data_dir.parent / task / "dev.conll")


def check_sources(folders: list[Timed], task: str) -> None:
    """Refuse, in one line, a run whose models are not all finished."""
    missing = [t.role for t in folders if t.form not in EXPORT_FORMATS and not done(t.folder)]
    if missing:
        where = folders[0].folder.parent
        raise CompressError(f"no finished model folder for {', '.join(missing)} under {where} (no compression.json): "
                            f"run python -m bench.base --tasks {task} first, or time another --task")


def export_command(source: Path, target: Timed) -> list[str]:
    """The ``compress export`` call that writes ``target`` from its fp32 model folder."""
    # A folder left unfinished (no compression.json) by a killed export is replaced.
    again = ["--overwrite"] if target.folder.exists() else []
    return [*CLI, "--quiet", "export", "--model", str(source), "--format", target.form, "--out", str(target.folder),
            *again]


def refusal_line(stderr: str, code: int) -> str:
    """The export's one-line reason: its last line on stderr without the command's prefix."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    if not lines:
        return f"compress export ended with exit status {code} and no message"
    return lines[-1].split(": error: ", 1)[-1]


def make_exports(folders: list[Timed], *, dry_run: bool) -> list[dict[str, Any]]:
    """Each export folder kept, made, refused (with its reason) or, on a dry run, to make (its command printed)."""
    sources = {t.role: t.folder for t in folders if t.form == "torch"}
    records = []
    for target in folders:
        if target.form not in EXPORT_FORMATS:
            continue
        record = {"role": target.role, "format": target.form, "folder": str(target.folder)}
        if done(target.folder):
            records.append({**record, "status": "kept"})
            continue
        command = export_command(sources[target.role], target)
        if dry_run:
            print(shlex.join(command))
            records.append({**record, "status": "to make"})
            continue
        print(f"== export {target.role} as {target.form}", flush=True)
        result = subprocess.run(command, stderr=subprocess.PIPE, text=True, check=False)
        if result.returncode == 0 and done(target.folder):
            records.append({**record, "status": "made"})
        else:
            reason = refusal_line(result.stderr or "", result.returncode)
            print(f"bench.base.speed: no {target.form} export of {target.role}: {reason}", file=sys.stderr)
            records.append({**record, "status": "refused", "reason": reason})
    return records


def timed_folders(folders: list[Timed], exports: list[dict[str, Any]]) -> list[Timed]:
    """The folders of the latency call: every model folder and every export not refused."""
    refused = {r["folder"] for r in exports if r["status"] == "refused"}
    return [t for t in folders if str(t.folder) not in refused]


def latency_command(timed: list[Timed], settings: SpeedSettings) -> list[str]:
    """The one ``compress latency`` call over every folder: real lengths at batch 1 and 32, the task's max length."""
    return [*CLI, "latency", "--model", *(str(t.folder) for t in timed), "--batch", ",".join(map(str, BATCHES)),
            "--seq", str(TASKS[settings.task].max_length), "--lengths", settings.lengths,
            "--data-dir", str(settings.data_dir), "--lengths-batch", str(BATCHES[1]),
            "--repeats", str(settings.repeats), "--max-seconds", f"{settings.max_seconds:g}",
            "--bursts", str(settings.bursts), "--out", str(latency_dir(settings))]


# ---------------------------------------------------------------------------- latency.json -> speed.json


def folder_rows(latency: dict[str, Any], timed: list[Timed]) -> list[dict[str, Any]]:
    """Each timed folder's backend and real-input p50 (ms) and sentences/s per batch size, from latency.json."""
    real = latency.get("real_rows") or []
    if not real:
        raise CompressError("latency.json has no real-input rows (real_rows): time the folders again with "
                            "python -m bench.base.speed, which passes --lengths")
    out = []
    for t in timed:
        found = {int(r["batch"]): r for r in real if Path(r["model"]) == t.folder}
        lacking = [str(b) for b in BATCHES if b not in found]
        if lacking:
            raise CompressError(f"latency.json has no real-input row of {t.folder} at batch {', '.join(lacking)}: "
                                "time the folders again with python -m bench.base.speed")
        out.append({"role": t.role, "form": t.form, "folder": str(t.folder), "backend": found[1]["backend"],
                    "p50_ms": {str(b): found[b]["p50_ms"] for b in BATCHES},
                    "sentences_per_s": {str(b): found[b].get("sentences_per_s") for b in BATCHES}})
    return out


def fastest(rows: list[dict[str, Any]], role: str) -> dict[str, dict[str, Any]]:
    """Per batch size, ``role``'s folder with the least p50: its form, backend, folder and p50."""
    mine = [r for r in rows if r["role"] == role]
    if not mine:
        raise CompressError(f"latency.json has no folder of {role}: time the folders again with "
                            "python -m bench.base.speed")
    best = {}
    for b in map(str, BATCHES):
        row = min(mine, key=lambda r: r["p50_ms"][b])
        best[b] = {"form": row["form"], "backend": row["backend"], "folder": row["folder"], "p50_ms": row["p50_ms"][b]}
    return best


def summarize(latency: dict[str, Any], timed: list[Timed], exports: list[dict[str, Any]], *, vnni: bool, task: str,
              command: str, timing_command: str | None = None) -> dict[str, Any]:
    """speed.json: every folder's p50s, each model at its fastest, its speed-ups, and the goals' speed clauses."""
    rows = folder_rows(latency, timed)
    roles: dict[str, dict[str, Any]] = {}
    for role in (*FP32_ROLES, *INT8_ROLES):
        roles[role] = {"precision": "int8" if role in INT8_ROLES else "fp32", "fastest": fastest(rows, role)}
    teacher = roles["teacher"]["fastest"]
    for role, entry in roles.items():
        mine = entry["fastest"]
        if role != "teacher":  # the teacher's fastest fp32 p50 over this model's fastest
            entry["speedup"] = {b: teacher[b]["p50_ms"] / mine[b]["p50_ms"] for b in mine}
        if role in INT8_ROLES:  # its own fp32's fastest over it
            own = roles[role.removesuffix(" int8")]["fastest"]
            entry["speedup_vs_fp32"] = {b: own[b]["p50_ms"] / mine[b]["p50_ms"] for b in mine}
    hardware = latency.get("hardware") or {}
    cpu = hardware.get("cpu", "unknown CPU")
    if hardware.get("microarchitecture") and hardware["microarchitecture"] != "unknown":
        cpu = f"{cpu} ({hardware['microarchitecture']})"
    speed = {"task": task, "when": latency.get("when"), "cpu": cpu, "flags": hardware.get("flags", []), "vnni": vnni,
             "real_inputs": latency.get("real_inputs"), "batches": list(BATCHES), "command": command,
             "latency_command": timing_command, "exports": exports, "folders": rows, "roles": roles}
    speed["goals"] = speed_goal_lines(speed)
    return speed


def speed_goal_lines(speed: dict[str, Any]) -> list[str]:
    """The goals' speed clauses alone, each met or not met with its numbers."""
    lines = [f"- {role} at >= {floor}x the teacher's fastest fp32: {speed_clause(speed, role, floor)}"
             for _, role, _, floor in GOALS if floor]
    lines.append(f"- every int8 >= {INT8_SPEED}x over its own fp32 on a VNNI CPU: {int8_speed_clause(speed)}")
    return lines


def render_speed(speed: dict[str, Any]) -> str:
    """speed.md: the run, every folder's p50s (each model's fastest in bold), each model at its fastest, the goals."""
    real = speed.get("real_inputs") or {}
    refused = [e for e in speed["exports"] if e["status"] == "refused"]
    lines = ["# Speed of the base benchmark's models against the teacher's fastest fp32", "",
             f"- timed {speed['when']} on {speed['cpu']}; flags: {', '.join(speed['flags']) or 'none'}; "
             f"VNNI: {'yes' if speed['vnni'] else 'no (the int8 clause is judged on a VNNI CPU only)'}",
             f"- one `compress latency` call over every folder below (speed-{speed['task']}/command.txt), on {real.get('source')}: "
             f"{real.get('n')} inputs, batch 1 one at a time (p50 per input), batch 32 sorted by length and padded "
             "per batch (p50 per batch)",
             f"- speed depends on shapes, not weights: the {speed['task']} models stand for every task",
             *(f"- no {e['format']} export of {e['role']}: {e['reason']}" for e in refused),
             f"- command: `{speed['command']}`", "",
             "## Every folder (p50 ms on the real inputs)", "",
             "| model | form | backend | batch 1 | batch 32 |", "|---|---|---|--:|--:|"]
    for row in speed["folders"]:
        best = speed["roles"][row["role"]]["fastest"]
        cells = [row["role"], row["form"], row["backend"]]
        for b in map(str, speed["batches"]):
            value = f"{row['p50_ms'][b]:.2f}"
            cells.append(f"**{value}**" if best[b]["folder"] == row["folder"] else value)
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## Each model at its fastest", "",
              "Speed-ups: the teacher's fastest fp32 p50 over the model's (vs teacher), its own fp32's fastest over an "
              "int8's (vs its fp32).", "",
              "| model | batch | fastest | p50 ms | vs teacher | vs its fp32 |", "|---|--:|---|--:|--:|--:|"]
    for role, entry in speed["roles"].items():
        for b in map(str, speed["batches"]):
            best = entry["fastest"][b]
            up = entry.get("speedup", {}).get(b)
            own = entry.get("speedup_vs_fp32", {}).get(b)
            lines.append(f"| {role} | {b} | {best['form']} ({best['backend']}) | {best['p50_ms']:.2f} | "
                         f"{'' if up is None else f'{up:.2f}x'} | {'' if own is None else f'{own:.2f}x'} |")
    lines += ["", "## Goals (speed clauses)", "", *speed["goals"]]
    return "\n".join(lines) + "\n"


def write_results(speed: dict[str, Any], out: Path) -> None:
    """speed.json and speed.md in ``out``; base.md rendered again where base.json is there."""
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "speed.json", speed)
    write_text_atomic(out / "speed.md", render_speed(speed))
    if (out / "base.json").is_file():
        write_text_atomic(out / "base.md", render(previous_state(out / "base.json"), read_speed(out)))


def run_speed(folders: list[Timed], settings: SpeedSettings, *, command: str, dry_run: bool) -> Path | None:
    """Exports, the one latency call, speed.json and speed.md; on a dry run the commands printed and None."""
    check_sources(folders, settings.task)
    exports = make_exports(folders, dry_run=dry_run)
    timed = timed_folders(folders, exports)
    latency = latency_command(timed, settings)
    if dry_run:
        print(shlex.join(latency))
        if any(e["status"] == "to make" for e in exports):
            print("bench.base.speed: a run leaves the folder of an export the toolkit refuses out of the latency call",
                  file=sys.stderr)
        return None
    (latency_dir(settings)).mkdir(parents=True, exist_ok=True)
    write_text_atomic(latency_dir(settings) / "command.txt", shlex.join(latency) + "\n")
    result = subprocess.run(latency, check=False)
    if result.returncode != 0:
        raise CompressError(f"compress latency ended with exit status {result.returncode} (its message is above); "
                            f"its command is in {settings.out / 'latency' / 'command.txt'}")
    path = latency_dir(settings) / "latency.json"
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise CompressError(f"cannot read {path} ({error}): run python -m bench.base.speed again") from None
    speed = summarize(report, timed, exports, vnni=precisions().vnni, task=settings.task, command=command,
                      timing_command=shlex.join(latency))
    write_results(speed, settings.out)
    return settings.out / "speed.md"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.base.speed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("runs/base"), help="python -m bench.base's model folders")
    parser.add_argument("--task", required=True, help="the task whose model folders are timed: " + ", ".join(TASKS))
    parser.add_argument("--lengths", help="real inputs, as compress latency takes them (default: the task's dev set)")
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data/glue"), help="the GLUE data folder")
    parser.add_argument("--out", type=Path, required=True, help="the results folder (speed.json, speed.md, speed-TASK/: the latency run)")
    parser.add_argument("--repeats", type=int, default=10, help="compress latency --repeats")
    parser.add_argument("--max-seconds", type=float, default=10.0, help="compress latency --max-seconds")
    parser.add_argument("--bursts", type=int, default=1, help="compress latency --bursts")
    parser.add_argument("--dry-run", action="store_true", help="print the export and latency commands, run nothing")
    args = parser.parse_args(argv)
    try:
        if args.task not in TASKS:
            raise CompressError(f"unknown --task {args.task}; tasks: {', '.join(TASKS)}")
        lengths = args.lengths or default_lengths(args.task, args.work, args.data_dir)
        settings = SpeedSettings(task=args.task, lengths=lengths, data_dir=args.data_dir, out=args.out,
                                 repeats=args.repeats, max_seconds=args.max_seconds, bursts=args.bursts)
        command = "python -m bench.base.speed " + " ".join(sys.argv[1:] if argv is None else argv)
        page = run_speed(plan(args.work, args.task), settings, command=command, dry_run=args.dry_run)
    except CompressError as error:
        print(f"bench.base.speed: {error}", file=sys.stderr)
        return 2
    if page is not None:
        print(page.read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
