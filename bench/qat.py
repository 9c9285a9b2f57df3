"""Quantization-aware training vs post-training static int8 on the real MiniLM-L6 teachers.

    python -m bench.qat --data ../shared/data --teachers runs/bench --models runs/qat \
        --out bench/results/$(date +%F)

For each teacher (SST-2, MRPC by default) this makes the Neural Compressor static PT2E
int8 model and the QAT one (same int8 graph and kernels: ``--backend inc --scheme qat``),
and reports each one's dev score next to the fp32 parent, as the quantize stage measures
them. Both int8 models run the same compiled graph, so their speed is the inc rows of
``bench.quantize``; no latency is measured here.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from compress.core.formats.records import read_compression, read_metrics, utc_now
from compress.core.formats.writes import write_json_atomic
from compress.core.config import from_dict
from compress.core.hardware import cpu_summary, package_versions
from compress.quantize.config import QuantizeConfig
from compress.quantize.run import quantize

MAX_LENGTH = {"sst2": 64, "mrpc": 128, "stsb": 128}


def run(parent: Path, out: Path, task: str, glue: Path, scheme: str, *, steps: int, lr: float, examples: int) -> dict:
    seconds = None
    if not (out / "config.json").is_file():
        cfg = {"backend": "inc", "scheme": scheme, "task": task, "data_dir": str(glue), "max_length": MAX_LENGTH[task],
               "calibration_examples": examples, "qat_steps": steps, "qat_lr": lr}
        started = time.monotonic()
        quantize(parent, out, from_dict(QuantizeConfig, cfg), overwrite=True)
        seconds = round(time.monotonic() - started, 1)
    record = next(r for r in read_metrics(out) if r.get("kind") == "quantize")
    return {"task": task, "scheme": scheme, "model_dir": str(out), "seconds": seconds, "examples": examples,
            "accuracy": {k: record[k] for k in ("metric", "parent", "quantized", "drop")},
            "qat": read_compression(out).get("qat")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--teachers", type=Path, default=Path("runs/bench"))
    parser.add_argument("--models", type=Path, default=Path("runs/qat"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tasks", default="sst2,mrpc")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--examples", type=int, default=512, help="training examples QAT learns from (static: the same)")
    args = parser.parse_args(argv)

    glue = (args.data / "glue").absolute()
    args.models.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for task in args.tasks.split(","):
        parent = args.teachers / f"teacher-{task}"
        for scheme in ("static", "qat"):
            print(f"== {task}: inc {scheme}", flush=True)
            rows.append(run(parent, args.models / f"teacher-{task}-inc-{scheme}", task, glue, scheme, steps=args.steps,
                            lr=args.lr, examples=args.examples))
    header = {"date": utc_now(), **cpu_summary(),
              "threads": torch.get_num_threads(), "packages": package_versions(),
              "command": "python -m bench.qat " + " ".join(sys.argv[1:] if argv is None else argv)}
    write_json_atomic(args.out / "qat.json", {"header": header, "rows": rows})
    lines = [
        "# Quantization-aware training vs static post-training int8 (MiniLM-L6 teachers)",
        "",
        f"- date: {header['date']}; {header['cpu']}, {header['cores']} cores, {header['threads']} threads, no GPU",
        "- " + ", ".join(f"{k} {header['packages'][k]}" for k in ("torch", "torchao", "neural-compressor-pt") if k in header["packages"]),
        f"- command: `{header['command']}`",
        f"- both: the same x86 inductor int8 PT2E graph; static calibrates on {args.examples} seeded training examples, "
        f"QAT trains the fake-quantized graph {args.steps} steps (AdamW lr {args.lr:g}, batches of 8 of the same examples) "
        "to match the fp32 parent's outputs, no labels. Dev sets complete, scored by the quantize stage.",
        "",
        "| teacher | scheme | metric | fp32 | int8 | drop (points) | QAT loss before -> after training (all batches) | time |",
        "|---|---|---|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        a, q = r["accuracy"], r["qat"]
        loss = f"{q['loss_before']:.5f} -> {q['loss_after']:.5f}" if q else "—"
        took = f"{r['seconds'] / 60:.1f} min" if r["seconds"] else "reused"
        lines.append(f"| {r['task']} | {r['scheme']} | {a['metric']} | {a['parent']:.2f} | {a['quantized']:.2f} | {a['drop']:+.2f} | {loss} | {took} |")
    (args.out / "qat.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print((args.out / "qat.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
