"""The ``compress`` command: a thin shell over the library.

Each subcommand parses its flags into the stage's frozen config, makes one library call
and says where the output went. Heavy libraries are imported only when a command runs,
so ``compress --help`` is instant. A :class:`CompressError` becomes one line on stderr
and exit status 2; Ctrl-C exits with 130.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from typing import Callable

from compress.core.errors import CompressError

PROG = "compress"


class Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line that points at --help."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _formatter(prog):
    return argparse.RawDescriptionHelpFormatter(prog, max_help_position=34, width=100)


COMMANDS: dict[str, tuple[str, str, Callable, Callable]] = {}
GROUPS = {"teacher": "build the teacher: pretrain a BERT from scratch (MLM+NSP) or fine-tune one on a task"}


def command(name: str, summary: str, examples: str):
    """Register ``add_arguments`` for subcommand ``name``; its ``run`` is attached below it."""

    def wrap(add: Callable) -> Callable:
        def attach(run: Callable) -> Callable:
            if name in COMMANDS:
                raise ValueError(f"command {name!r} registered twice")
            COMMANDS[name] = (summary, examples, add, run)
            return run

        add.run = attach
        return add

    return wrap


def _config_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="YAML/JSON file with options; flags given here override it")


def _say(message: str) -> None:
    print(message, file=sys.stderr)


# ---------------------------------------------------------------------------- tasks


@command("tasks", "list the tasks, their splits, labels and metrics", "compress tasks")
def _tasks_args(p):
    pass


@_tasks_args.run
def _tasks_run(args) -> int:
    from compress.core.tasks import TASKS

    rows = [("task", "kind", "labels (official order)", "metrics", "splits")]
    for t in TASKS.values():
        labels = ", ".join(t.label_names) or ("score 0-5" if t.kind == "regression" else "answer span")
        rows.append((t.name, t.kind, labels, ", ".join(t.metrics[:2]), ", ".join(s.name for s in t.splits)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return 0


# ---------------------------------------------------------------------------- init


@command(
    "init",
    "create a randomly initialised BERT of a named or explicit shape",
    """\
  compress init --shape base --task sst2 --tokenizer path/to/vocab.txt --out models/bert-base-random
  compress init --shape 4L-312 --tokenizer models/teacher --out models/tinybert-shape
  compress init --shape 6L-384-1536 --head base --tokenizer models/teacher --out models/encoder""",
)
def _init_args(p):
    p.add_argument("--shape", required=True, help="base, large, 2L-128, 4L-256, 4L-512, 8L-512, 6L-768, 4L-312, 6L-384, 3L-384, or LAYERSL-HIDDEN[-FFN]")
    p.add_argument("--tokenizer", required=True, metavar="PATH", help="model directory, tokenizer folder or vocab.txt whose vocabulary sizes the embedding")
    p.add_argument("--task", help="give the model this task's head and label names (e.g. sst2, stsb, squad)")
    p.add_argument("--head", choices=["base", "sequence-classification", "question-answering", "masked-lm", "pretraining"], help="head without a task (default: base)")
    p.add_argument("--max-positions", type=int, default=512, help="position embeddings (default: 512)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")


@_init_args.run
def _init_run(args) -> int:
    from students.presets import resolve_shape
    from teacher.create import create_model

    shape = resolve_shape(args.shape)
    out = create_model(
        shape, args.out, tokenizer=args.tokenizer, task=args.task, head=args.head, seed=args.seed,
        max_positions=args.max_positions, overwrite=args.overwrite,
    )
    print(f"wrote {shape.label} ({shape.layers} layers, hidden {shape.hidden}, {shape.heads} heads, FFN {shape.ffn}) to {out}")
    return 0


# ---------------------------------------------------------------------------- eval


@command(
    "eval",
    "evaluate a model directory on a GLUE task or SQuAD with the official metrics",
    """\
  compress eval --model models/sst2 --task sst2                       # hub data
  compress eval --model models/sst2 --task sst2 --data-dir ~/glue_data --max-examples 500
  compress eval --model models/mnli --task mnli --data-dir ~/glue_data  # matched + mismatched
  compress eval --model models/qa --task squad --data-file dev-v1.1.json
  compress eval --model models/sst2 --task sst2 --data-file reviews.csv --columns sentence=text,label=stars
  compress eval --model models/mnli --task mnli --split test --data-dir ~/glue_data --submission submit/
                                         # writes MNLI-m.tsv, MNLI-mm.tsv, AX.tsv and submission.zip""",
)
def _eval_args(p):
    from eval.evaluate import EvalConfig

    from compress.core.config import add_arguments

    p.add_argument("--model", required=True, metavar="DIR", help="model directory (config.json + weights + tokenizer)")
    _config_flag(p)
    add_arguments(p, EvalConfig)


