"""Distillation on real data: MiniLM-L6 SST-2 teacher -> 3L-384 and 4L-312 students.

    python -m bench.distill --data ../shared/data --teachers runs/teachers --models runs/distill \
        --out bench/results/$(date +%F)

Needs the teachers of ``bench.teachers`` (minilm-sst2, minilm-mrpc). Produces:

* SST-2 dev accuracy of 3L-384 (initialised from teacher layers 1,3,5) and 4L-312
  (random init, and general-distilled on the text corpus first), retention vs the
  teacher, and latency student vs teacher at batch 1 / sequence 128 in one run;
* an ablation on SST-2 and MRPC: hard labels only vs KD vs KD + intermediate layers;
* the cost of a cached-teacher distillation epoch vs a plain fine-tuning epoch.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from bench.pretrain import corpus_paths
from bench.teachers import SST2_TRAIN, minilm_path
from compress.core.formats.records import read_metrics, utc_now
from compress.core.formats.writes import write_json_atomic
from compress.core.config import from_dict
from compress.core.hardware import cpu_summary, package_versions
from compress.distill.task import DistillConfig, distill
from compress.distill.general import GeneralDistillConfig, distill_general
from compress.eval.latency.config import LatencyConfig
from compress.eval.latency.report import format_markdown, report_record
from compress.eval.latency.runs import measure_latency

GLUE_MAX_LENGTH = {"sst2": 64, "mrpc": 128}


def student_run(teacher: Path, out: Path, task: str, data: Path, *, student: str, init: str, losses: tuple[str, ...],
                epochs: int, lr: float, cache_dir: Path, init_layers=(), seed: int = 42, sst2_train: int = SST2_TRAIN) -> dict:
    if not (out / "config.json").is_file():
        cfg = from_dict(DistillConfig, {
            "task": task, "student": student, "init": init, "losses": list(losses), "init_layers": list(init_layers),
            "data_dir": str(data / "glue"), "max_length": GLUE_MAX_LENGTH[task], "epochs": epochs, "lr": lr,
            "max_train_examples": sst2_train if task == "sst2" else None,
            "batch_size": 32, "seed": seed, "cache_dir": str(cache_dir),
        })
        distill(teacher, out, cfg, overwrite=True)
    results = read_metrics(out)
    training = next(r for r in results if r["kind"] == "training")
    retention = next(r for r in results if r["kind"] == "retention")
    return {
        "model_dir": str(out), "task": task, "student": student, "init": init, "losses": list(losses), "epochs": epochs,
        "lr": lr, "n_train": training["n_train"], "dev": next(r for r in results if r["kind"] == "eval")["metrics"], "retention": retention,
        "seconds": training["seconds"], "seconds_per_epoch": training["seconds"] / epochs, "cache": training["cache"],
    }


def general_run(teacher: Path, out: Path, data: Path, minutes: float, cache_seconds_per_step: float | None = None) -> dict:
    if not (out / "config.json").is_file():
        # ~2.4 s/step measured for 4L-312 with the 6L-384 teacher online at 64 x 128 tokens.
        steps = max(50, int(minutes * 60 / (cache_seconds_per_step or 2.4)))
        cfg = from_dict(GeneralDistillConfig, {
            "corpus": corpus_paths(data), "student": "4L-312", "losses": ["minilm"], "max_length": 128,
            "max_steps": steps, "batch_size": 64, "lr": 5e-4, "eval_every": max(10, steps // 10), "save_every": max(10, steps // 5),
        })
        distill_general(teacher, out, cfg, overwrite=True)
    training = next(r for r in read_metrics(out) if r["kind"] == "training")
    evals = [h for h in training["history"] if "eval" in h]
    return {"model_dir": str(out), "steps": training["steps"], "seconds": training["seconds"],
            "sequences": training["sequences"], "heldout_first": evals[0]["eval"]["heldout_loss"] if evals else None,
            "heldout_last": evals[-1]["eval"]["heldout_loss"] if evals else None}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--teachers", type=Path, default=Path("runs/bench"),
                        help="the headline benchmark's work dir: teacher-<task> and its students are reused")
    parser.add_argument("--models", type=Path, default=Path("runs/distill"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--general-minutes", type=float, default=20.0)
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: students,general,ablation,latency")
    parser.add_argument("--note", default="", help="a line for the report (e.g. what else ran on the machine)")
    parser.add_argument("--ablation-sst2-train", type=int, default=SST2_TRAIN,
                        help="SST-2 training sentences in the ablation (below 20,000 its KD row is trained afresh)")
    return parser


def main(argv=None) -> int:
    args = _parser().parse_args(argv)

    skip = set(filter(None, args.skip.split(",")))
    args.models.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    cache = args.models / "teacher-cache"
    sst2_teacher = args.teachers / "teacher-sst2"
    results: dict = {"students": {}, "ablation": {}, "general": None, "latency": None}
    partial = args.out / "distill.json"

    def save():
        header = {"date": utc_now(), **cpu_summary(),
                  "threads": torch.get_num_threads(), "packages": package_versions(),
                  "command": "python -m bench.distill " + " ".join(sys.argv[1:]), "note": args.note}
        latency = results["latency"]  # its rows as latency.json holds them
        write_json_atomic(partial, {"header": header, **results, "latency": report_record(latency) if latency else None})
        (args.out / "distill.md").write_text(render(results, header), encoding="utf-8")

    # 1. The headline students on SST-2.
    m = args.models
    # The same settings as the headline benchmark's students, which are reused when present.
    runs = {
        "3L-384 kd (teacher layers 1,3,5)": ("student-3L-384", dict(student="3L-384", init="teacher-layers", init_layers=(1, 3, 5),
                                                                    losses=("kd", "hard"), lr=1e-4, epochs=3)),
        "4L-312 kd (random init)": ("student-4L-312", dict(student="4L-312", init="random", losses=("kd", "hard"), lr=3e-4, epochs=4)),
    }
    for name, (folder, spec) in runs.items():
        if "students" in skip:
            break
        print(f"== {name}", flush=True)
        out = args.teachers / folder if (args.teachers / folder / "config.json").is_file() else m / folder
        results["students"][name] = student_run(sst2_teacher, out, "sst2", args.data, cache_dir=cache, **spec)
        save()

    # 2. General distillation of a 4L-312 from the MiniLM encoder, then SST-2.
    if "general" not in skip:
        print("== general distillation 4L-312", flush=True)
        results["general"] = general_run(minilm_path(), m / "general-4L-312", args.data, args.general_minutes)
        save()
        name = "4L-312 kd (general-distilled init)"
        results["students"][name] = student_run(sst2_teacher, m / "sst2-4L-312-general", "sst2", args.data, student="4L-312",
                                                init=str(m / "general-4L-312"), losses=("kd", "hard"), lr=3e-4, epochs=4,
                                                cache_dir=cache)
        save()

    # 3. Ablation: hard labels vs KD vs KD + intermediate layers, 3L-384 from teacher layers.
    if "ablation" not in skip:
        ablation(args, results, cache, save)

    # 4. Latency: teacher and students, batch 1 and 32, sequence 128, one run.
    if "latency" not in skip and results["students"]:
        dirs = [sst2_teacher] + [Path(r["model_dir"]) for r in results["students"].values()]
        results["latency"] = measure_latency(dirs, LatencyConfig(batch=(1, 32), seq=(128,), repeats=30, warmup=5,
                                                                record=False, out=str(args.out / "distill-latency")))
        save()
    print((args.out / "distill.md").read_text())
    return 0


def ablation(args, results: dict, cache: Path, save) -> None:
    """Hard labels vs KD vs KD + intermediate layers, a 3L-384 from teacher layers 1,3,5, on SST-2 and MRPC (the SST-2 KD
    row is the headline student of part 1 when it trained on the same sample)."""
    for task in ("sst2", "mrpc"):
        teacher = args.teachers / f"teacher-{task}"
        epochs = 3 if task == "sst2" else 4
        for label, losses in (("hard labels only", ("hard",)), ("KD", ("kd", "hard")),
                              ("KD + hidden + attention", ("kd", "hard", "hidden", "attention"))):
            reuse = results["students"].get("3L-384 kd (teacher layers 1,3,5)")
            if task == "sst2" and losses == ("kd", "hard") and reuse and args.ablation_sst2_train == SST2_TRAIN:
                results["ablation"].setdefault(task, {})[label] = reuse
                continue
            print(f"== ablation {task}: {label}", flush=True)
            n = args.ablation_sst2_train
            out = args.models / (f"ablation-{task}-{'-'.join(losses)}" + (f"-n{n}" if task == "sst2" and n != SST2_TRAIN else ""))
            results["ablation"].setdefault(task, {})[label] = student_run(
                teacher, out, task, args.data, student="3L-384", init="teacher-layers", init_layers=(1, 3, 5),
                losses=losses, epochs=epochs, lr=1e-4, cache_dir=cache, sst2_train=n)
            save()


def render(results: dict, header: dict) -> str:
    lines = [
        "# Distillation on SST-2 (and MRPC): MiniLM-L6 teacher -> smaller students",
        "",
        f"- date: {header['date']}; {header['cpu']}, {header['cores']} cores, {header['threads']} threads, no GPU",
        f"- torch {header['packages'].get('torch')}, transformers {header['packages'].get('transformers')}",
        f"- command: `{header['command']}`",
        "- data: a seeded sample of SST-2 training sentences (20,000, the headline benchmark's, unless a table says "
        "otherwise) and the full dev set (872), "
        "max length 64; MRPC train/dev in full, max length 128. Batch 32, "
        "AdamW with 10% warm-up and linear decay, best dev epoch kept. KD = soft-target KL at T=2 (x T²) mixed "
        "0.5/0.5 with the hard-label loss; intermediate = hidden-state MSE + attention-map MSE, uniform layer map.",
    ]
    if header.get("note"):
        lines.append(f"- {header['note']}")
    if results["students"]:
        lines += ["", "## Students", "", "| student | init | params | SST-2 dev acc | teacher | retention | s/epoch |",
                  "|---|---|--:|--:|--:|--:|--:|"]
    params = {Path(row.model).name: row.params for row in (results.get("latency") or {}).get("rows", [])}
    for name, r in results["students"].items():
        ret, p = r["retention"], params.get(Path(r["model_dir"]).name)
        init = "general-distilled" if "/" in r["init"] else r["init"]
        lines.append(
            f"| {name} | {init} | {f'{p / 1e6:.1f}M' if p else '—'} | {r['dev']['accuracy']:.2f} | {ret['teacher']:.2f} | "
            f"{100 * ret['ratio']:.1f}% | {r['seconds_per_epoch']:.0f} |"
        )
    if results.get("general"):
        g = results["general"]
        lines += ["", f"General distillation (MiniLM attention + value relations, 4L-312 from the 6L-384 encoder, "
                  f"{g['steps']} steps of 64 x 128 tokens on the text corpora, {g['seconds'] / 60:.0f} min): held-out "
                  f"loss {g['heldout_first']:.3f} -> {g['heldout_last']:.3f}."]
    if results.get("ablation"):
        lines += ["", "## Ablation (3L-384 from teacher layers 1,3,5)", "",
                  "| task | losses | train examples | epochs | dev metric | teacher | retention | s/epoch |", "|---|---|--:|--:|--:|--:|--:|--:|"]
        for task, rows in results["ablation"].items():
            for label, r in rows.items():
                metric, ret = r["retention"]["metric"], r["retention"]
                lines.append(f"| {task} | {label} | {r.get('n_train', '—')} | {r['epochs']} | {metric} {r['dev'][metric]:.2f} | "
                             f"{ret['teacher']:.2f} | {100 * ret['ratio']:.1f}% | {r['seconds_per_epoch']:.0f} |")
        sst2 = results["ablation"].get("sst2", {})
        if "hard labels only" in sst2 and "KD" in sst2:
            plain, kd = sst2["hard labels only"]["seconds_per_epoch"], sst2["KD"]["seconds_per_epoch"]
            lines += ["", f"**Cost of the cached teacher**: one KD epoch {kd:.0f} s vs one plain fine-tuning epoch of the "
                      f"same student {plain:.0f} s: ratio {kd / plain:.2f} (target <= 1.15; both measured in this run, "
                      "dev evaluation included in both). The teacher's one pass over the training set to fill the cache "
                      "is paid once and reused by every later run with the same teacher and data."]
    if results.get("latency"):
        lines += ["", "## Latency (one run, each model in its own process)", "", format_markdown(results["latency"])]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
