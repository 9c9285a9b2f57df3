"""Target 5 timed again in turns, on the models and latency table of an earlier headline run.

    python -m bench.target5 --headline bench/results/DATE/headline --data ../shared/data \
        --out bench/results/$(date +%F)/target5

``--headline`` is a folder of ``python -m bench`` holding its bench.json: its latency table
picks target 5's sides as ``python -m bench`` does (the teacher's fp32 folders and the
fastest students at the retention bar, :func:`bench.headline.real_candidates`), and those
model folders (the paths bench.json names) must still exist. They are timed again on the
SST-2 dev sentences at batch 1, loaded at once and taking turns, ``--runs`` runs
(:func:`bench.headline.real_in_turns`), and target 5 is judged on that measurement with the
headline's own models, int8 records and reference. Writes ``turns.json`` (the source folder,
hardware, packages, the measurement and the verdict) and ``turns.md`` to ``--out``.
This produced bench/results/2026-11-29/target5-extra-passes (run-a, run-b).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench.headline import _turns_lines, compute_targets, real_candidates, real_in_turns
from compress.core.formats.writes import write_json_atomic, write_text_atomic
from compress.core.hardware import hardware, package_versions


def check_sides(old: dict) -> str | None:
    """Why target 5 cannot be timed again on the headline ``old`` (no side in its table, or a side's model folder
    gone), or None."""
    teachers, students = real_candidates(old["latency"], old["models"])
    if not teachers or not students:
        return "its table has no teacher fp32 row or no student at the retention bar on the real sentences"
    missing = [d for d in teachers + students if not (Path(d) / "config.json").is_file()]
    return f"{missing[0]}, a side of target 5, is not a model folder any more" if missing else None


def retime(source: Path, old: dict, glue: Path, runs: int = 3) -> dict[str, Any]:
    """Target 5's sides of the headline ``old`` (its bench.json, read from ``source``) timed again in turns, and
    target 5 judged on them: {"source", "hardware", "packages", "real_in_turns", "target_5"}."""
    turns = real_in_turns(old["latency"], old["models"], glue, runs)
    targets = compute_targets(old["latency"], old["models"], old["int8"], old["base"], real=turns)
    return {"source": str(source), "hardware": hardware(), "packages": package_versions(),
            "real_in_turns": turns, "target_5": targets["real"]}


def render(record: dict[str, Any], models: list[dict]) -> str:
    """turns.md: the verdict, its numbers, and the models' sentences per second in every run."""
    target = record["target_5"]
    lines = ["# Target 5 timed again in turns, on the models of " + record["source"], ""]
    lines += [f"5. {'MET' if target['met'] else 'NOT MET'}: {target.get('target')}",
              f"   {json.dumps({k: v for k, v in target.items() if k != 'target'})}"]
    lines += _turns_lines({"real_in_turns": record["real_in_turns"], "models": models})
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--headline", type=Path, required=True, help="an earlier headline run's folder (its bench.json)")
    parser.add_argument("--out", type=Path, required=True, help="results directory (turns.json, turns.md)")
    parser.add_argument("--data", type=Path, default=Path("../shared/data"), help="the folder with glue/")
    parser.add_argument("--runs", type=int, default=3, help="runs of the measurement in turns")
    args = parser.parse_args(argv)
    source = args.headline / "bench.json"
    if not source.is_file():
        parser.error(f"no bench.json in {args.headline}: pass the folder of a python -m bench run")
    glue = (args.data / "glue").absolute()
    if not (glue / "SST-2" / "dev.tsv").is_file():
        parser.error(f"no GLUE SST-2 dev set in {glue}; pass --data pointing at the folder with glue/")
    old = json.loads(source.read_text())
    problem = check_sides(old)
    if problem:
        parser.error(f"{source}: {problem}")
    record = retime(args.headline, old, glue, args.runs)
    args.out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out / "turns.json", record)
    text = render(record, old["models"])
    write_text_atomic(args.out / "turns.md", text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
