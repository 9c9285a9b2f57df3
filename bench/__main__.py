"""The headline benchmark in one command: teachers, students, pruning, int8 on every engine, one latency table.

    python -m bench --data ../shared/data                       # or: make bench DATA=../shared/data
    python -m bench --data ../shared/data --work runs/bench --out bench/results/$(date +%F) \
        --auto runs/auto/sst2-b8 --retention bench/results/DATE/retention/retention.json,OTHER/retention.json

The model-producing stages run as a recipe (``compress run``): re-running skips every
stage whose inputs and config are unchanged. Reduced settings for a 2-core CPU (so that
the whole benchmark fits in 170 minutes), all reported in the output: SST-2 training is
a seeded sample of 20,000 sentences (max length 64); MRPC and STS-B train on their full
training sets; the teacher is not head-pruned (a 20-minute stage whose model was never
near the Pareto front); only the final models of the pruning chains get int8 versions.
Only the teachers the targets use are trained (SST-2, and MRPC and STS-B for the int8
drops), and the 3L-384 on MRPC and STS-B too (no augmentation), so that target 2 judges a
student's int8 on three tasks as well as the teacher's; the other tasks' teachers and students are the retention
benchmark's: the retention.json files given with ``--retention`` (none given, no per-task section). The
last stage is ``compress auto`` under a budget relative to the teacher (speed-up >= 8x at
batch 1, 20-minute limit); its choice joins the table beside the hand-made students (and
any ``--auto`` folders). Every SST-2 model is timed in PyTorch, as ONNX and as OpenVINO IR
(fp32) and as ONNX Runtime and OpenVINO + NNCF int8, ``--runs`` times, beside the BERT-base
shape on every fp32 backend and on the SST-2 dev set's real sentences; then target 5's two
sides (the teacher's fp32 backends, the fastest students) are timed again, taking turns.

Writes ``report.md`` (the table, the five targets met or not with their numbers, the
per-task students of ``--retention``, a profile), ``bench.json`` and the Pareto plot to ``--out``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path

from bench.headline import TASKS, build_results, write_results
from bench.teachers import SST2_TRAIN, TEACHER_RECIPE, minilm_path
from compress.pipeline import run_recipe

# The auto-chosen row: `compress auto` under a budget relative to the teacher (so it means the same on a faster or
# slower machine), on the students' SST-2 sample, within a time limit: its share of `make bench`'s time.
AUTO_STAGE = "auto-sst2"
AUTO_BUDGET = "speedup>=8x@b1,s128"
AUTO_TIME_LIMIT = "20m"


def recipe(minilm: Path, glue: Path) -> dict:
    """The model-producing part of the benchmark as a recipe."""
    def data(task):
        extra = {"max_train_examples": SST2_TRAIN, "max_length": 64} if task == "sst2" else {"max_length": 128}
        return {"task": task, "data_dir": str(glue), **extra}

    stages = [
        {"name": f"teacher-{t}", "run": "finetune", "model": str(minilm),
         "config": {**data(t), "batch_size": 32, "warmup_ratio": 0.1, "seed": 42, **TEACHER_RECIPE[t]}}
        for t in TASKS
    ]
    sst2 = data("sst2")
    student_3l = {"student": "3L-384", "init": "teacher-layers", "init_layers": [1, 3, 5], "losses": ["kd", "hard"],
                  "epochs": 3, "lr": 1e-4, "batch_size": 32}
    recover_from_teacher = {"recovery": "distill", "recovery_teacher": "${teacher-sst2}", "epochs": 3, "lr": 1e-4}
    stages += [
        {"name": "student-3L-384", "run": "distill", "teacher": "${teacher-sst2}", "config": {**sst2, **student_3l}},
        {"name": "student-4L-312", "run": "distill", "teacher": "${teacher-sst2}",  # cut from the teacher (--init teacher)
         "config": {**sst2, "student": "4L-312", "init": "teacher", "losses": ["kd", "hard"], "epochs": 3, "lr": 1e-4,
                    "batch_size": 32}},
        {"name": "student-2L-384", "run": "distill", "teacher": "${teacher-sst2}",  # the teacher's 12 heads of 32
         "config": {**sst2, "student": "2L-384", "heads": 12, "init": "teacher", "losses": ["kd", "hard"], "epochs": 3,
                    "lr": 1e-4, "batch_size": 32}},
        *({"name": f"student-3L-384-{t}", "run": "distill", "teacher": "${teacher-" + t + "}",  # target 2's int8 drops
           "config": {**data(t), **student_3l, "augment": 0}} for t in TASKS if t != "sst2"),
        {"name": "student-3L-384-heads50", "run": "prune", "model": "${student-3L-384}",
         "config": {**sst2, "remove_heads": 0.5, "recovery": "distill", "importance_examples": 2048, "epochs": 1, "lr": 5e-5}},
        # The 2L-384's FFN halved and its heads halved (6 of 12 in each layer), each cut recovered by 3 epochs of
        # distillation from the SST-2 teacher (a student's own teacher: 1 epoch from the unpruned student lost
        # accuracy). At SST-2's real lengths at batch 1, halving the heads cut the OpenVINO int8 time per sentence
        # by 18% in a probe.
        {"name": "student-2L-384-ffn50", "run": "prune", "model": "${student-2L-384}",
         "config": {**sst2, "remove_ffn": 0.5, "importance_examples": 2048, **recover_from_teacher}},
        {"name": "student-2L-384-ffn50-heads50", "run": "prune", "model": "${student-2L-384-ffn50}",
         "config": {**sst2, "remove_heads": 0.5, "head_scope": "layer", "importance_examples": 2048, **recover_from_teacher}},
        # Half of the remaining FFN (768 -> 384 neurons in each layer), recovered the same way: 86.12 against 86.24, and
        # a third less time per SST-2 dev sentence on OpenVINO int8 at batch 1 in a probe (2,785 against 1,858 sentences/s).
        {"name": "student-2L-384-ffn75-heads50", "run": "prune", "model": "${student-2L-384-ffn50-heads50}",
         "config": {**sst2, "remove_ffn": 0.5, "importance_examples": 2048, **recover_from_teacher}},
    ]
    # The pruning chains' intermediate models (3L-384 heads-50%, 2L-384 FFN-50% and FFN-50% heads-50%) stay fp32: their
    # int8 pairs were never the fastest at the retention bar and cost 6 latency rows of about a minute each.
    # Every model that gets an int8 version gets both: ONNX Runtime dynamic and OpenVINO + NNCF static. Target 2 judges a
    # shape by its fastest int8 backend, so both need every task's model; the fp32 model is also exported as ONNX and
    # OpenVINO IR (below) so that each int8 model is compared with the same model on its fastest fp32 backend.
    quantized = [(f"teacher-{t}", t) for t in TASKS] + [("student-3L-384", "sst2")] + \
                [(f"student-3L-384-{t}", t) for t in TASKS if t != "sst2"] + \
                [(name, "sst2") for name in ("student-4L-312", "student-2L-384", "student-2L-384-ffn75-heads50")]
    for name, task in quantized:
        stages.append({"name": f"{name}-int8", "run": "quantize", "model": "${" + name + "}",
                       "config": {**data(task), "backend": "onnxruntime", "scheme": "dynamic"}})
        stages.append({"name": f"{name}-int8-ov", "run": "quantize", "model": "${" + name + "}",
                       "config": {**data(task), "backend": "openvino", "scheme": "static"}})
    stages.append({"name": "teacher-sst2-int8-torch", "run": "quantize", "model": "${teacher-sst2}",
                   "config": {**sst2, "backend": "torch", "scheme": "dynamic"}})
    for name in ("teacher-sst2", "student-3L-384", "student-4L-312"):
        for fmt, suffix in (("onnx", "onnx"), ("openvino", "ov")):
            stages.append({"name": f"{name}-{suffix}", "run": "export", "model": "${" + name + "}", "config": {"format": fmt}})
    # compress auto on the same teacher and data, last: its final measurement times models, so no stage trains beside it.
    stages.append({"name": AUTO_STAGE, "run": "auto", "teacher": "${teacher-sst2}",
                   "config": {**sst2, "budget": AUTO_BUDGET, "backends": ["onnxruntime", "openvino"],
                              "time_limit": AUTO_TIME_LIMIT}})
    return {"name": "headline-benchmark", "report": False, "stages": stages}


def retention_files(values: list[str]) -> list[Path]:
    """The retention.json files of ``--retention`` (each value FILE or FILE,FILE,...; the option may repeat), in order."""
    return [Path(p) for value in values for p in value.split(",") if p]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--work", type=Path, default=Path("runs/bench"), help="model directories (not committed)")
    parser.add_argument("--out", type=Path, default=None, help="results (default: bench/results/<date>/headline)")
    parser.add_argument("--repeats", type=int, default=20, help="timed passes per model and point, in each run")
    parser.add_argument("--runs", type=int, default=3, help="interleaved latency runs (medians of run medians)")
    parser.add_argument("--auto", default="", help="auto-chosen model folders to measure beside the others (DIR,...)")
    parser.add_argument("--retention", action="append", default=[], metavar="FILE[,FILE...]",
                        help="the retention benchmark's retention.json files (comma-separated or repeated, e.g. runs "
                             "against re-trained teachers): the best row per task, against its strongest teacher, goes "
                             "in the report's per-task section (default: none, no such section)")
    args = parser.parse_args(argv)

    started = time.monotonic()
    retention = retention_files(args.retention)
    missing = [p for p in retention if not p.is_file()]
    if missing:  # before the recipe's hours, not after them
        print(f"bench: --retention {missing[0]} is not a file; pass the retention benchmark's retention.json", file=sys.stderr)
        return 2
    out = args.out or Path("bench/results") / dt.datetime.now(dt.timezone.utc).date().isoformat() / "headline"
    glue = (args.data / "glue").absolute()
    if not (glue / "SST-2" / "train.tsv").is_file():
        print(f"bench: no GLUE data in {glue}; pass --data pointing at the folder with glue/", file=sys.stderr)
        return 2
    run_recipe(recipe(minilm_path(), glue), args.work, say=lambda m: print(m, flush=True))
    auto = [Path(p) for p in args.auto.split(",") if p]
    missing = [p for p in auto if not (p / "config.json").is_file()]
    if missing:
        print(f"bench: {missing[0]} is not a model folder (no config.json); pass auto-chosen models with --auto", file=sys.stderr)
        return 2
    auto.insert(0, args.work / AUTO_STAGE)  # the recipe's own search (run_recipe stops on a failed stage)
    results = build_results(args.work, glue, repeats=args.repeats, runs=args.runs, auto=auto, retention=retention)
    manifest = json.loads((args.work / "manifest.json").read_text())["stages"]
    results["adopted"] = {k: v["adopted_from"] for k, v in manifest.items() if "adopted_from" in v}
    results["seconds"] = round(time.monotonic() - started, 1)
    results["command"] = "python -m bench " + " ".join(sys.argv[1:] if argv is None else argv)
    write_results(results, out)
    print((out / "report.md").read_text())
    print(json.dumps({"report": str(out / "report.md"), "minutes": round(results["seconds"] / 60, 1)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
