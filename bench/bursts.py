"""One model at a time or in bursts: the same models timed both ways, alternated.

    python -m bench.bursts runs/retention/teacher-sst2 runs/auto/sst2-1of16 runs/auto/mrpc-1of8 \
        --out bench/results/$(date +%F)/bursts.json

``measure_latency`` at batch 1, sequence 128 (``--runs`` runs of ``--repeats`` timed passes
after ``--warmup``, no peak, nothing recorded in the models' folders), once per ``--bursts``
value, the whole sequence repeated ``--reps`` times so that the modes alternate: with
``--bursts 1`` the models are timed one process after another, with N > 1 they are all
loaded at once and take turns in N bursts per point (``compress latency --bursts N``). The
first model is the reference of the speed-ups (its p50 over each model's, median run and
worst run). Each measurement is printed as a JSON line and ``--out`` (a JSON list, one
record per measurement) is rewritten after each, so a stopped run keeps what it measured.
This produced bench/results/2026-11-26/auto/bursts.json (the teacher, the SST-2 1/16 and the
MRPC 1/8 choices of ``bench.auto``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from compress.core.formats.writes import write_json_atomic
from compress.eval.latency.config import LatencyConfig
from compress.eval.latency.row import Row
from compress.eval.latency.runs import measure_latency


def config(bursts: int, repeats: int = 30, warmup: int = 5, runs: int = 5) -> LatencyConfig:
    """The latency settings of one measurement: batch 1, sequence 128, ``runs`` runs, in ``bursts`` bursts."""
    return LatencyConfig(batch=(1,), seq=(128,), repeats=repeats, warmup=warmup, peak=False, record=False,
                         repeat_runs=runs, bursts=bursts)


def summary(rows: list[Row]) -> list[dict]:
    """Each latency row's name, per-run p50s, median p50, spread and speed-ups over the first model, rounded."""
    return [{"model": r.name, "runs_p50_ms": [round(x, 3) for x in r.runs_p50_ms], "p50_ms": round(r.p50_ms, 3),
             "spread_pct": round(r.spread_pct, 1), "speedup": round(r.speedup, 2),
             "speedup_min": round(r.speedup_min, 2)} for r in rows]


def alternate(models: list[Path], bursts: tuple[int, ...], reps: int, out: Path | None = None, *, repeats: int = 30,
              warmup: int = 5, runs: int = 5, clock=time.monotonic) -> list[dict]:
    """Time ``models`` once per value of ``bursts``, the sequence ``reps`` times: one record per measurement
    ({"bursts", "rep", "seconds", "rows"}), each printed and (with ``out``) written as it comes."""
    records: list[dict] = []
    for rep in range(reps):
        for n in bursts:
            started = clock()
            rows = measure_latency(models, config(n, repeats, warmup, runs))["rows"]
            record = {"bursts": n, "rep": rep, "seconds": round(clock() - started, 1), "rows": summary(rows)}
            print(json.dumps(record), flush=True)
            records.append(record)
            if out is not None:
                write_json_atomic(out, records)
    return records


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", type=Path, nargs="+", help="model folders; the first is the speed-ups' reference")
    parser.add_argument("--out", type=Path, required=True, help="the JSON list of measurements")
    parser.add_argument("--bursts", default="1,6", help="bursts per point of each measurement, in order (1: one at a time)")
    parser.add_argument("--reps", type=int, default=2, help="how many times the --bursts sequence is repeated")
    parser.add_argument("--runs", type=int, default=5, help="latency runs per measurement")
    parser.add_argument("--repeats", type=int, default=30, help="timed passes per model and run")
    parser.add_argument("--warmup", type=int, default=5, help="untimed passes before timing")
    args = parser.parse_args(argv)
    missing = [m for m in args.models if not (m / "config.json").is_file()]
    if missing:
        parser.error(f"{missing[0]} is not a model folder (no config.json)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    alternate(args.models, tuple(int(b) for b in args.bursts.split(",")), args.reps, args.out,
              repeats=args.repeats, warmup=args.warmup, runs=args.runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
