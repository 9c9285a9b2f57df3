"""Head pruning on real data: remove 50% of the MiniLM-L6 SST-2 teacher's heads, recover, measure.

    python -m bench.prune --data ../shared/data --teachers runs/teachers --models runs/prune \
        --out bench/results/$(date +%F)

Prunes with Michel et al.'s gradient importance, recovers by distilling from the unpruned
model (one epoch of SST-2), and reports dev accuracy, parameters and latency of pruned vs
unpruned measured in one latency run. Then runs `compress heads` on the teacher over
SST-2 dev: the pruning curve (importance order vs random order) and the specialised heads.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from compress.core.formats.records import read_metrics, utc_now
from compress.core.formats.writes import write_json_atomic
from compress.core.config import from_dict
from compress.core.hardware import cpu_summary, package_versions
from compress.eval.heads import HeadsConfig, analyze_heads
from compress.eval.latency.config import LatencyConfig
from compress.eval.latency.report import format_markdown, report_record
from compress.eval.latency.runs import measure_latency
from compress.prune import PruneConfig, prune


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--teachers", type=Path, default=Path("runs/bench"),
                        help="the headline benchmark's work dir (teacher-sst2 and its pruned version are reused)")
    parser.add_argument("--models", type=Path, default=Path("runs/prune"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--remove-heads", type=float, default=0.5, help="fraction of heads removed")
    parser.add_argument("--recovery-epochs", type=int, default=1)
    parser.add_argument("--skip-heads-analysis", action="store_true")
    parser.add_argument("--redo-heads-analysis", action="store_true",
                        help="re-run the head analysis even when --out already holds one (e.g. to re-time latency alone)")
    args = parser.parse_args(argv)

    teacher = args.teachers / "teacher-sst2"
    args.models.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    pruned = args.teachers / f"teacher-sst2-heads{int(args.remove_heads * 100)}"  # the headline benchmark's, if present
    if not (pruned / "config.json").is_file():
        pruned = args.models / f"teacher-sst2-heads{int(args.remove_heads * 100)}"
    if not (pruned / "config.json").is_file():
        cfg = from_dict(PruneConfig, {
            "task": "sst2", "data_dir": str(args.data / "glue"), "max_length": 64, "max_train_examples": 20000,
            "remove_heads": args.remove_heads,
            "head_criterion": "gradient", "importance_examples": 2048, "recovery": "distill",
            "epochs": args.recovery_epochs, "lr": 5e-5, "batch_size": 32,
        })
        prune(teacher, pruned, cfg, overwrite=True)
    summary = next(r for r in read_metrics(pruned) if r["kind"] == "prune")
    latency = measure_latency([teacher, pruned], LatencyConfig(batch=(1, 32), seq=(128,), repeats=30, warmup=5,
                                                               record=False, out=str(args.out / "prune-latency")))
    heads = args.out / "heads-sst2-teacher"
    if args.skip_heads_analysis:
        heads = None
    elif (heads / "summary.md").is_file() and not args.redo_heads_analysis:
        print(f"reusing the head analysis in {heads}", flush=True)
    else:
        hcfg = from_dict(HeadsConfig, {"task": "sst2", "data_dir": str(args.data / "glue"), "attention_examples": 256,
                                       "max_length": 64, "importance_examples": 512})
        heads = analyze_heads(teacher, args.out / "heads-sst2-teacher", hcfg, overwrite=True)

    header = {"date": utc_now(), **cpu_summary(),
              "threads": torch.get_num_threads(), "packages": package_versions(),
              "command": "python -m bench.prune " + " ".join(sys.argv[1:])}
    write_json_atomic(args.out / "prune.json", {"header": header, "summary": summary, "latency": report_record(latency),
                                                "heads_analysis": str(heads) if heads else None})
    lines = [
        "# Head pruning on SST-2: MiniLM-L6 teacher, 50% of the heads removed",
        "",
        f"- date: {header['date']}; {header['cpu']}, {header['cores']} cores, {header['threads']} threads, no GPU",
        f"- command: `{header['command']}`",
        "- importance: Michel et al. 2019 gate gradients on 2,048 SST-2 training examples, normalised per layer, "
        "global ranking, at least one head kept per layer; heads removed physically (Q/K/V rows, output columns); "
        f"recovery: {args.recovery_epochs} epoch(s) of distillation from the unpruned model (KD + hard labels) on the "
        "headline benchmark's seeded 20,000-sentence SST-2 sample; full dev set.",
        "",
        "| model | params | heads | SST-2 dev accuracy |",
        "|---|--:|--:|--:|",
        f"| unpruned teacher | {summary['params_before'] / 1e6:.2f}M | 72 | {summary['before']:.2f} |",
        f"| pruned, before recovery | {summary['params_after'] / 1e6:.2f}M | {sum(next(s for s in summary['steps'] if s['step'].startswith('heads'))['heads'])} | {summary['after_prune']:.2f} |",
        f"| pruned + recovery | {summary['params_after'] / 1e6:.2f}M | | {summary['after_recovery']:.2f} |",
        "",
        f"Accuracy change after recovery: {summary['after_recovery'] - summary['before']:+.2f} points (target: within 1.0).",
        "",
        format_markdown(latency),
    ]
    if heads:
        lines += ["", f"Head analysis of the teacher: [{heads.name}/summary.md]({heads.name}/summary.md)", "",
                  (heads / "summary.md").read_text()]
    (args.out / "prune.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print((args.out / "prune.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
