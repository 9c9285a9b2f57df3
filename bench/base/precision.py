"""bf16 against fp32 training on one task: ``python -m bench.base.precision``.

The base teacher (all-mpnet-base-v2) is fine-tuned on one GLUE task twice with the same recipe, sample and seed,
once with ``--precision fp32`` and once with ``--precision bf16``, each by ``compress teacher finetune`` in its own
process with nothing else running (the script refuses to time beside a busy machine unless ``--allow-busy``). It
reports, from each run's training record: the median examples/s of the logged training windows (evaluations left
out), the whole run's wall time, and the dev score; then the speed-up and the score difference of bf16.

    python -m bench.base.precision --task mrpc --max-train-examples 1000 --epochs 1 \\
        --work runs/base-precision --out bench/results/<date>/base-precision
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.base.report import chance_mark, dev_chance, primary
from bench.base.run import TASKS
from bench.base.teacher import MPNET_BASE, install
from compress.core.errors import CompressError
from compress.core.formats.records import read_metrics, utc_now
from compress.core.formats.writes import write_json_atomic, write_text_atomic
from compress.core.hardware import hardware, package_versions, precisions

PRECISIONS = ("fp32", "bf16")
BUSY_LOAD = 0.5  # a 1-minute load average above this (per core) means another job would share the timing


def finetune_command(teacher: Path, out: Path, task: str, data: Path, *, precision: str, epochs: int,
                     max_train_examples: int, seed: int) -> list[str]:
    """The one ``compress teacher finetune`` call of a run: the bench.base teacher recipe at ``precision``."""
    recipe = TASKS[task]
    return [sys.executable, "-m", "compress.cli", "--quiet", "teacher", "finetune", "--model", str(teacher),
            "--task", task, "--data-dir", str(data / "glue"), "--out", str(out), "--overwrite",
            "--max-length", str(recipe.max_length), "--epochs", str(epochs), "--lr", str(recipe.lr),
            "--batch-size", "32", "--warmup-ratio", "0.1", "--seed", str(seed),
            "--max-train-examples", str(max_train_examples), "--precision", precision]


def run_row(folder: Path, task: str, precision: str, wall: float) -> dict[str, Any]:
    """What one run measured: the training windows' median examples/s, wall seconds, dev score."""
    records = read_metrics(folder)
    training = next(r for r in records if r.get("kind") == "training")
    dev = next(r for r in reversed(records) if r.get("kind") == "eval" and r.get("split") == "dev")
    rates = [h["examples_per_second"] for h in training.get("history", []) if h.get("examples_per_second")]
    return {"precision": precision, "examples_per_s": statistics.median(rates) if rates else None,
            "windows": len(rates), "train_seconds": training.get("seconds"), "wall_seconds": round(wall, 1),
            "n_train": training.get("n_train"), "score": primary(task, dev.get("metrics")), "metrics": dev.get("metrics")}


def compare(rows: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """bf16's speed-up over fp32 (median window rates) and its dev score minus fp32's."""
    fp32, bf16 = rows["fp32"], rows["bf16"]
    speedup = (bf16["examples_per_s"] / fp32["examples_per_s"]
               if bf16["examples_per_s"] and fp32["examples_per_s"] else None)
    difference = (bf16["score"] - fp32["score"]) if bf16["score"] is not None and fp32["score"] is not None else None
    return {"speedup": speedup, "score_difference": difference}


def render(state: dict[str, Any]) -> str:
    rows, result = state["rows"], state.get("comparison") or {}
    lines = ["# bf16 against fp32: the base teacher fine-tuned on one task both ways", "",
             f"- date: {state['date']}; CPU: {state['cpu']}; native bf16: {state['bf16']}; threads: torch's default",
             f"- task: {state['task']}, a seeded sample of {state['max_train_examples']} training examples, "
             f"{state['epochs']} epoch(s), the bench.base teacher recipe (batch 32, lr {TASKS[state['task']].lr}, "
             f"max length {TASKS[state['task']].max_length}), seed {state['seed']}; each run alone, in its own process",
             f"- command: `{state['command']}`", "",
             "| precision | examples/s (median window) | training s | dev score | note |", "|---|--:|--:|--:|---|"]
    for name in PRECISIONS:
        if name in rows:
            r = rows[name]
            rate = "" if r["examples_per_s"] is None else f"{r['examples_per_s']:.1f}"
            lines.append(f"| {name} | {rate} | {r['train_seconds']:.0f} | {r['score']:.2f} | {chance_mark(r.get('chance'))} |")
    if result.get("speedup") is not None:
        lines += ["", f"bf16 trains {result['speedup']:.2f}x as fast as fp32; its dev score differs by "
                      f"{result['score_difference']:+.2f} points (one seed: the difference includes run-to-run noise)."]
    if any(chance_mark(r.get("chance")) for r in rows.values()):
        lines += ["", "A run at chance learned nothing the dev set can see (it answers as a constant would): the score "
                      "difference says nothing about bf16's accuracy; take a task or a budget where both runs learn."]
    return "\n".join(lines) + "\n"


def machine_busy() -> float | None:
    """The 1-minute load average per core when it is above :data:`BUSY_LOAD`, else None."""
    per_core = os.getloadavg()[0] / (os.cpu_count() or 1)
    return per_core if per_core > BUSY_LOAD else None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.base.precision", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("../shared/data"), help="the folder holding glue/")
    parser.add_argument("--task", default="mrpc", choices=[t for t in TASKS if t not in ("banking77", "wnut17")])
    parser.add_argument("--max-train-examples", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--work", type=Path, default=Path("runs/base-precision"), help="the two model folders")
    parser.add_argument("--out", type=Path, required=True, help="results directory (precision.md, precision.json)")
    parser.add_argument("--allow-busy", action="store_true", help="time even when the machine is loaded (say so)")
    args = parser.parse_args(argv)
    try:
        if not precisions().bf16:
            raise CompressError("this CPU has no native bf16: bf16 would run emulated; run this on a CPU with "
                                "AVX512_BF16, AMX or ARM BF16")
        busy = machine_busy()
        if busy is not None and not args.allow_busy:
            raise CompressError(f"the machine is busy (load {busy:.2f} per core): stop other jobs, or pass --allow-busy")
        teacher = install(MPNET_BASE)
        info = hardware()
        state: dict[str, Any] = {"date": utc_now(), "cpu": f"{info.get('cpu')} ({info.get('microarchitecture')})", "bf16": True,
                                 "task": args.task,
                                 "max_train_examples": args.max_train_examples, "epochs": args.epochs, "seed": args.seed,
                                 "versions": package_versions(), "hardware": info, "rows": {},
                                 "command": "python -m bench.base.precision " + " ".join(sys.argv[1:] if argv is None else argv)}
        for precision in PRECISIONS:
            out = args.work / f"{args.task}-{precision}"
            command = finetune_command(teacher, out, args.task, args.data, precision=precision, epochs=args.epochs,
                                       max_train_examples=args.max_train_examples, seed=args.seed)
            start = time.perf_counter()
            subprocess.run(command, check=True)
            row = run_row(out, args.task, precision, time.perf_counter() - start)
            state["rows"][precision] = {**row, "chance": dev_chance(args.task, row["metrics"], args.data / "glue")}
            write_json_atomic(args.out / "precision.json", state)
        state["comparison"] = compare(state["rows"])
        write_json_atomic(args.out / "precision.json", state)
        write_text_atomic(args.out / "precision.md", render(state))
    except (CompressError, subprocess.CalledProcessError) as error:
        print(f"bench.base.precision: {error}", file=sys.stderr)
        return 2
    print((args.out / "precision.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
