"""Pretrain a small BERT from scratch on the real text corpora under a CPU time budget.

Corpus: WikiText-2 raw (valid + test), Tiny Shakespeare and the 16 Project Gutenberg
books (body text). A WordPiece vocabulary is trained on it, then a 4L-256 BERT is
pretrained with MLM + NSP in two phases (sequence length 128, then 512).

    python -m bench.pretrain --data ../shared/data --out bench/results/$(date +%F) --minutes 30

The step count is derived from the budget: a short timing run measures seconds per step
at each phase's length first. Reports the MLM and NSP accuracy curves (train running
mean and held-out), and the masking statistics of the data pipeline.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import torch

from compress.core.formats.records import read_metrics, utc_now
from compress.core.formats.writes import write_json_atomic
from compress.core.config import from_dict
from compress.core.hardware import cpu_summary, package_versions
from compress.teacher.pretrain import PretrainConfig, pretrain


def corpus_paths(data: Path) -> list[str]:
    corpus = data / "corpus"
    wikitext = sorted((corpus / "wikitext-2").glob("raw_*"))[0]
    return [
        str(wikitext / "valid.txt"),
        str(wikitext / "test.txt"),
        str(corpus / "tinyshakespeare" / "input.txt"),
        str(corpus / "gutenberg" / "body_only"),
    ]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--out", type=Path, required=True, help="results directory")
    parser.add_argument("--models", type=Path, default=Path("runs/pretrain"), help="where the model goes")
    parser.add_argument("--minutes", type=float, default=30.0, help="training budget (wall clock)")
    parser.add_argument("--shape", default="4L-256")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--phase2-batch-size", type=int, default=16, help="same tokens per step at 4x the length")
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--note", default="", help="a line for the report (e.g. what else ran on the machine)")
    args = parser.parse_args(argv)

    args.out.mkdir(parents=True, exist_ok=True)
    args.models.mkdir(parents=True, exist_ok=True)
    base = {
        "corpus": corpus_paths(args.data), "vocab_size": args.vocab_size, "shape": args.shape,
        "batch_size": args.batch_size, "phase2_batch_size": args.phase2_batch_size, "lr": args.lr,
        "warmup_ratio": 0.05, "log_every": 10,
    }

    # 1. Time a few steps of each phase (tokenizer trained once and reused by the real run).
    probe_dir = args.models / "probe"
    shutil.rmtree(probe_dir, ignore_errors=True)
    probe = from_dict(PretrainConfig, {**base, "max_steps": 12, "phase1_fraction": 0.5, "eval_every": 1000, "save_every": 1000})
    start = time.monotonic()
    pretrain(probe_dir, probe, overwrite=True)
    training = next(r for r in read_metrics(probe_dir) if r["kind"] == "training")
    per_step = training["seconds"] / training["steps"]
    steps = max(20, int(args.minutes * 60 / per_step))
    print(f"probe: {per_step:.2f} s/step averaged over both phases ({time.monotonic() - start:.0f} s incl. data); "
          f"budget {args.minutes} min -> {steps} steps", flush=True)

    # 2. The real run, with the probe's vocabulary.
    out_dir = args.models / f"bert-{args.shape}"
    cfg = from_dict(PretrainConfig, {
        **base, "tokenizer": str(probe_dir), "max_steps": steps, "eval_every": max(10, steps // 20),
        "save_every": max(10, steps // 10),
    })
    pretrain(out_dir, cfg, overwrite=True)
    results = read_metrics(out_dir)
    training = next(r for r in results if r["kind"] == "training")
    heldout = [h for h in training["history"] if "eval" in h]
    header = {
        "date": utc_now(), **cpu_summary(),
        "threads": torch.get_num_threads(), "packages": package_versions(), "note": args.note,
        "command": "python -m bench.pretrain " + " ".join(sys.argv[1:] if argv is None else argv),
    }
    write_json_atomic(args.out / "pretrain.json", {"header": header, "config": json.loads(json.dumps(cfg, default=lambda o: o.__dict__)),
                                                   "training": training, "probe_seconds_per_step": per_step})
    shutil.copy(out_dir / "pretraining_curves.png", args.out / "pretrain_curves.png")
    (args.out / "pretrain.md").write_text(render(training, heldout, header, cfg, per_step), encoding="utf-8")
    print((args.out / "pretrain.md").read_text())
    return 0


def render(training, heldout, header, cfg, per_step) -> str:
    m = training["masking"]
    first, last = heldout[0]["eval"], heldout[-1]["eval"]
    lines = [
        "# Pretraining a small BERT from scratch (MLM + NSP) on CPU",
        "",
        f"- date: {header['date']}; {header['cpu']}, {header['cores']} cores, {header['threads']} threads; no GPU",
        *([f"- command: `{header['command']}`"] if header.get("command") else []),
        *([f"- {header['note']}"] if header.get("note") else []),
        f"- torch {header['packages'].get('torch')}, transformers {header['packages'].get('transformers')}, "
        f"tokenizers {header['packages'].get('tokenizers')}",
        f"- corpus: WikiText-2 raw valid+test, Tiny Shakespeare, 16 Gutenberg books: {training['corpus']['documents']} "
        f"documents, {training['corpus']['tokens']:,} WordPiece tokens; vocabulary {training['corpus']['vocab_size']}",
        f"- model {cfg.shape}, AdamW lr {cfg.train.lr} (betas 0.9/0.999, weight decay 0.01), warm-up "
        f"{cfg.train.warmup_ratio:.0%} then linear decay; phase 1: length {cfg.phase1_length}, batch {cfg.train.batch_size}, "
        f"{training['phases'][0]['steps']} steps; phase 2: length {cfg.phase2_length}, batch {cfg.phase2_batch_size}, "
        f"{training['phases'][-1]['steps'] if len(training['phases']) > 1 else 0} steps",
        f"- wall time {training['seconds'] / 60:.1f} min ({per_step:.2f} s/step in the timing probe). lr is 5x the "
        "paper's 1e-4: with a few hundred steps instead of 1M, the paper's rate barely moves the weights.",
        "",
        "## Held-out accuracy (1% of the sentence pairs, fixed masks)",
        "",
        "| step | MLM accuracy | MLM loss | NSP accuracy |",
        "|--:|--:|--:|--:|",
    ]
    for h in heldout:
        e = h["eval"]
        lines.append(f"| {h['step']} | {e['mlm_accuracy']:.2f}% | {e['mlm_loss']:.3f} | {e['nsp_accuracy']:.2f}% |")
    lines += [
        "",
        f"MLM accuracy {first['mlm_accuracy']:.2f}% -> {last['mlm_accuracy']:.2f}%; "
        f"NSP accuracy {first['nsp_accuracy']:.2f}% -> {last['nsp_accuracy']:.2f}% (chance: 50%).",
        "",
        "![curves](pretrain_curves.png)",
        "",
        f"## Masking statistics of the data pipeline (phase-1 pairs, {m['maskable']:,} maskable tokens)",
        "",
        "| quantity | measured | target |",
        "|---|--:|--:|",
        f"| selected / maskable tokens | {m['selected_fraction']:.4f} | 0.15 |",
        f"| [MASK] / selected | {m['mask_fraction']:.4f} | 0.80 |",
        f"| random token / selected | {m['random_fraction']:.4f} | 0.10 |",
        f"| unchanged / selected | {m['kept_fraction']:.4f} | 0.10 |",
        f"| special tokens selected | {m['special_selected']} | 0 |",
        f"| NotNext pairs | {m['not_next_fraction']:.4f} | 0.50 |",
        "",
        f"({m['random_same']} random replacements drew the original token; they are counted under random.)",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
