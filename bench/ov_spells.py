"""Slow spells of the machine: one OpenVINO model timed alone, over seconds, in one process.

    python -m bench.ov_spells chunks runs/auto/sst2-1of16/openvino_model.xml --variant nommap
    python -m bench.ov_spells timeline runs/auto/sst2-1of16/openvino_model.xml --seconds 30

The OpenVINO IR is compiled for the CPU as ``compress latency`` runs it (latency hint, 2
threads, f32 inference precision) and fed one random batch of 1 x 128 tokens (seeded), no
toolkit code around the call. After ``--warmup`` inferences:

* ``chunks``: ``--chunks`` chunks of ``--passes`` timed inferences; prints
  {"variant", "chunks": the median ms of each chunk, in order}. ``--variant`` ``nommap``
  reads the weights without mmap (``ENABLE_MMAP`` off), ``nopin`` turns CPU pinning off,
  ``base`` changes nothing. Run it in several processes one after another (a shell loop,
  the variants alternated) to see whether a process or the machine is slow.
* ``timeline``: chunks of ``--passes`` inferences for ``--seconds``, each followed by a fixed
  pure-Python loop timed alone (whether the CPU itself slows, not the engine); prints
  [[seconds since start, the chunk's median ms, the loop's ms], ...].

``--out FILE`` also writes the printed JSON there. Neither torch nor the toolkit is imported:
with torch imported first, OpenVINO's default CPU pinning differed (fresh-gap.md). These produced the tables and the 30 s
timeline of "Correction (later the same day): slow spells, not slow processes" in
bench/results/2026-11-26/auto/fresh-gap.md.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

PROPERTIES = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": 2, "INFERENCE_PRECISION_HINT": "f32"}
VARIANTS = ("base", "nommap", "nopin")
BATCH, SEQ = 1, 128


def compile_request(xml: Path, variant: str = "base"):
    """The IR compiled for the CPU with ``variant``'s settings: (compiled model, infer request)."""
    import openvino as ov

    props = dict(PROPERTIES)
    core = ov.Core()
    if variant == "nommap":
        core.set_property({"ENABLE_MMAP": False})
    if variant == "nopin":
        props["ENABLE_CPU_PINNING"] = False
    compiled = core.compile_model(str(xml), "CPU", props)
    return compiled, compiled.create_infer_request()


def random_feeds(inputs, seed: int = 0) -> dict[str, np.ndarray]:
    """A BATCH x SEQ feed for each input port: random token ids (seeded, drawn in port order), a full attention
    mask, zero token types, each in its port's element type."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for port in inputs:
        name = port.get_any_name()
        if "input_ids" in name:
            value = rng.integers(1, 30000, (BATCH, SEQ))
        elif "attention" in name:
            value = np.ones((BATCH, SEQ))
        else:
            value = np.zeros((BATCH, SEQ))
        feeds[name] = value.astype(port.get_element_type().to_dtype())
    return feeds


def chunk_median_ms(infer, passes: int, clock=time.perf_counter) -> float:
    """The median ms of ``passes`` timed calls of ``infer``, rounded to microseconds."""
    times = []
    for _ in range(passes):
        started = clock()
        infer()
        times.append(clock() - started)
    return round(1e3 * float(np.median(times)), 3)


def chunks(infer, n: int, passes: int, clock=time.perf_counter) -> list[float]:
    """The median ms of each of ``n`` chunks of ``passes`` calls, in order."""
    return [chunk_median_ms(infer, passes, clock) for _ in range(n)]


def spin(clock=time.perf_counter, n: int = 20000) -> float:
    """Seconds a fixed pure-Python loop takes (whether the CPU itself is slow, not the engine)."""
    started, total = clock(), 0
    for i in range(n):
        total += i
    return clock() - started


def timeline(infer, seconds: float, passes: int, clock=time.perf_counter, loop=spin) -> list[tuple[float, float, float]]:
    """Chunks of ``passes`` calls until ``seconds`` have passed: (seconds since start, the chunk's median ms, the
    fixed loop's ms timed right after it) each."""
    start, out = clock(), []
    while clock() - start < seconds:
        median = chunk_median_ms(infer, passes, clock)
        out.append((round(clock() - start, 2), median, round(1e3 * loop(clock), 3)))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True)
    for mode, passes in (("chunks", 150), ("timeline", 100)):
        p = sub.add_parser(mode, help="see: python -m bench.ov_spells --help")
        p.add_argument("xml", type=Path, help="an OpenVINO IR (openvino_model.xml)")
        p.add_argument("--warmup", type=int, default=50, help="untimed inferences first")
        p.add_argument("--passes", type=int, default=passes, help="timed inferences per chunk")
        p.add_argument("--out", type=Path, default=None, help="also write the JSON printed to this file")
    sub.choices["chunks"].add_argument("--variant", choices=VARIANTS, default="base")
    sub.choices["chunks"].add_argument("--chunks", type=int, default=8)
    sub.choices["timeline"].add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args(argv)
    if not args.xml.is_file():
        parser.error(f"{args.xml} is not a file: pass an OpenVINO IR (openvino_model.xml)")
    compiled, request = compile_request(args.xml, getattr(args, "variant", "base"))
    feeds = random_feeds(compiled.inputs)

    def infer():
        request.infer(feeds)

    for _ in range(args.warmup):
        infer()
    if args.mode == "chunks":
        result = {"variant": args.variant, "chunks": chunks(infer, args.chunks, args.passes)}
    else:
        result = timeline(infer, args.seconds, args.passes)
    text = json.dumps(result)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