@_eval_args.run
def _eval_run(args) -> int:
    from compress.core.config import from_args
    from eval.evaluate import EvalConfig, evaluate, missing_submission_files

    cfg = from_args(EvalConfig, args, args.config)
    records = evaluate(args.model, cfg)
    print(format_eval_table(records))
    for r in records:
        if "skipped" in r:
            _say(f"note: {r['task']} {r['split']} skipped: {r['skipped']}")
        elif "predictions" in r:
            _say(f"predictions: {r['predictions']}")
    if cfg.submission:
        missing = missing_submission_files(cfg.submission)
        _say(f"submission files in {cfg.submission}; zip: {cfg.submission}/submission.zip")
        if missing:
            _say(f"still missing for a complete GLUE submission: {', '.join(missing)}")
    if cfg.record and any(r.get("metrics") for r in records):
        _say(f"results appended to {args.model}/metrics.json")
    return 0


def format_eval_table(records: list[dict]) -> str:
    rows = [("task", "split", "n", "metric", "value")]
    for r in records:
        for name, value in (r.get("metrics") or {}).items():
            if name in ("n", "total", "missing"):
                continue
            rows.append((r["task"], r["split"], str(r.get("n", "")), name, f"{value:.2f}" if isinstance(value, float) else str(value)))
        if not r.get("metrics") and "skipped" not in r:
            rows.append((r["task"], r["split"], str(r.get("n", "")), "(no labels)", "predictions only"))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = [" | ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


# ---------------------------------------------------------------------------- latency


@command(
    "latency",
    "time models (each in its own process) against a GEMM peak measured in the same run",
    """\
  compress latency --model models/bert-base-random models/student --batch 1,32 --seq 128
  compress latency --model models/teacher --batch 1,8 --seq 64,128,256 --threads 2 --out reports/latency""",
)
def _latency_args(p):
    from compress.core.config import add_arguments
    from eval.latency import LatencyConfig

    p.add_argument("--model", required=True, nargs="+", metavar="DIR", help="model directories; the first is the reference of the ratio column")
    _config_flag(p)
    add_arguments(p, LatencyConfig)


@_latency_args.run
def _latency_run(args) -> int:
    from compress.core.config import from_args
    from eval.latency import LatencyConfig, format_markdown, measure_latency

    cfg = from_args(LatencyConfig, args, args.config)
    report = measure_latency(args.model, cfg)
    print(format_markdown(report))
    if cfg.out:  # measure_latency wrote the files
        _say(f"wrote {cfg.out}/latency.json and {cfg.out}/latency.md")
    return 0


# ---------------------------------------------------------------------------- teacher pretrain


@command(
    "teacher pretrain",
    "pretrain a BERT from scratch: WordPiece vocabulary, masked LM + next-sentence prediction, 128 -> 512 phases",
    """\
  compress teacher pretrain --corpus wiki/ --vocab-size 30522 --shape base --max-steps 1000000 --out models/bert
  compress teacher pretrain --corpus books.txt,wiki.txt --shape 4L-256 --max-steps 2000 --batch-size 128 \\
      --phase1-length 128 --phase2-length 512 --whole-word --out models/small-bert
  compress teacher pretrain --corpus wiki/ --tokenizer models/bert-base --shape 8L-512 --out models/medium
  compress teacher pretrain --corpus hf:wikitext:wikitext-103-raw-v1 --layers 6 --hidden 512 --heads 8 --out models/w6
  compress teacher pretrain --corpus data/bookcorpus-saved/ ...   # a datasets save_to_disk folder: rows are documents
  compress teacher pretrain ... --resume                  # after a crash: continue into the same --out
  torchrun --nproc_per_node 8 -m compress.cli teacher pretrain ... --precision bf16   # same global batch""",
)
def _pretrain_args(p):
    from compress.core.config import add_arguments
    from teacher.pretrain import PretrainConfig

    p.add_argument("--out", required=True, metavar="DIR", help="output model directory (BertForPreTraining + tokenizer)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    _config_flag(p)
    add_arguments(p, PretrainConfig)


@_pretrain_args.run
def _pretrain_run(args) -> int:
    from compress.core.artifacts import read_metrics
    from compress.core.config import from_args
    from teacher.pretrain import PretrainConfig, pretrain

    cfg = from_args(PretrainConfig, args, args.config)
    out = pretrain(args.out, cfg, overwrite=args.overwrite)
    heldout = [r for r in read_metrics(out) if r.get("task") == "pretraining"]
    if heldout:
        m = heldout[-1]["metrics"]
        print(f"held-out MLM accuracy {m['mlm_accuracy']:.2f}%, NSP accuracy {m['nsp_accuracy']:.2f}%")
    _say(f"wrote {out} (curves: {out}/pretraining_curves.png)")
    return 0


# ---------------------------------------------------------------------------- teacher finetune


@command(
    "teacher finetune",
    "fine-tune a BERT (directory, bert-base/bert-large alias or hub id) on a GLUE task or SQuAD",
    """\
  compress teacher finetune --model bert-base --task sst2 --out models/sst2          # hub model and data
  compress teacher finetune --model models/pretrained --task mrpc --data-dir ~/glue_data --out models/mrpc
  compress teacher finetune --model bert-base --task rte --data-dir ~/glue_data --grid --out models/rte
  compress teacher finetune --model models/minilm --task squad --train-file train.json --dev-file dev.json \\
      --lr 5e-5 --epochs 2 --out models/squad
  compress teacher finetune ... --resume        # continue an interrupted run into the same --out
  torchrun --nproc_per_node 2 -m compress.cli teacher finetune ...   # same global --batch-size""",
)
def _finetune_args(p):
    from compress.core.config import add_arguments
    from teacher.finetune import FinetuneConfig

    p.add_argument("--model", required=True, metavar="MODEL", help="model directory, alias (bert-base, bert-large, ...-cased) or hub id")
    p.add_argument("--out", required=True, metavar="DIR", help="output model directory (the best dev checkpoint)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    p.add_argument("--grid", action="store_true", help="sweep batch {16,32} x lr {5e-5,3e-5,2e-5} x epochs {2,3,4}; keep the best on dev")
    _config_flag(p)
    add_arguments(p, FinetuneConfig)


@_finetune_args.run
def _finetune_run(args) -> int:
    from compress.core.artifacts import read_metrics
    from compress.core.config import from_args
    from teacher.finetune import FinetuneConfig, finetune, finetune_grid

    cfg = from_args(FinetuneConfig, args, args.config)
    run = finetune_grid if args.grid else finetune
    out = run(args.model, args.out, cfg, overwrite=args.overwrite)
    records = [r for r in read_metrics(out) if r.get("kind") == "eval"]
    if records:
        print(format_eval_table(records))
    if args.grid and (out / "grid.md").is_file():
        print((out / "grid.md").read_text())
    _say(f"wrote {out}")
    return 0


# ---------------------------------------------------------------------------- distill


@command(
    "distill",
    "distil a fine-tuned teacher into a smaller student (logit KD, hidden/attention/embedding transfer)",
    """\
  compress distill --teacher models/sst2 --task sst2 --student 3L-384 --data-dir ~/glue_data --out models/sst2-3L
  compress distill --teacher bert-base-sst2/ --task sst2 --student 6L-768 --init-layers 0,2,4,7,9,11 --out models/distil
  compress distill --teacher models/mrpc --task mrpc --student 4L-312 --init random \\
      --losses kd,hard,hidden,attention,embedding --two-stage --out models/tinybert-mrpc      # TinyBERT
  compress distill --teacher models/sst2 --task sst2 --student 4L-312 --init models/general-4L --out models/s
  compress distill --teacher models/qa --task squad --student 6L-384 --train-file t.json --dev-file d.json --out models/qa6
  compress distill-general --teacher models/encoder --corpus wiki/ --student 4L-312 --out models/general-4L""",
)
def _distill_args(p):
    from compress.core.config import add_arguments
    from compress.distill import DistillConfig

    p.add_argument("--teacher", required=True, metavar="MODEL", help="fine-tuned teacher: directory, alias or hub id")
    p.add_argument("--out", required=True, metavar="DIR", help="output model directory (the best dev student)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    _config_flag(p)
    add_arguments(p, DistillConfig)


@_distill_args.run
def _distill_run(args) -> int:
    from compress.core.artifacts import read_metrics
    from compress.core.config import from_args
    from compress.distill import DistillConfig, distill

    cfg = from_args(DistillConfig, args, args.config)
    out = distill(args.teacher, args.out, cfg, overwrite=args.overwrite)
    results = read_metrics(out)
    print(format_eval_table([r for r in results if r.get("kind") == "eval"]))
    for r in results:
        if r.get("kind") == "retention" and r.get("ratio") is not None:
            print(f"retention: {r['student']:.2f} / {r['teacher']:.2f} = {100 * r['ratio']:.1f}% of the teacher's {r['metric']}")
    _say(f"wrote {out}")
    return 0


@command(
    "distill-general",
    "task-agnostic distillation of an encoder on raw text (MiniLM relations, or DistilBERT MLM + KD + cosine)",
    """\
  compress distill-general --teacher models/minilm --corpus wiki/,books/ --student 4L-312 --max-steps 2000 \\
      --out models/general-4L                                 # MiniLM: attention + value relations
  compress distill-general --teacher models/pretrained-bert --corpus wiki/ --student 6L-768 \\
      --init teacher-layers --losses kd,mlm,cosine --out models/distilbert   # DistilBERT (needs MLM heads)
  compress distill --teacher models/sst2 --task sst2 --student 4L-312 --init models/general-4L --out models/sst2-4L""",
)
def _distill_general_args(p):
    from compress.core.config import add_arguments
    from compress.distill import GeneralDistillConfig

    p.add_argument("--teacher", required=True, metavar="MODEL", help="teacher encoder: directory, alias or hub id")
    p.add_argument("--out", required=True, metavar="DIR", help="output encoder directory")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    _config_flag(p)
    add_arguments(p, GeneralDistillConfig)


@_distill_general_args.run
def _distill_general_run(args) -> int:
    from compress.core.config import from_args
    from compress.distill import GeneralDistillConfig, distill_general

    cfg = from_args(GeneralDistillConfig, args, args.config)
    out = distill_general(args.teacher, args.out, cfg, overwrite=args.overwrite)
    _say(f"wrote {out}; distil it on a task with: compress distill --init {out} ...")
    return 0


# ---------------------------------------------------------------------------- prune


@command(
    "prune",
    "remove attention heads, whole layers and FFN neurons (physically: smaller and faster), then optionally recover",
    """\
  compress prune --model models/sst2 --task sst2 --data-dir ~/glue_data --heads 0.5 --out models/sst2-h50
  compress prune --model models/sst2 --task sst2 --heads 0.5 --iterations 5 --recovery distill --out models/sst2-h50r
  compress prune --model models/mnli --task mnli --until 0.99 --out models/mnli-michel      # Michel et al. threshold
  compress prune --model models/sst2 --task sst2 --layers top:4 --out models/sst2-8L        # Poor Man's BERT
  compress prune --model models/sst2 --task sst2 --ffn 0.3 --ffn-scope uniform --out models/sst2-ffn70
  compress prune --model models/sst2 --task sst2 --heads 48 --head-criterion magnitude --layers alternate --out m/""",
)
def _prune_args(p):
    from compress.core.config import add_arguments
    from compress.prune import PruneConfig

    p.add_argument("--model", required=True, metavar="DIR", help="fine-tuned model directory")
    p.add_argument("--out", required=True, metavar="DIR", help="output model directory")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    _config_flag(p)
    add_arguments(p, PruneConfig)


@_prune_args.run
def _prune_run(args) -> int:
    from compress.core.artifacts import read_metrics
    from compress.core.config import from_args
    from compress.prune import PruneConfig, prune

    cfg = from_args(PruneConfig, args, args.config)
    out = prune(args.model, args.out, cfg, overwrite=args.overwrite)
    summary = next(r for r in read_metrics(out) if r.get("kind") == "prune")
    rows = [("", "params", summary["metric"])]
    rows.append(("before", f"{summary['params_before'] / 1e6:.2f}M", f"{summary['before']:.2f}"))
    rows.append(("pruned", f"{summary['params_after'] / 1e6:.2f}M", f"{summary['after_prune']:.2f}"))
    if summary.get("after_recovery") is not None:
        rows.append(("recovered", f"{summary['params_after'] / 1e6:.2f}M", f"{summary['after_recovery']:.2f}"))
    for r in rows:
        print(f"{r[0]:<10} {r[1]:>10} {r[2]:>10}")
    _say(f"wrote {out}")
    return 0


# ---------------------------------------------------------------------------- heads


@command(
    "heads",
    "analyse attention heads: what they attend to (Clark et al.), importance and the pruning curve (Michel et al.)",
    """\
  compress heads --model models/sst2 --task sst2 --data-dir ~/glue_data --out reports/heads-sst2
  compress heads --model models/mrpc --task mrpc --data-dir ~/glue_data --max-examples 128 --no-curve --out reports/h
  compress heads --model models/encoder --text sentences.txt --max-length 256 --out reports/heads-encoder""",
)
def _heads_args(p):
    from compress.core.config import add_arguments
    from eval.heads import HeadsConfig

    p.add_argument("--model", required=True, metavar="DIR", help="model directory (a fine-tuned one with --task)")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory: PNG plots, heads.json, summary.md")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    _config_flag(p)
    add_arguments(p, HeadsConfig, skip=("max_train_examples",))  # --importance-examples sizes the sample


@_heads_args.run
def _heads_run(args) -> int:
    from compress.core.config import from_args
    from eval.heads import HeadsConfig, analyze_heads

    cfg = from_args(HeadsConfig, args, args.config)
    out = analyze_heads(args.model, args.out, cfg, overwrite=args.overwrite)
    lines = (out / "summary.md").read_text(encoding="utf-8").splitlines()
    end = next((i for i, line in enumerate(lines) if line.startswith("## Importance")), len(lines))
    print("\n".join(lines[:end]).rstrip())
    _say(f"wrote {out} (summary.md, heads.json and the plots)")
    return 0


# ---------------------------------------------------------------------------- quantize


@command(
    "quantize",
    "int8 quantization (PyTorch dynamic, ONNX Runtime via Optimum, Neural Compressor) with output checks and an accuracy guard",
    """\
  compress quantize --model models/sst2 --backend onnxruntime --out models/sst2-int8          # dynamic, preset from CPU flags
  compress quantize --model models/sst2 --backend onnxruntime --scheme static --task sst2 --data-dir ~/glue_data \\
      --calibration-examples 256 --max-drop 0.5 --out models/sst2-int8-static
  compress quantize --model models/sst2 --backend torch --task sst2 --data-dir ~/glue_data --out models/sst2-torch-int8
  compress quantize --model models/sst2 --backend inc --scheme static --task sst2 --data-dir ~/glue_data --out models/inc
  compress quantize --model models/sst2 --backend inc --scheme qat --task sst2 --data-dir ~/glue_data --qat-steps 300 \\
      --calibration-examples 512 --out models/inc-qat     # quantization-aware training, same int8 graph
  compress eval --model models/sst2-int8 --task sst2 --data-dir ~/glue_data   # int8 directories evaluate like any other""",
)
def _quantize_args(p):
    from compress.core.config import add_arguments
    from compress.quantize import QuantizeConfig

    p.add_argument("--model", required=True, metavar="DIR", help="fp32 model directory")
    p.add_argument("--out", required=True, metavar="DIR", help="int8 model directory")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    _config_flag(p)
    add_arguments(p, QuantizeConfig)


@_quantize_args.run
def _quantize_run(args) -> int:
    from compress.core.artifacts import read_compression, read_metrics
    from compress.core.config import from_args
    from compress.quantize import QuantizeConfig, quantize
    from eval.latency import size_on_disk

    cfg = from_args(QuantizeConfig, args, args.config)
    out = quantize(args.model, args.out, cfg, overwrite=args.overwrite)
    record = read_compression(out)
    before, after = size_on_disk(args.model), size_on_disk(out)
    print(f"{record.get('backend')} {record.get('scheme')} int8: weights {before / 2**20:.1f} MB -> {after / 2**20:.1f} MB")
    evals = [r for r in read_metrics(out) if r.get("kind") == "eval"]
    if evals:
        print(format_eval_table(evals))
    _say(f"wrote {out}")
    return 0


# ---------------------------------------------------------------------------- leaderboard


@command(
    "leaderboard",
    "compare model directories with each other and with published results: tables, Pareto plots, report",
    """\
  compress leaderboard --runs runs/sst2 --out reports/sst2                    # every model dir under runs/sst2
  compress leaderboard --runs models/teacher models/student models/int8 --teacher models/teacher --out report/
  compress leaderboard --runs runs/ --reference-model models/bert-base-random --batch 1 --seq 128 --out report/""",
)
def _leaderboard_args(p):
    from compress.core.config import add_arguments
    from eval.leaderboard import LeaderboardConfig

    p.add_argument("--runs", required=True, nargs="+", metavar="DIR", help="model directories, or folders holding them")
    p.add_argument("--out", required=True, metavar="DIR", help="report directory (report.md, report.html, plots, JSON)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    _config_flag(p)
    add_arguments(p, LeaderboardConfig)


@_leaderboard_args.run
def _leaderboard_run(args) -> int:
    from compress.core.config import from_args
    from eval.leaderboard import LeaderboardConfig, leaderboard

    cfg = from_args(LeaderboardConfig, args, args.config)
    out = leaderboard(args.runs, args.out, cfg, overwrite=args.overwrite)
    from compress.demo import headline

    print(headline(out / "report.md"))
    _say(f"report: {out}/report.md and {out}/report.html")
    return 0


# ---------------------------------------------------------------------------- run (recipes)


@command(
    "run",
    "run a recipe: stages (pretrain, finetune, distill, prune, quantize, eval, latency, heads, leaderboard) chained",
    """\
  compress run recipes/bert-base-sst2.yaml --out runs/sst2 --var glue=~/glue_data
  compress run recipes/bert-base-sst2.yaml --out runs/sst2      # again: unchanged stages are skipped
  compress run my.yaml --out runs/x --force                      # re-run every stage
recipe format (YAML or JSON):
  name: sst2-study
  defaults: {task: sst2, data_dir: "{{glue}}"}        # {{var}} comes from --var; {{run_dir}} is the run directory
  stages:
    - {name: teacher, run: finetune, model: bert-base, config: {epochs: 3}}
    - {name: student, run: distill, teacher: "${teacher}", config: {student: 6L-384}}
    - {name: int8, run: quantize, model: "${student}", config: {backend: onnxruntime}}
    - {name: latency, run: latency, models: ["${teacher}", "${student}", "${int8}"]}""",
)
def _run_args(p):
    p.add_argument("recipe", metavar="RECIPE", help="YAML or JSON recipe file")
    p.add_argument("--out", required=True, metavar="RUN_DIR", help="run directory: one folder per stage + manifest.json + report")
    p.add_argument("--var", action="append", default=[], metavar="NAME=VALUE", help="value for {{NAME}} in the recipe (repeatable)")
    p.add_argument("--force", action="store_true", help="re-run every stage even when unchanged")


@_run_args.run
def _run_run(args) -> int:
    from compress.pipeline import run_recipe

    variables = {}
    for item in args.var:
        if "=" not in item:
            raise CompressError(f"--var expects NAME=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        variables[key.strip()] = value
    out = run_recipe(args.recipe, args.out, variables=variables, force=args.force, say=_say)
    report = out / "report.md"
    _say(f"run directory: {out}" + (f"; report: {report}" if report.is_file() else ""))
    return 0


# ---------------------------------------------------------------------------- demo


@command(
    "demo",
    "run the whole flow offline on a generated task: pretrain, fine-tune, distil, prune, quantize, measure, report",
    """\
  compress demo --out runs/demo                                  # generated data, a few minutes on 2 CPU cores
  compress demo --out runs/demo-sst2 --data-dir ~/glue_data       # the same pipeline on real SST-2
  compress demo --out runs/demo --overwrite""",
)
def _demo_args(p):
    p.add_argument("--out", default="runs/demo", metavar="DIR", help="run directory (default: runs/demo)")
    p.add_argument("--data-dir", metavar="DIR", help="a real GLUE folder with SST-2/ (default: generate the data)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    p.add_argument("--seed", type=int, default=0)


@_demo_args.run
def _demo_run(args) -> int:
    from compress.demo import headline, run_demo

    report = run_demo(args.out, overwrite=args.overwrite, seed=args.seed, data_dir=args.data_dir, say=_say)
    print(headline(report))
    _say(f"demo report: {report} (and {report.with_suffix('.html')})")
    return 0


# ---------------------------------------------------------------------------- main


def selected_command(argv: list[str]) -> str | None:
    """The registered command named by the leading words of ``argv`` (e.g. "teacher finetune")."""
    words = [w for w in argv[:2] if not w.startswith("-")]
    for n in (2, 1):
        name = " ".join(words[:n])
        if name in COMMANDS:
            return name
    return None


def build_parser(selected: str | None = None) -> argparse.ArgumentParser:
    """The full parser; with ``selected``, only that command's options are built (and imported)."""
    parser = Parser(
        prog=PROG,
        formatter_class=_formatter,
        description=textwrap.dedent(
            """\
            Turn a big BERT into small, fast, measured students.

            Every stage reads a model directory and writes a model directory (Hugging Face
            files + compression.json + metrics.json). Run `compress COMMAND --help` for the
            options and examples of each command."""
        ),
        epilog="examples:\n  compress tasks\n  compress eval --model models/sst2 --task sst2 --data-dir ~/glue_data\n"
        "  compress latency --model models/teacher models/student --batch 1,32 --seq 128",
    )
    from compress import __version__

    parser.add_argument("--version", action="version", version=f"compress {__version__}")
    subs = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    groups: dict[str, argparse._SubParsersAction] = {}
    for name, (summary, examples, add, run) in COMMANDS.items():
        words = name.split()
        target = subs
        if len(words) == 2:  # "teacher finetune": a group with its own subcommands
            if words[0] not in groups:
                group = subs.add_parser(
                    words[0], help=GROUPS[words[0]], description=GROUPS[words[0]] + ".", formatter_class=_formatter,
                )
                groups[words[0]] = group.add_subparsers(dest="subcommand", metavar="SUBCOMMAND", parser_class=Parser)
                group.set_defaults(run=None, group_parser=group)
            target = groups[words[0]]
        sub = target.add_parser(
            words[-1], help=summary, description=summary[0].upper() + summary[1:] + ".",
            epilog="examples:\n" + examples, formatter_class=_formatter,
        )
        if selected is None or selected == name:
            add(sub)  # imports the stage's config module: only for the command being run
        sub.set_defaults(run=run, command=name)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(selected_command(argv) or "")
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        (getattr(args, "group_parser", None) or parser).print_help()
        return 2
    try:
        return int(args.run(args) or 0)
    except CompressError as err:
        print(f"{PROG} {args.command}: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print(f"{PROG} {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
