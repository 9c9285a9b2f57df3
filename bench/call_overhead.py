"""What the Python call around a runtime costs at batch 1 on real sentences, and what shape switching costs.

For each ONNX Runtime or OpenVINO folder, one worker process (its own thread pool) times
the SST-2 dev set one sentence at a time, in order, three ways taken in turn round after
round, so that a slow spell of the machine lands on all three alike:

* ``module call``: ``model(**tensors)`` under ``torch.inference_mode`` -- the transformers
  call convention, what ``compress latency`` timed before it called the runtime directly;
* ``runtime call``: ``model.call(feeds)`` on feeds built before timing -- what it times now;
* (OpenVINO only) ``runtime call, grouped by shape``: the same calls sorted by padded shape,
  a diagnostic of what switching between the per-shape compiled models costs (a
  deployment cannot reorder requests, so no row of the toolkit's reports uses it).

OpenVINO runs one model compiled per padded shape (lengths rounded up to a multiple of 8),
as ``compress latency --openvino-shapes static`` does.

    python -m bench.call_overhead --model DIR [DIR ...] --data ../shared/data --out bench/results/<date>/call-overhead
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from compress.core.formats.artifacts import artifact_format, load_tokenizer
from compress.core.formats.records import utc_now
from compress.core.formats.writes import write_json_atomic, write_text_atomic
from compress.core.hardware import hardware, package_versions
from compress.core.formats.openvino_runtime import OpenVINORunner
from compress.core.formats.runners import NumpyRunner
from compress.core.formats.runtime import load_model
from compress.eval.latency.config import LatencyConfig
from compress.eval.latency.runs import worker_env
from compress.eval.latency.backends import forward_of
from compress.eval.latency.lengths import batches, real_inputs

PADDING_MULTIPLE = LatencyConfig().lengths_multiple  # as compress latency pads by default


def measure(model_dir: str, data_dir: str | None, task: str, threads: int, rounds: int) -> dict:
    """Median ms per sentence of each way of calling, over ``rounds`` interleaved passes of the dev set."""
    torch.set_num_threads(threads)
    model = load_model(model_dir, threads=threads)
    if not isinstance(model, NumpyRunner):
        raise SystemExit(f"{model_dir} is {artifact_format(model_dir)}; this benchmark times ONNX Runtime and OpenVINO folders")
    inputs = real_inputs(task, load_tokenizer(model_dir), data_dir=data_dir)  # data_dir None: task is a text file
    if isinstance(model, OpenVINORunner):
        feeds = batches(inputs, 1, multiple=PADDING_MULTIPLE)
        shapes = sorted({feed["input_ids"].shape for feed in feeds})
        shaped = {s: OpenVINORunner(model.path, model.config, model.head, threads=threads, shape=s) for s in shapes}
        runners = [shaped[feed["input_ids"].shape] for feed in feeds]
    else:
        feeds = batches(inputs, 1)
        shaped, runners = {None: model}, [model] * len(feeds)

    modules = {id(runner): forward_of(runner) for runner in shaped.values()}  # latency's former timed call
    tensors = [{k: torch.from_numpy(v) for k, v in feed.items()} for feed in feeds]
    native = [runner.feeds(feed) for runner, feed in zip(runners, feeds)]
    ways = {
        "module call": [(modules[id(runner)], (t,)) for runner, t in zip(runners, tensors)],
        "runtime call": [(runner.call, (f,)) for runner, f in zip(runners, native)],
    }
    if isinstance(model, OpenVINORunner):
        order = sorted(range(len(feeds)), key=lambda i: feeds[i]["input_ids"].shape)
        ways["runtime call, grouped by shape"] = [ways["runtime call"][i] for i in order]
    for calls in ways.values():  # warm-up: every compiled shape at least once
        for fn, args in calls:
            fn(*args)
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(rounds):
        for name, calls in ways.items():
            start = time.perf_counter()
            for fn, args in calls:
                fn(*args)
            seconds[name].append(time.perf_counter() - start)
    n = len(feeds)
    return {
        "model": model_dir, "format": artifact_format(model_dir), "sentences": n, "mean_tokens": inputs.mean_tokens,
        "padded_tokens_mean": float(np.mean([f["input_ids"].shape[1] for f in feeds])),
        "compiled_shapes": len(shaped),
        "ms_per_sentence": {name: float(np.median(s)) / n * 1e3 for name, s in seconds.items()},
        "ms_per_sentence_runs": {name: [x / n * 1e3 for x in s] for name, s in seconds.items()},
    }


def run_worker(job: dict, threads: int) -> dict:
    proc = subprocess.run([sys.executable, "-m", "bench.call_overhead", "--worker", json.dumps(job)],
                          capture_output=True, text=True, env=worker_env(threads), timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"worker for {job['model_dir']} failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def render(report: dict) -> str:
    lines = [
        "# The call around the runtime, at batch 1 on real sentences",
        "",
        f"- date: {report['date']}; hardware: {report['hardware']['cpu']} ({report['hardware']['physical_cores']} cores); "
        f"threads: {report['threads']}; rounds: {report['rounds']} (each way takes one pass over the set per round, in turn)",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in report["packages"].items()),
        f"- command: `{report['command']}`",
        "- ms per sentence: the median round's total over the sentences; sentences/s is its inverse.",
        "",
        "| model | format | sentences | tokens (mean) | padded (mean) | compiled shapes | way | ms / sentence | sentences/s | rounds (min-max ms) |",
        "|---|---|--:|--:|--:|--:|---|--:|--:|---|",
    ]
    for row in report["rows"]:
        for way, ms in row["ms_per_sentence"].items():
            runs = row["ms_per_sentence_runs"][way]
            lines.append(f"| {Path(row['model']).name} | {row['format']} | {row['sentences']} | {row['mean_tokens']:.1f} | "
                         f"{row['padded_tokens_mean']:.1f} | {row['compiled_shapes']} | {way} | {ms:.3f} | {1e3 / ms:.0f} | "
                         f"{min(runs):.3f}-{max(runs):.3f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", nargs="+", default=[], help="ONNX Runtime or OpenVINO model folders")
    parser.add_argument("--data", type=Path, default=Path("../shared/data"), help="folder holding glue/")
    parser.add_argument("--task", default="sst2")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        job = json.loads(args.worker)
        print(json.dumps(measure(job["model_dir"], job["data_dir"], job["task"], job["threads"], job["rounds"])))
        return 0
    if not args.model or args.out is None:
        parser.error("--model and --out are required")
    rows = []
    for model_dir in args.model:
        job = {"model_dir": str(model_dir), "data_dir": str(args.data / "glue"), "task": args.task,
               "threads": args.threads, "rounds": args.rounds}
        rows.append(run_worker(job, args.threads))
        print(f"{model_dir}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in rows[-1]["ms_per_sentence"].items()), flush=True)
    report = {"date": utc_now(), "hardware": hardware(), "threads": args.threads, "rounds": args.rounds,
              "packages": package_versions(), "command": "python -m bench.call_overhead " + " ".join(argv or sys.argv[1:]),
              "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out / "call_overhead.json", report)
    write_text_atomic(args.out / "call_overhead.md", render(report))
    print(f"wrote {args.out / 'call_overhead.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
