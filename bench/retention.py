"""Retention on every task: what each distillation method adds, per GLUE task, for two student shapes.

    python -m bench.retention --data ../shared/data --teachers runs/retention --models runs/retention/students \
        --out bench/results/$(date +%F)/retention

Needs the teachers of ``bench.teachers`` (``teacher-TASK`` in --teachers, trained with the
same ``--max-train`` so teacher and students see the same training sample). For each
task and student shape, the rows add one method at a time:

* (a) KD + hard labels, one joint stage, no augmentation (the defaults before this benchmark);
* (b) + intermediate terms: hidden-state and attention-map MSE, joint with (a)'s terms;
* (c) + augmentation: TinyBERT's two stages, intermediate terms on the training set, then
  the prediction layer (KD + hard) on the set plus ``--augment`` teacher-labelled copies
  of each example (embedding-neighbour replacements: the teacher folder has no MLM head);
* (d) (c) from a general-distilled student (MiniLM attention + value relations on the
  text corpus, once per shape, shared by every task);
* (e) (a) on the augmented set, no intermediate terms: what augmentation does alone;
* (f) ``compress distill``'s defaults as they are now (chosen from rows a-e: (a)'s terms,
  3 epochs, and 4 augmented copies for a set of at most 10,000 examples);
* (g) (e) plus ``--transfer`` teacher-scored transfer examples: the other GLUE tasks' pairs
  for a pair task (their sentences for a single-sentence one), then pairs of consecutive
  corpus sentences;
* (h) (c) cut from the pretrained MiniLM encoder (``--init-from``) instead of the fine-tuned
  teacher, no general stage: (d)'s starting point before its general distillation, so
  (d) - (h) is what the general stage itself adds;
* (i) (f) from (d)'s general-distilled student: the defaults with the general stage first,
  without (d)'s intermediate stage;
* (j) (c) from the encoder of a student distilled on another task (``--task-init DIR``, its
  head dropped): intermediate-task transfer, as STILTs does with MNLI before RTE.

Then the best 3L-384 row of each task is quantized (ONNX Runtime dynamic int8) and scored.
Each row's dev metric, retention of its teacher's, and training seconds are recorded;
results are written after every row, so a stopped run keeps what it measured. The Goal
section (also over other runs' files, ``--goal-with``) judges every row of a task against
the strongest teacher any run had for it, and pools one recipe's seeds across runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from bench.pretrain import corpus_paths
from bench.teachers import minilm_path
from compress.core.formats.artifacts import load_tokenizer, save_model_dir
from compress.core.formats.records import compression_record, read_compression, read_metrics, utc_now
from compress.core.formats.writes import build_lock, write_json_atomic
from compress.core.config import from_dict
from compress.core.hardware import cpu_summary, package_versions
from compress.core.formats.runtime import load_model
from compress.core.data.tasks import get_task
from compress.distill.task import DistillConfig, distill
from compress.distill.general import GeneralDistillConfig, distill_general
from compress.quantize.config import QuantizeConfig
from compress.quantize.run import quantize

ROWS = {
    "a": "KD + hard, no augmentation (the former defaults)",
    "b": "+ hidden + attention",
    "c": "+ augmentation (two-stage)",
    "d": "+ general distillation first",
    "e": "(a) + augmentation, no intermediate terms",
    "f": "today's defaults",
    "g": "(e) + transfer texts",
    "h": "(c) cut from the pretrained encoder",
    "i": "(f) from the general-distilled student",
    "j": "(c) from another task's student (its encoder)",
}
PAIR_TASKS, SINGLE_TASKS = ("mrpc", "stsb", "rte"), ("sst2", "cola")
MAX_LENGTH = {"sst2": 64, "cola": 64}  # other tasks: 128
INTERMEDIATE = ["hidden", "attention"]
FROM_GENERAL = "di"  # the rows that start from the shape's general-distilled student


def save_results(store: Path, header: dict, results: dict, mine: set[str]) -> None:
    """Write ``results`` into ``store`` (retention.json) and its retention.md beside it.

    Several runs (one per task, shape or seed) may share a folder: each merges the file's rows
    into its own, keeping the file's except those it measured itself (``mine``), under a lock,
    so two runs saving at once cannot drop each other's rows."""
    with build_lock(store, "the retention results"):
        if store.is_file():
            before = json.loads(store.read_text())
            results.update({k: v for k, v in before["rows"].items() if k not in mine})
            commands = before["header"].get("commands", [before["header"]["command"]])
            header["commands"] = commands + [c for c in [header["command"]] if c not in commands]
            header["goal_with"] = sorted({*before["header"].get("goal_with", []), *header.get("goal_with", [])})
        write_json_atomic(store, {"header": header, "rows": results})
        (store.parent / "retention.md").write_text(render(results, header), encoding="utf-8")


