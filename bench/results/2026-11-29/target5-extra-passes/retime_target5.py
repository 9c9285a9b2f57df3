"""Target 5's measurement in turns, again, on the models and table of an earlier headline.

    PYTHONPATH=. python bench/results/2026-11-29/target5-extra-passes/retime_target5.py \
        HEADLINE_DIR OUT_DIR GLUE_DIR

HEADLINE_DIR holds the headline's bench.json (its latency table picks target 5's sides, as
``python -m bench`` does); OUT_DIR gets turns.json and turns.md.
"""
import json
import sys
from pathlib import Path

from bench.headline import _turns_lines, compute_targets, real_in_turns
from compress.core.hardware import hardware, package_versions

src, out, glue = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
old = json.loads((src / "bench.json").read_text())
turns = real_in_turns(old["latency"], old["models"], glue, 3)
targets = compute_targets(old["latency"], old["models"], old["int8"], old["base"], real=turns)
out.mkdir(parents=True, exist_ok=True)
(out / "turns.json").write_text(json.dumps({"source": str(src), "hardware": hardware(), "packages": package_versions(),
                                            "real_in_turns": turns, "target_5": targets["real"]}, indent=1))
lines = ["# Target 5 timed again in turns, on the models of " + str(src), ""]
lines += [f"5. {'MET' if targets['real']['met'] else 'NOT MET'}: {targets['real'].get('target')}",
          f"   {json.dumps({k: v for k, v in targets['real'].items() if k != 'target'})}"]
lines += _turns_lines({"real_in_turns": turns, "models": old["models"]})
(out / "turns.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
