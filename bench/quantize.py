"""int8 on every backend: the MiniLM-L6 teachers (SST-2, MRPC, STS-B) and a BERT-base shape.

    python -m bench.quantize --data ../shared/data --teachers runs/bench --models runs/quantize \
        --out bench/results/$(date +%F)

For each teacher of the headline benchmark and each backend (PyTorch dynamic, ONNX Runtime
dynamic and static, Neural Compressor static PT2E) this quantizes, scores the int8 model
on the full dev set against its fp32 parent (the quantize stage's own accuracy check),
and then times every fp32 model and every int8 model in ONE latency run (each model in
its own process). The BERT-base-shaped model (random weights) is quantized with the same
backends, calibrated on SST-2 training sentences, for the speed-up at BERT-base size; its
accuracy is meaningless and not reported.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from bench.headline import bert_base_shape
from compress.core.formats.records import read_metrics, utc_now
from compress.core.formats.writes import write_json_atomic
from compress.core.config import from_dict
from compress.core.hardware import cpu_summary, package_versions
from compress.eval.latency.config import LatencyConfig
from compress.eval.latency.report import format_markdown, report_record
from compress.eval.latency.runs import measure_latency
from compress.quantize.config import QuantizeConfig
from compress.quantize.run import quantize

TASKS = ("sst2", "mrpc", "stsb")
BACKENDS = (("torch", "dynamic"), ("onnxruntime", "dynamic"), ("onnxruntime", "static"), ("inc", "static"))
MAX_LENGTH = {"sst2": 64, "mrpc": 128, "stsb": 128}
TARGET_DROP = 0.5
TARGET_SPEEDUP = 4.0
# int8 models the headline benchmark already made with the same settings (reused, not re-made).
HEADLINE = {("sst2", "onnxruntime", "dynamic"): "teacher-sst2-int8", ("mrpc", "onnxruntime", "dynamic"): "teacher-mrpc-int8",
            ("stsb", "onnxruntime", "dynamic"): "teacher-stsb-int8", ("sst2", "torch", "dynamic"): "teacher-sst2-int8-torch"}


def quantize_one(parent: Path, out: Path, task: str, glue: Path, backend: str, scheme: str, *, score: bool = True) -> dict:
    """Quantize ``parent`` (unless ``out`` exists) and return the stage's accuracy record and timing."""

    seconds = None
    if not (out / "config.json").is_file():
        cfg = {"backend": backend, "scheme": scheme, "task": task, "data_dir": str(glue), "max_length": MAX_LENGTH[task]}
        if not score:
            cfg["max_eval_examples"] = 64  # the output checks still run; the score of random weights is not reported
        started = time.monotonic()
        quantize(parent, out, from_dict(QuantizeConfig, cfg), overwrite=True)
        seconds = round(time.monotonic() - started, 1)
    record = next((r for r in read_metrics(out) if r.get("kind") == "quantize"), None)
    return {"model_dir": str(out), "parent_dir": str(parent), "task": task, "backend": backend, "scheme": scheme,
            "seconds": seconds, "accuracy": record and {k: record[k] for k in ("metric", "parent", "quantized", "drop")}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--teachers", type=Path, default=Path("runs/bench"),
                        help="the headline benchmark's work dir: teacher-<task>, bert-base-shape and int8 models are reused")
    parser.add_argument("--models", type=Path, default=Path("runs/quantize"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--skip-base", action="store_true", help="leave out the BERT-base-shaped model")
    args = parser.parse_args(argv)

    glue = (args.data / "glue").absolute()
    args.models.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    runs = []
    for task in TASKS:
        parent = args.teachers / f"teacher-{task}"
        for backend, scheme in BACKENDS:
            reuse = HEADLINE.get((task, backend, scheme))
            out = args.teachers / reuse if reuse and (args.teachers / reuse / "config.json").is_file() \
                else args.models / f"teacher-{task}-{backend}-{scheme}"
            print(f"== {task}: {backend} {scheme}", flush=True)
            runs.append(quantize_one(parent, out, task, glue, backend, scheme))
    if not args.skip_base:
        base = bert_base_shape(args.teachers)
        for backend, scheme in BACKENDS:
            print(f"== BERT-base shape: {backend} {scheme}", flush=True)
            runs.append(quantize_one(base, args.models / f"bert-base-shape-{backend}-{scheme}", "sst2", glue, backend,
                                     scheme, score=False) | {"task": None, "accuracy": None})

    parents = list(dict.fromkeys(r["parent_dir"] for r in runs))
    dirs = [Path(p) for p in parents] + [Path(r["model_dir"]) for r in runs]
    latency = measure_latency(dirs, LatencyConfig(batch=(1, 32), seq=(128,), repeats=args.repeats, warmup=5, record=False,
                                                  out=str(args.out / "quantize-latency")))
    p50 = {(str(Path(row.model).absolute()), row.batch): row for row in latency["rows"]}
    for r in runs:
        for batch in (1, 32):
            mine, theirs = p50.get((str(Path(r["model_dir"]).absolute()), batch)), p50.get((str(Path(r["parent_dir"]).absolute()), batch))
            if mine and theirs:
                r[f"p50_b{batch}"], r[f"parent_p50_b{batch}"] = mine.p50_ms, theirs.p50_ms
                r[f"speedup_b{batch}"] = theirs.p50_ms / mine.p50_ms
                r["size_mb"], r["parent_size_mb"] = mine.size_mb, theirs.size_mb
    header = {"date": utc_now(), **cpu_summary(),
              "threads": torch.get_num_threads(), "packages": package_versions(),
              "command": "python -m bench.quantize " + " ".join(sys.argv[1:] if argv is None else argv)}
    write_json_atomic(args.out / "quantize.json", {"header": header, "runs": runs, "latency": report_record(latency)})
    (args.out / "quantize.md").write_text(render(runs, latency, header), encoding="utf-8")
    print((args.out / "quantize.md").read_text())
    return 0


def render(runs: list[dict], latency: dict, header: dict) -> str:
    packages = header["packages"]
    lines = [
        "# int8 quantization on every backend: MiniLM-L6 teachers and a BERT-base shape",
        "",
        f"- date: {header['date']}; {header['cpu']}, {header['cores']} cores, {header['threads']} threads, no GPU",
        "- " + ", ".join(f"{k} {packages[k]}" for k in ("torch", "onnxruntime", "optimum", "neural-compressor-pt") if k in packages),
        f"- command: `{header['command']}`",
        "- accuracy: full dev sets (SST-2 872, MRPC 408, STS-B 1500), fp32 parent and int8 model scored by the quantize "
        "stage in the same process; static schemes calibrate on 128 seeded training examples. Latency: one run, each "
        "model in its own process, batch 1 and 32 at sequence 128, median of "
        f"{latency.get('config', {}).get('repeats', '?')} repeats after warm-up.",
        "",
        f"| model | backend | scheme | dev metric fp32 | int8 | drop (points) | size MB fp32 -> int8 | b1 ms fp32 -> int8 | speed-up b1 | speed-up b32 | targets (drop <= {TARGET_DROP}, >= {TARGET_SPEEDUP:g}x) |",
        "|---|---|---|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    for r in runs:
        name = f"teacher {r['task']}" if r["task"] else "BERT-base shape (random)"
        acc = r.get("accuracy")
        if acc:
            scores = f"{acc['metric']} {acc['parent']:.2f} | {acc['quantized']:.2f} | {acc['drop']:+.2f}"
        else:
            scores = "— | — | —"
        s1, s32 = r.get("speedup_b1"), r.get("speedup_b32")
        met = []
        if acc:
            met.append("drop met" if acc["drop"] <= TARGET_DROP else f"drop missed by {acc['drop'] - TARGET_DROP:.2f}")
        if s1:
            met.append("speed met" if s1 >= TARGET_SPEEDUP else f"speed {s1:.2f}x of {TARGET_SPEEDUP:g}x")
        size = f"{r['parent_size_mb']:.0f} -> {r['size_mb']:.0f}" if "size_mb" in r else "—"
        b1 = f"{r['parent_p50_b1']:.1f} -> {r['p50_b1']:.1f}" if "p50_b1" in r else "—"
        lines.append(f"| {name} | {r['backend']} | {r['scheme']} | {scores} | {size} | {b1} | "
                     f"{f'{s1:.2f}x' if s1 else '—'} | {f'{s32:.2f}x' if s32 else '—'} | {', '.join(met)} |")
    lines += ["", "## Latency table", "", format_markdown(latency)]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