def row_config(row: str, task: str, student: str, args, seed: int, *, general: Path | None,
               encoder: Path | None = None) -> dict:
    """The distill options of one row (each row adds to the one before)."""
    init = "teacher"  # 3L-384: teacher layers 1,3,5; 4L-312: teacher layers 1,2,4,5 cut to 312 wide (teacher-slices)
    cfg = {
        "task": task, "student": student, "init": init, "data_dir": str(args.data / "glue"),
        "max_length": MAX_LENGTH.get(task, 128), "max_train_examples": args.max_train, "epochs": args.epochs,
        "lr": args.lr, "batch_size": 32, "seed": seed, "cache_dir": str(args.cache), "losses": ["kd", "hard"],
    }
    if row in "ab":
        cfg["augment"] = 0  # distillation augments small sets by default now; (a) and (b) are the rows without
    if row in "bcdhj":
        cfg["losses"] = ["kd", "hard", *INTERMEDIATE]
    if row in "cdhj":
        cfg.update(two_stage=True, augment=args.augment, intermediate_epochs=args.epochs, epochs=args.prediction_epochs)
        if args.augment_intermediate:  # only when asked, so earlier runs' configs stay the same recipe
            cfg["augment_intermediate"] = True
    if row == "h":
        cfg["init_from"] = str(minilm_path())
    if row == "e":
        cfg.update(augment=args.augment, epochs=args.prediction_epochs)
    if row == "g":  # the other GLUE tasks' texts of the same shape (pairs for a pair task) and the corpus, teacher-scored
        family = PAIR_TASKS if task in PAIR_TASKS else SINGLE_TASKS
        sources = [f"task:{t}" for t in family if t != task] + [str(p) for p in corpus_paths(args.data)]
        cfg.update(augment=args.augment, epochs=args.prediction_epochs, transfer_text=sources,
                   transfer_examples=args.transfer)
    if row in "fi":  # nothing but what any run must say: the defaults decide the rest
        cfg = {k: cfg[k] for k in ("task", "student", "init", "data_dir", "max_length", "max_train_examples", "seed", "cache_dir")}
    if row in FROM_GENERAL:
        cfg["init"] = str(general)
    if row == "j":
        cfg["init"] = str(encoder)
    return cfg


def encoder_of(student_dir: Path, out: Path) -> Path:
    """``student_dir``'s encoder without its task head (a head trained for another task's labels is no start),
    written once to ``out`` (config, weights, tokenizer, and the source in compression.json)."""
    if not (out / "config.json").is_file():
        model = load_model(student_dir)
        tokenizer = load_tokenizer(student_dir)
        record = compression_record(stage="encoder", method="head dropped", parent=student_dir)
        save_model_dir(model.base_model, out, tokenizer=tokenizer, record=record, overwrite=True)
    return out


