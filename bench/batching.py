"""Batch-32 throughput of all-MiniLM-L6-v2 on each runtime, with and without batches cut by length.

    python -m bench.batching --data ../shared/data --work runs/batching --out bench/results/$(date +%F)/batching

The toolkit exports the packaged all-MiniLM-L6-v2 folder (``compress export``: ONNX, fused ONNX,
OpenVINO, CTranslate2 float32 and int8). Each runtime then runs in its own process, loaded and
warmed up, and embeds a seeded sample of STS-B dev sentences (each at its own length, in a
seeded order) in consecutive chunks of 32, as a server receives them: ``--rounds`` rounds, in each
of which every ``call_tokens`` value (``compress.core.data.batching``: ``inf`` is one padded
batch per chunk) is timed in turn; medians over rounds. CTranslate2 strips padding itself, so it
is timed on whole chunks only. Writes ``batching.md`` and ``batching.json`` (CPU, versions, command).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CALL_TOKENS = (float("inf"), 0.0, 16.0, 64.0, 256.0)
EXPORTS = {  # name -> compress export options
    "onnx": ["--format", "onnx"],
    "onnx-fused": ["--format", "onnx", "--fuse"],
    "openvino": ["--format", "openvino"],
    "ct2-float32": ["--format", "ctranslate2", "--quantization", "float32"],
    "ct2-int8": ["--format", "ctranslate2", "--quantization", "int8"],
}
BATCH = 32


def timing_texts(data: Path, n: int, seed: int = 0) -> list[str]:
    """The peers benchmark's sample: ``n`` distinct STS-B dev sentences in a seeded order."""
    from bench.peers.run import read_pairs, timing_sample

    stsb, _ = read_pairs(data, None)
    return timing_sample(stsb, n, seed)


def worker(folder: Path, texts_file: Path, rounds: int, threads: int, values: list[float]) -> dict:
    """Seconds per pass over the texts in chunks of 32, per ``call_tokens`` value, one list per value (rounds)."""
    import torch

    torch.set_num_threads(threads)
    from compress.core.formats.artifacts import load_tokenizer
    from compress.core.formats.runtime import load_model
    from compress.core.formats.sentence import encode, read_spec

    texts = json.loads(texts_file.read_text(encoding="utf-8"))
    model = load_model(folder, head="base", threads=threads)
    tokenizer, spec = load_tokenizer(folder), read_spec(folder)

    def one_pass(call_tokens: float) -> float:
        began = time.perf_counter()
        for start in range(0, len(texts), BATCH):
            encode(model, tokenizer, texts[start : start + BATCH], spec, batch_size=BATCH, call_tokens=call_tokens)
        return time.perf_counter() - began

    for value in values:  # warm-up
        one_pass(value)
    seconds: dict[str, list[float]] = {str(v): [] for v in values}
    for r in range(rounds):
        for value in values[r % len(values):] + values[: r % len(values)]:  # the order rotates each round
            seconds[str(value)].append(one_pass(value))
    return seconds


def export_all(source: Path, work: Path) -> dict[str, Path]:
    """Each export of ``source`` under ``work`` (kept: a re-run reuses them)."""
    folders = {}
    for name, options in EXPORTS.items():
        out = work / name
        if not (out / "compression.json").is_file():
            subprocess.run([sys.executable, "-m", "compress.cli", "export", "--model", str(source), *options, "--out", str(out)],
                           cwd=ROOT, check=True)
        folders[name] = out
    return folders


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.batching", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--work", type=Path, default=Path("runs/batching"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sentences", type=int, default=400, help="timing sentences (the peers benchmark's 400)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--worker", nargs=2, metavar=("FOLDER", "TEXTS"), help=argparse.SUPPRESS)
    parser.add_argument("--values", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        values = [float(v) for v in args.values.split(",")]
        print(json.dumps(worker(Path(args.worker[0]), Path(args.worker[1]), args.rounds, args.threads, values)))
        return 0

    from bench.glue.run import header
    from bench.teachers import minilm_path

    args.work.mkdir(parents=True, exist_ok=True)
    texts_file = args.work / "texts.json"
    texts_file.write_text(json.dumps(timing_texts(args.data, args.sentences)), encoding="utf-8")
    folders = {"torch": minilm_path(), **export_all(minilm_path(), args.work)}
    results = {}
    for name, folder in folders.items():  # each runtime in its own process, one after the other
        values = [float("inf")] if name.startswith("ct2") else list(CALL_TOKENS)
        done = subprocess.run([sys.executable, "-m", "bench.batching", "--out", str(args.out), "--rounds", str(args.rounds),
                               "--threads", str(args.threads), "--worker", str(folder), str(texts_file),
                               "--values", ",".join(str(v) for v in values)],
                              cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            results[name] = {"error": (done.stderr.strip().splitlines() or ["(no output)"])[-1]}
            continue
        seconds = json.loads(done.stdout.strip().splitlines()[-1])
        results[name] = {v: args.sentences / statistics.median(s) for v, s in seconds.items()}
        print(name, {v: round(x, 1) for v, x in results[name].items()}, flush=True)
    command = "python -m bench.batching " + " ".join(sys.argv[1:] if argv is None else argv)
    state = {"header": header(command), "sentences": args.sentences, "rounds": args.rounds, "batch": BATCH,
             "sentences_per_s": results}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "batching.json").write_text(json.dumps(state, indent=2), encoding="utf-8")
    (args.out / "batching.md").write_text(render(state), encoding="utf-8")
    print(render(state))
    return 0


def render(state: dict) -> str:
    head = state["header"]
    columns = [str(v) for v in CALL_TOKENS]
    lines = ["# Batch-32 throughput, batches cut by length", "",
             f"{head['date']} · {head['cpu']} · {head['threads']} threads · {state['sentences']} STS-B dev sentences in "
             f"chunks of {state['batch']}, a seeded order · median of {state['rounds']} rounds after a warm-up",
             "", f"Command: `{head['command']}`", "",
             "Sentences per second; `inf` is one padded batch per chunk, a number is the price of one more call in "
             "token positions (`compress.core.data.batching`). CTranslate2 strips padding itself: whole chunks only.", "",
             "| runtime | " + " | ".join(f"call_tokens={c}" for c in columns) + " |",
             "|---|" + "---:|" * len(columns)]
    for name, row in state["sentences_per_s"].items():
        if "error" in row:
            lines.append(f"| {name} | failed: {row['error']} |")
            continue
        lines.append(f"| {name} | " + " | ".join(f"{row[c]:.0f}" if c in row else "" for c in columns) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
