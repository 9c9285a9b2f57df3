"""How much of the teacher a student keeps before any training: ``--init`` methods compared zero-shot.

The MiniLM-L6 encoder is a sentence-embedding model, so a student built from it can be
scored with no training at all: mean-pooled embeddings, cosine similarity, Spearman
correlation with the STS-B dev scores (all 1,500 pairs). That isolates what the
initialisation itself keeps: the teacher's layers (same width), the teacher cut to a
narrower width (``teacher-slices``: hidden dimensions by activation, heads and head
dimensions by weight norms, FFN neurons by weight norms), and random weights, plus two
ablations of the cut (hidden dimensions chosen at random; queries rescaled to keep the
teacher's attention temperature).

    python -m bench.slices --data ../shared/data --out bench/results/DATE/slices
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

import torch
from scipy.stats import spearmanr

from bench.teachers import minilm_path
from compress.core.formats.artifacts import load_tokenizer
from compress.core.formats.records import utc_now
from compress.core.formats.writes import write_json_atomic
from compress.core.hardware import cpu_summary, package_versions
from compress.core.formats.runtime import load_model
from compress.core.model.shapes import Shape
from compress.core.model.structure import count_parameters
from compress.students import slices
from compress.students.init import init_student

ROWS = [  # (label, shape, method, ablation)
    ("6L-384 (the teacher)", Shape(6, 384, 12, 1536), "teacher-layers", None),
    ("6L-312", Shape(6, 312, 12, 1200), "teacher-slices", None),
    ("4L-384", Shape(4, 384, 12, 1536), "teacher-layers", None),
    ("3L-384", Shape(3, 384, 12, 1536), "teacher-layers", None),
    ("4L-312", Shape(4, 312, 12, 1200), "teacher-slices", None),
    ("4L-312", Shape(4, 312, 12, 1200), "teacher-slices", "random hidden dimensions"),
    ("4L-312", Shape(4, 312, 12, 1200), "teacher-slices", "queries rescaled by sqrt(26/32)"),
    ("4L-312", Shape(4, 312, 12, 1200), "random", None),
    ("4L-192 (6 heads of 32)", Shape(4, 192, 6, 768), "teacher-slices", None),
]


def sts_pairs(data: Path) -> tuple[list[str], list[str], list[float]]:
    with open(data / "glue" / "STS-B" / "dev.tsv", encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    return [r[7] for r in rows], [r[8] for r in rows], [float(r[9]) for r in rows]


def embed(model, tokenizer, texts: list[str]) -> torch.Tensor:
    out = []
    with torch.no_grad():
        for i in range(0, len(texts), 64):
            enc = tokenizer(texts[i:i + 64], padding=True, truncation=True, max_length=128, return_tensors="pt")
            h = model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).float()
            out.append((h * mask).sum(1) / mask.sum(1))
    return torch.nn.functional.normalize(torch.cat(out), dim=-1)


def build(teacher, shape: Shape, method: str, ablation: str | None):
    hidden_importance, rescale = slices.hidden_importance, slices.RESCALE_QUERIES
    if ablation == "random hidden dimensions":
        slices.hidden_importance = lambda t, seed=0: torch.rand(t.config.hidden_size, generator=torch.Generator().manual_seed(1))
    slices.RESCALE_QUERIES = ablation is not None and ablation.startswith("queries rescaled")
    try:
        return init_student(teacher, shape, method=method)
    finally:
        slices.hidden_importance, slices.RESCALE_QUERIES = hidden_importance, rescale


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    path = minilm_path()
    tokenizer, teacher = load_tokenizer(path), load_model(path, head="base").eval()
    a, b, gold = sts_pairs(args.data)
    rows = []
    for label, shape, method, ablation in ROWS:
        started = time.monotonic()
        model, info = build(teacher, shape, method, ablation)
        model.eval()
        score = spearmanr((embed(model, tokenizer, a) * embed(model, tokenizer, b)).sum(-1).numpy(), gold).correlation
        rows.append({"student": label, "shape": shape.label, "heads": shape.heads, "init": info["method"],
                     "teacher_layers": info.get("teacher_layers"), "ablation": ablation, "params": count_parameters(model),
                     "spearman": round(100 * score, 2), "seconds": round(time.monotonic() - started, 1)})
        print(rows[-1], flush=True)
    header = {"date": utc_now(), **cpu_summary(), "packages": package_versions(),
              "command": "python -m bench.slices " + " ".join(sys.argv[1:] if argv is None else argv)}
    args.out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out / "slices.json", {"header": header, "rows": rows})
    lines = ["# Zero-shot STS-B of students before any training: what each `--init` keeps", "",
             f"- date: {header['date']}; hardware: {header['cpu']}; command: `{header['command']}`",
             f"- versions: {', '.join(f'{k} {v}' for k, v in header['packages'].items())}",
             "- teacher: all-MiniLM-L6-v2 (6L-384, 12 heads of 32, FFN 1536); score: Spearman x 100 of the cosine of "
             "mean-pooled embeddings against the 1,500 STS-B dev scores; no training anywhere.", "",
             "| student | init | teacher layers | ablation | parameters | STS-B Spearman |", "|---|---|---|---|--:|--:|"]
    for r in rows:
        layers = ",".join(map(str, r["teacher_layers"])) if r["teacher_layers"] else "—"
        lines.append(f"| {r['student']} | {r['init']} | {layers} | {r['ablation'] or '—'} | {r['params'] / 1e6:.1f}M | "
                     f"{r['spearman']:.2f} |")
    (args.out / "slices.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print((args.out / "slices.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