def student_run(teacher: Path, out: Path, cfg: dict) -> dict:
    if not (out / "config.json").is_file():
        started = time.process_time()
        distill(teacher, out, from_dict(DistillConfig, cfg), overwrite=True)
        cpu = time.process_time() - started
        (out / "cpu_seconds.txt").write_text(f"{cpu:.1f}\n")
    results = read_metrics(out)
    training = next(r for r in results if r["kind"] == "training")
    retention = next(r for r in results if r["kind"] == "retention")
    cpu_file = out / "cpu_seconds.txt"
    return {
        "model_dir": str(out), "config": cfg, "dev": next(r for r in results if r["kind"] == "eval")["metrics"],
        "metric": retention["metric"], "value": retention["student"], "teacher": retention["teacher"],
        "retention": retention["ratio"], "seconds": training["seconds"], "n_train": training["n_train"],
        "extra_rows": training.get("extra_rows", 0),
        # whether this run built the augmented set / teacher outputs or read them from the cache
        "augmented_set": (read_compression(out).get("extra_data") or {}).get("augment", {}).get("hit"),
        "teacher_cache": [c["hit"] for c in training.get("cache", [])],
        "cpu_seconds": float(cpu_file.read_text()) if cpu_file.is_file() else None,
    }


def general_run(out: Path, student: str, data: Path, steps: int, start: Path | None = None,
                precision: str = "fp32") -> tuple[Path, dict]:
    """A general-distilled ``student`` (MiniLM attention and value relations on the corpus), cut from the MiniLM
    encoder or continued from ``start`` (an earlier general student: a second cycle, warm-up and decay again), trained
    in ``precision`` (fp32, or bf16 mixed precision: 12 steps of the 3L-384 took 33 s against 64 s in fp32 on
    this AVX-512 BF16 CPU, 2 threads, run one after the other), and what it cost ({"steps", "seconds",
    "cpu_seconds"}, an earlier cycle's included, "cycles" and "precision": "mixed" when the cycles' differ)."""
    cost = out / "general_cost.json"
    if not (out / "config.json").is_file():
        before = json.loads((start / "general_cost.json").read_text()) if start else {}
        earlier = before.get("precision", "fp32") if start else precision  # costs written before it was recorded: fp32
        started, cpu = time.monotonic(), time.process_time()
        cfg = from_dict(GeneralDistillConfig, {
            "corpus": corpus_paths(data), "student": student, "losses": ["minilm"], "max_length": 128,
            "init": str(start) if start else "teacher", "precision": precision,
            "max_steps": steps, "batch_size": 64, "lr": 5e-4, "eval_every": max(10, steps // 5), "save_every": max(10, steps // 5),
        })
        distill_general(minilm_path(), out, cfg, overwrite=True)
        write_json_atomic(cost, {"steps": steps + before.get("steps", 0),
                                 "seconds": round(time.monotonic() - started + before.get("seconds", 0), 1),
                                 "cpu_seconds": round(time.process_time() - cpu + before.get("cpu_seconds", 0), 1),
                                 "cycles": before.get("cycles", 1) + 1 if start else 1,
                                 "precision": precision if earlier == precision else "mixed"})
    return out, (json.loads(cost.read_text()) if cost.is_file() else {})


def int8_run(student_dir: Path, out: Path, task: str, data: Path) -> dict:
    if not (out / "model.onnx").is_file() and not (out / "config.json").is_file():
        cfg = from_dict(QuantizeConfig, {"backend": "onnxruntime", "scheme": "dynamic", "task": task,
                                         "data_dir": str(data / "glue")})
        quantize(student_dir, out, cfg, overwrite=True)
    evals = [r for r in read_metrics(out) if r.get("kind") == "eval"]
    metric = get_task(task).primary_metric
    return {"model_dir": str(out), "value": evals[-1]["metrics"][metric] if evals else None}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--teachers", type=Path, default=Path("runs/retention"))
    parser.add_argument("--models", type=Path, default=Path("runs/retention/students"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tasks", default="stsb,cola,mrpc,rte,sst2")
    parser.add_argument("--students", default="3L-384,4L-312")
    parser.add_argument("--rows", default="a,b,c,d", help="which rows, in order; e.g. a,c for the quick pass")
    parser.add_argument("--seeds", default="42")
    parser.add_argument("--max-train", type=int, default=4000, help="the teachers' training sample (same seed)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--prediction-epochs", type=int, default=2, help="epochs on the augmented set in rows c/d")
    parser.add_argument("--augment", type=int, default=4)
    parser.add_argument("--augment-intermediate", action="store_true",
                        help="rows c/d/h: run the intermediate stage on the augmented set too (TinyBERT's order)")
    parser.add_argument("--transfer", type=int, default=8000, help="transfer examples in row g")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--general-minutes", type=float, default=10.0,
                        help="rows d and i's general stage, as a time budget (about 2 s a step of 64 x 128 tokens on 2 threads)")
    parser.add_argument("--general-steps", type=int, default=None, help="rows d and i's general stage in steps (overrides --general-minutes)")
    parser.add_argument("--general-from", type=Path, default=None, metavar="DIR",
                        help="continue rows d and i's general stage from this general-distilled student (another cycle of "
                             "--general-steps); its cost counts in the row's")
    parser.add_argument("--general-precision", choices=("fp32", "bf16"), default="fp32",
                        help="rows d and i's general stage in fp32 or bf16 mixed precision (the task rows stay fp32)")
    parser.add_argument("--task-init", type=Path, default=None, metavar="DIR",
                        help="row j: a student distilled on another task (e.g. MRPC before RTE), whose encoder starts it")
    parser.add_argument("--cache", type=Path, default=None, help="teacher-output / augmented-set cache (default: MODELS/cache)")
    parser.add_argument("--no-int8", action="store_true")
    parser.add_argument("--note", default="")
    parser.add_argument("--goal-with", type=Path, action="append", default=[], metavar="FILE",
                        help="another run's retention.json whose rows also count in the Goal (e.g. a task re-run against "
                             "a re-trained teacher); a task is judged against its strongest teacher")
    parser.add_argument("--render", action="store_true", help="only re-write retention.md from --out's retention.json")
    return parser


def main(argv=None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    args.cache = args.cache or args.models / "cache"
    args.models.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    store = args.out / "retention.json"
    results = json.loads(store.read_text())["rows"] if store.is_file() else {}
    header = {
        "date": utc_now(), **cpu_summary(), "threads": torch.get_num_threads(),
        "packages": package_versions(), "command": "python -m bench.retention " + " ".join(sys.argv[1:] if argv is None else argv),
        "settings": {k: str(v) for k, v in vars(args).items()}, "note": args.note,
    }
    if args.render:
        stored = json.loads(store.read_text())
        stored["header"]["goal_with"] = sorted({*stored["header"].get("goal_with", []), *map(str, args.goal_with)})
        write_json_atomic(store, stored)
        (args.out / "retention.md").write_text(render(stored["rows"], stored["header"]), encoding="utf-8")
        print((args.out / "retention.md").read_text())
        return 0
    if args.goal_with:
        header["goal_with"] = sorted(map(str, args.goal_with))

    mine: set[str] = set()  # the rows this run measured

    def save():
        save_results(store, header, results, mine)

    seeds = [int(s) for s in args.seeds.split(",")]
    for student in args.students.split(","):
        for task in args.tasks.split(","):
            teacher = args.teachers / f"teacher-{task}"
            for row in args.rows.split(","):
                if row == "j" and args.task_init is None:
                    parser.error("row j needs --task-init DIR: a student distilled on another task")
                run_row(args, teacher, task, student, row, seeds, results=results, mine=mine, save=save)
            if student == "3L-384" and not args.no_int8:
                int8_row(args, task, student, results, mine, save)
    save()
    print((args.out / "retention.md").read_text())
    return 0


def run_row(args, teacher: Path, task: str, student: str, row: str, seeds: list[int], *, results: dict, mine: set[str],
            save) -> None:
    """Every seed of one row not yet in ``results``, after its starting point (row j's encoder, rows d and i's general
    stage), each saved as it ends."""
    general, general_cost, encoder = None, {}, None
    if row == "j":
        encoder = encoder_of(args.task_init, args.models / f"encoder-of-{args.task_init.name}")
    if row in FROM_GENERAL:
        steps = args.general_steps or max(50, int(args.general_minutes * 60 / 2.0))
        general, general_cost = general_run(args.models / f"general-{student}", student, args.data, steps,
                                            args.general_from, args.general_precision)
    for seed in seeds:
        key = f"{task}/{student}/{row}/{seed}"
        if key in results:
            continue
        print(f"== {key}", flush=True)
        cfg = row_config(row, task, student, args, seed, general=general, encoder=encoder)
        results[key] = {"task": task, "student": student, "row": row, "seed": seed,
                        **student_run(teacher, args.models / key.replace("/", "-"), cfg),
                        **({"general": general_cost} if general_cost else {})}
        mine.add(key)
        save()


def int8_row(args, task: str, student: str, results: dict, mine: set[str], save) -> None:
    """The best row of ``task`` and ``student`` quantized and scored, unless that row's int8 is in ``results``."""
    done = [r for k, r in results.items() if k.startswith(f"{task}/{student}/") and r["row"] != "int8"]
    best = max(done, key=lambda r: r["value"] if r.get("value") is not None else -1e9)
    key = f"{task}/{student}/int8"
    if results.get(key, {}).get("of") != best["model_dir"]:
        print(f"== {key}", flush=True)
        q = int8_run(Path(best["model_dir"]), Path(best["model_dir"] + "-int8"), task, args.data)
        results[key] = {"task": task, "student": student, "row": "int8", "of": best["model_dir"],
                        "of_row": best["row"], "fp32": best["value"], "teacher": best["teacher"], **q}
        mine.add(key)
        save()


def _mean_std(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def render(results: dict, header: dict) -> str:
    s = header["settings"]
    task_init = s.get("task_init") if s.get("task_init") not in (None, "None") else "--task-init"  # settings are str()
    lines = [
        "# Retention per task: MiniLM-L6 teachers -> 3L-384 and 4L-312 students, one method added per row",
        "",
        f"- date: {header['date']}; hardware: {header['cpu']} ({header['cores']} cores, no GPU); torch threads: {header['threads']}",
        f"- versions: {', '.join(f'{k} {v}' for k, v in header['packages'].items())}",
        *[f"- command: `{c}`" for c in header.get("commands", [header["command"]])],
        f"- data: GLUE train, a seeded sample of at most {s['max_train']} examples (the teachers' sample), full dev sets; "
        "max length 64 (SST-2, CoLA) or 128. AdamW, batch 32, 10% warm-up, linear decay, best dev evaluation kept.",
        f"- rows: (a) KD (T=2) + hard, alpha 0.5, {s['epochs']} epochs, lr {s['lr']}; (b) + hidden-state and attention-map MSE "
        f"(uniform layer map), joint; (c) two stages: intermediate terms {s['epochs']} epochs on the training set"
        f"{' and its augmented copies' if s.get('augment_intermediate') == 'True' else ''}, then KD + hard "
        f"{s['prediction_epochs']} epochs on it plus {s['augment']} augmented copies per example (p 0.4, K 15, embedding "
        f"neighbours; the copies have teacher targets only); (d) as (c) from a general-distilled student "
        f"(MiniLM attention and value relations on the text corpus; its steps and time under 'general distillation'); (e) (a)'s terms for {s['prediction_epochs']} "
        f"epochs on the set plus {s['augment']} augmented copies, no intermediate stage; (f) `compress distill`'s defaults now, "
        "chosen from (a)-(e): (a)'s terms and 3 epochs on the set plus 4 augmented copies (sets of at most 10,000 examples); "
        f"(g) (e) plus {s.get('transfer', '8000')} teacher-scored transfer examples (the other GLUE tasks' pairs for a pair task, "
        "their sentences for a single-sentence one, then corpus sentences); (h) (c) cut from the pretrained MiniLM encoder "
        "(`--init-from`), not the fine-tuned teacher: (d)'s start without its general stage; (i) (f) from (d)'s general-distilled "
        f"student; (j) (c) from the encoder of a student distilled on another task ({task_init}, "
        "its head dropped). 3L-384 starts from teacher layers 1,3,5; "
        "4L-312 from teacher layers 1,2,4,5 cut to 312 wide (`--init teacher`: the most active hidden dimensions, the heads' "
        "26 strongest dimensions, the 1200 strongest FFN neurons); '4L-312 (random init)' rows started at random.",
        "- seconds: wall-clock training time of the row (teacher cache and augmentation included when built); cpu: process CPU time.",
    ]
    if header.get("note"):
        lines.append(f"- note: {header['note']}")
    lines += ["- caches: 'built' when the run made the augmented set / teacher outputs, 'read' when it found them cached "
              "(a second run of the same recipe, or another student of the same teacher and data).",
              "", "| task | student | row | dev metric | teacher | retention | train s | cpu s | train rows | augmented set | teacher outputs |",
              "|---|---|---|--:|--:|--:|--:|--:|--:|---|---|"]
    groups: dict[tuple, list[dict]] = {}
    for r in results.values():
        if r["row"] != "int8":
            groups.setdefault((r["task"], r["student"], r["row"]), []).append(r)
    for (task, student, row), rs in groups.items():
        values = [r["value"] for r in rs]
        ratio = [100 * r["retention"] for r in rs if r["retention"] is not None]
        cpu = [r["cpu_seconds"] for r in rs if r.get("cpu_seconds")]
        cpu_text = f"{statistics.mean(cpu):.0f}" if cpu else "—"
        aug = {None: "—", True: "read", False: "built"}[rs[0].get("augmented_set")]
        cache = ", ".join("read" if hit else "built" for hit in rs[0].get("teacher_cache") or []) or "online"
        lines.append(
            f"| {get_task(task).display} | {student} | ({row}) {ROWS[row]} | {rs[0]['metric']} {_mean_std(values)} | "
            f"{rs[0]['teacher']:.2f} | {_mean_std(ratio)}% | {statistics.mean(r['seconds'] for r in rs):.0f} | {cpu_text} | "
            f"{rs[0]['n_train']} + {rs[0]['extra_rows']} | {aug} | {cache} |"
        )
    general = {r["student"]: r["general"] for r in results.values() if r.get("general")}
    if general:
        lines += ["", "## general distillation (rows (d) and (i)'s starting point, once per student shape)", "",
                  "| student | steps (batch 64 x 128 tokens) | wall s | cpu s |", "|---|--:|--:|--:|"]
        lines += [f"| {k} | {g['steps']}{f' ({cycles} cycles)' if (cycles := g.get('cycles', 1)) > 1 else ''}"
                  f"{f', {precision}' if (precision := g.get('precision', 'fp32')) != 'fp32' else ''} | "
                  f"{g['seconds']:.0f} | {g['cpu_seconds']:.0f} |" for k, g in general.items()]
    int8 = [r for r in results.values() if r["row"] == "int8"]
    if int8:
        lines += ["", "## int8 (ONNX Runtime dynamic) of the best 3L-384 row", "",
                  "| task | row | fp32 | int8 | loss (points) | int8 retention |", "|---|---|--:|--:|--:|--:|"]
        for r in int8:
            if r["value"] is None:
                continue
            lines.append(f"| {get_task(r['task']).display} | ({r['of_row']}) | {r['fp32']:.2f} | {r['value']:.2f} | "
                         f"{r['fp32'] - r['value']:.2f} | {100 * r['value'] / r['teacher']:.1f}% |")
    others = {f: json.loads(Path(f).read_text())["rows"] for f in header.get("goal_with", [])}
    lines += ["", *goal_lines({"": results, **others})]
    return "\n".join(lines) + "\n"


def best_rows(runs: dict[str, dict]) -> dict[tuple[str, str], dict]:
    """The best row of each (task, student), a row's seeds averaged, over several runs' rows.

    ``runs`` maps a source ("" for this run, else a retention.json path) to its rows. Every row of a task is judged
    against the task's strongest teacher across the runs: its value over that teacher's metric, never over a weaker
    teacher's (a ratio to a teacher near chance says nothing about what was kept, and a re-made teacher that came out
    weaker must not make its students look better). The seeds of one recipe (:func:`_recipe`) are
    pooled across runs and teachers, so a lucky seed in one run does not outrank the same recipe re-run over more.
    Returns the best rows ({"row", "srcs", "teacher" (the one judged against), "own_teachers", "value",
    "retention", "seeds"})."""
    rows_all = [(src, r) for src, results in runs.items() for r in results.values()
                if r["row"] != "int8" and r["retention"] is not None]
    strongest: dict[str, float] = {}
    for _, r in rows_all:
        strongest[r["task"]] = max(strongest.get(r["task"], r["teacher"]), r["teacher"])
    by_recipe: dict[tuple, list[tuple[str, dict]]] = {}
    for src, r in rows_all:
        by_recipe.setdefault(_recipe(r), []).append((src, r))
    best: dict[tuple[str, str], dict] = {}
    for (task, student, row, *_), members in by_recipe.items():
        value = statistics.mean(r["value"] for _, r in members)
        mean = {"task": task, "student": student, "row": row, "srcs": sorted({src for src, _ in members}),
                "teacher": strongest[task], "own_teachers": sorted({r["teacher"] for _, r in members}),
                "seeds": len(members), "value": value, "retention": value / strongest[task]}
        if (task, student) not in best or mean["retention"] > best[task, student]["retention"]:
            best[task, student] = mean
    return best


def _recipe(r: dict) -> tuple:
    """What makes two rows the same recipe: task, shape, row letter, the general stage's length, cycles and precision,
    the settings a run may change (training sample, learning rate, epochs, augmented copies and which stages read them,
    transfer examples), row (j)'s source student; not the seed, teacher or other paths."""
    cfg = r.get("config") or {}
    general = r.get("general") or {}
    return (r["task"], r["student"], r["row"], general.get("steps"), general.get("cycles", 1), general.get("precision", "fp32"),
            cfg.get("lr"), cfg.get("epochs"),
            cfg.get("intermediate_epochs"), cfg.get("augment") or 0, bool(cfg.get("augment_intermediate")),
            cfg.get("transfer_examples"), cfg.get("max_train_examples"),
            Path(cfg["init"]).name if r["row"] == "j" else None)  # (j): which task's student it started from


def goal_lines(runs: dict[str, dict]) -> list[str]:
    """The issue's goal, met or not, from the best row of each task and shape (:func:`best_rows`)."""
    best = best_rows(runs)
    lines = ["## Goal", ""]
    for student, need_each, need_avg in (("3L-384", 97.0, 98.0), ("4L-312", None, 95.0)):
        rows = {t: r for (t, s), r in best.items() if s == student}
        judged = {t: 100 * r["retention"] for t, r in rows.items() if t != "cola"}  # CoLA's MCC is judged on its own
        if not judged:
            continue
        avg = statistics.mean(judged.values())
        parts = ", ".join(f"{get_task(t).display} {v:.1f}% ({rows[t]['row']}{_seeds(rows[t])}{_source(rows[t])})" for t, v in judged.items())
        verdict = avg >= need_avg and (need_each is None or all(v >= need_each for v in judged.values()))
        each = f" each >= {need_each}% and" if need_each else ""
        lines.append(f"- {student} best rows: {parts}; average {avg:.1f}% (goal:{each} average >= {need_avg}%): "
                     f"{'met' if verdict else 'not met'}"
                     + (f"; CoLA {100 * rows['cola']['retention']:.1f}% (MCC, judged on its own)" if "cola" in rows else ""))
    return lines


def _seeds(best: dict) -> str:
    # pooled from several files, a seed may repeat (the same seed against another teacher): then they are runs
    return f", {best['seeds']} {'runs' if len(best['srcs']) > 1 else 'seeds'}" if best["seeds"] > 1 else ""


def _source(best: dict) -> str:
    """Where a judged row comes from when not from this run alone (its files) and its teachers' metrics, with the one
    it is judged against when that is another (stronger) teacher."""
    parts = [", ".join(src or "this run" for src in best["srcs"])] if best["srcs"] != [""] else []
    own = best["own_teachers"]
    if own != [best["teacher"]]:
        parts.append(f"teacher{'s' if len(own) > 1 else ''} {', '.join(f'{t:.2f}' for t in own)}, "
                     f"judged against {best['teacher']:.2f}")
    elif parts:
        parts.append(f"teacher {best['teacher']:.2f}")
    return "; " + "; ".join(parts) if parts else ""


if __name__ == "__main__":
    raise SystemExit(main())
