"""all-MiniLM-L6-v2 against its peers: every contender in one run, one scorer, the same turns at the same speeds.

    python -m bench.peers --data ../shared/data --work runs/peers --out bench/results/$(date +%F)/peers

Run it with ``.venv/bin/python`` (the toolkit's environment); the peers whose pins clash run
under ``--python-t4`` (``.venv-transformers4``). Three stages, each cached in ``--work``:

1. build (``bench.peers.build``, one process per step, in the step's environment): the peers'
   artefacts made with the peers' own tools (sentence-transformers' ONNX / OpenVINO exports and
   int8 helpers, ONNX Runtime's transformer optimizer + quantizer, CTranslate2's converter,
   model2vec's ``distill``) and the toolkit's (``export`` to ONNX, OpenVINO and CTranslate2 float32
   and int8, ``quantize`` dynamic and static, ``distill_embedding`` 3L-384 and 2L-384 with their
   exports and int8, ``distill_static`` plain and refined; only the contenders the run selected).
   A finished artefact is reused; one whose settings changed is rebuilt.
2. score (``bench.peers.timing``): each contender, in its own process, embeds the STS-B dev and
   MRPC dev sentences; one scorer here (``bench.peers.report.score``) gives every contender's
   STS-B Spearman x100 of the cosine and MRPC recall@1 / MRR, and the cosine of its embeddings
   with sentence-transformers' own (PyTorch) embeddings of the same sentences.
3. time: all workers loaded and warmed up, then ``--rounds`` rounds in which each in turn embeds
   a seeded sample of real STS-B dev sentences one at a time (batch 1, each at its own length)
   and in chunks of 32; medians over rounds.

Writes ``peers.md`` (header: date, CPU with its int8/bf16/AMX flags and the precisions they give,
both environments' versions, the command, the reduced settings), ``peers.json`` and ``pareto.png``
to ``--out``, with the goal's verdicts.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.peers.contenders import REFERENCE, STEPS, Contender, select
from bench.peers.timing import ROOT, rounds, start_all, summary, thread_env


@dataclass(frozen=True)
class PeersConfig:
    data: str = "../shared/data"  # the shared data folder (glue/, corpus/)
    work: str = "runs/peers"  # built artefacts, embeddings, logs (kept: a re-run reuses them)
    out: str = ""  # report folder: peers.md, peers.json, pareto.png
    rounds: int = 5  # timing rounds (medians over them)
    warmup_passes: int = 1  # untimed passes over the timing sentences per batch size after loading
    timing_sentences: int = 400  # seeded sample of distinct STS-B dev sentences that every contender is timed on
    threads: int = 2  # threads of every runtime
    stsb_pairs: int | None = None  # score on the first N STS-B dev pairs (None: all 1,500)
    distill_sentences: int = 32000  # training sentences of each distilled student (a seeded sample of the user's)
    refine_sentences: int = 32000  # at most this many sentences refine the static student
    refine_on: str = "pool"  # pool: the user's sentences as everywhere else; stsb: the STS-B training sentences alone
    epochs: int = 1  # distillation epochs
    batch_size: int = 64  # distillation batch
    lr: float = 2e-4  # distillation learning rate
    calibration_examples: int = 128  # sentences calibrating the toolkit's static int8
    ov_calibration_samples: int = 300  # num_samples of sentence-transformers' OpenVINO static int8 (NNCF's default subset)
    seed: int = 42  # the students' and the refinement's sentence sample
    only: tuple[str, ...] = ()  # contenders or steps to run (empty: all)
    skip: tuple[str, ...] = ()  # contenders or steps to leave out
    python_t4: str = ".venv-transformers4/bin/python"  # the transformers 4.57 environment (relative to the repository)
    note: str = ""  # a line for the report


# The full run's settings, against which the report marks a reduced one.
FULL = PeersConfig()
REDUCIBLE = ("rounds", "timing_sentences", "threads", "stsb_pairs", "distill_sentences", "refine_sentences", "refine_on",
             "calibration_examples", "ov_calibration_samples", "warmup_passes")
REFINE_ON = ("stsb", "pool")


# ---------------------------------------------------------------------------- data


def read_pairs(data: Path, stsb_pairs: int | None) -> tuple[list, list]:
    """STS-B dev ``(s1, s2, score)`` (the first ``stsb_pairs``) and MRPC dev ``(s1, s2, label)``, read by the toolkit."""
    from compress.core.data.sources import DataSource, load_split  # deferred: heavy
    from compress.core.data.tasks import get_task

    source = DataSource(data_dir=str(data / "glue"))
    stsb = load_split(get_task("stsb"), "dev", source, stsb_pairs)
    mrpc = load_split(get_task("mrpc"), "dev", source)
    equivalent = get_task("mrpc").label_names.index("equivalent")
    return ([(a, b, float(s)) for a, b, s in zip(stsb["sentence1"], stsb["sentence2"], stsb["label"])],
            [(a, b, int(label == equivalent)) for a, b, label in zip(mrpc["sentence1"], mrpc["sentence2"], mrpc["label"])])


def timing_sample(stsb: list, n: int, seed: int = 0) -> list[str]:
    """A seeded sample of ``n`` distinct STS-B dev sentences, in a seeded order (each at its own length)."""
    distinct = list(dict.fromkeys(s for a, b, _ in stsb for s in (a, b)))
    return random.Random(seed).sample(distinct, min(n, len(distinct)))


def token_stats(teacher: Path, texts: list[str]) -> dict[str, float]:
    """Tokens per timing sentence in the teacher's tokenizer ([CLS] and [SEP] included)."""
    import numpy as np  # deferred
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(teacher / "tokenizer.json"))
    tok.no_padding()  # the packaged tokenizer.json pads to 128: count each sentence's own tokens
    tok.enable_truncation(256)  # the folder's max_seq_length
    lengths = [len(e.ids) for e in tok.encode_batch(texts)]
    return {"mean": float(np.mean(lengths)), "median": float(np.median(lengths)), "max": int(max(lengths))}


# ---------------------------------------------------------------------------- stage 1: build


def build_all(cfg: PeersConfig, contenders: list[Contender], teacher: Path, pythons: dict[str, str],
              int8_preset: str) -> tuple[dict[str, dict], dict[str, dict]]:
    """Run every step the contenders need (skipping one whose records exist with the same settings).

    Returns (contender -> its build record, or {"error": ...}; step -> {"seconds", "cached", "error"}).
    """
    from bench.peers.build import step_key  # the coordinator reads its records

    work, needed = Path(cfg.work).resolve(), {c.step for c in contenders}
    settings, builds, steps = asdict(cfg), {}, {}
    (work / "logs").mkdir(parents=True, exist_ok=True)
    for step in (s for s in STEPS if s.name in needed):
        mine = [c for c in contenders if c.step == step.name]
        files = [work / "builds" / f"{c.name}.json" for c in mine]
        old = [json.loads(f.read_text()) if f.is_file() else None for f in files]
        key = step_key(step.name, settings)
        cached = all(o is not None and o.get("key") == key for o in old)
        began, error = time.monotonic(), None
        if not cached:
            print(f"== build {step.name} ({step.venv})", flush=True)
            log = work / "logs" / f"build-{step.name}.log"
            command = [pythons[step.venv], "-m", "bench.peers.build", step.name, "--work", str(work),
                       "--data", str(Path(cfg.data).resolve()), "--teacher", str(teacher),
                       "--settings", json.dumps(settings), "--int8-preset", int8_preset,
                       "--contenders", ",".join(c.name for c in mine)]
            if any(o is not None and o.get("key") != key for o in old):
                command.append("--rebuild")  # made under other settings
            with open(log, "w", encoding="utf-8") as f:
                rc = subprocess.run(command, cwd=ROOT, env=thread_env(cfg.threads), stdout=f, stderr=subprocess.STDOUT).returncode
            if rc != 0:
                error = f"build step {step.name} failed (exit {rc}): {last_line(log)} (log: {log})"
                print("   " + error, flush=True)
        for c, f in zip(mine, files):
            builds[c.name] = {"error": error} if error or not f.is_file() else json.loads(f.read_text())
        seconds = builds[mine[0].name].get("step_seconds") if cached else round(time.monotonic() - began, 1)
        steps[step.name] = {"seconds": seconds, "cached": cached, "error": error, "venv": step.venv}
    return builds, steps


def interpreters(cfg: PeersConfig, contenders: list[Contender]) -> dict[str, str]:
    """The Python of each environment the selected contenders and their build steps use; a missing one refused now."""
    needed = {c.venv for c in contenders} | {s.venv for s in STEPS if s.name in {c.step for c in contenders}}
    t4 = Path(cfg.python_t4) if Path(cfg.python_t4).is_absolute() else ROOT / cfg.python_t4
    pythons = {"main": sys.executable, "t4": str(t4)}
    if "t4" in needed and not t4.is_file():
        names = ", ".join(c.name for c in contenders if c.venv == "t4")
        raise SystemExit(f"bench.peers: {names} run under {t4}, which does not exist: make the transformers 4.57 "
                         f"environment (make venv CONSTRAINTS=constraints-transformers4.txt EXTRAS=dev,optimum,sentence "
                         f"VENV=.venv-transformers4), pass --python-t4, or leave them out with --skip")
    return {venv: python for venv, python in pythons.items() if venv in needed | {"main"}}


def last_line(log: Path) -> str:
    lines = [line.strip() for line in log.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    return lines[-1][:400] if lines else "(no output)"


def env_versions(python: str) -> dict[str, str] | str:
    """Package versions of one environment (the worker's list), or why they could not be read."""
    code = "import json, bench.peers.worker as w; print(json.dumps(w.versions()))"
    done = subprocess.run([python, "-c", code], cwd=ROOT, env=thread_env(1), capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else f"unreadable: {done.stderr[-200:]}"


# ---------------------------------------------------------------------------- the run


def weight_mb(build: dict[str, Any]) -> float | None:
    """Megabytes (1e6 bytes) of the files holding the weights: the record's list, else the folder's weight files."""
    folder = Path(build["folder"])
    files = [folder / w for w in build.get("weights") or []] or [
        p for p in folder.iterdir() if p.is_file() and p.suffix in (".safetensors", ".onnx", ".onnx_data", ".bin", ".xml")]
    return sum(p.stat().st_size for p in files) / 1e6 if files else None


def make_rows(contenders, builds, workers, plan, work: Path, n_timing: int) -> list[dict[str, Any]]:
    """One row per contender: scores from its embeddings (one scorer), size, speeds, agreement with ST's own."""
    import numpy as np  # deferred

    from bench.peers.report import agreement, score

    reference = work / "embeddings" / f"{REFERENCE}.npy"
    ref = np.load(reference) if REFERENCE in workers and workers[REFERENCE].embedded else None
    rows = []
    for c in contenders:
        build, row = builds.get(c.name) or {}, {"name": c.name, "side": c.side, "label": c.label, "precision": c.precision,
                                                "model": c.model, "venv": c.venv, "status": "ok"}
        worker = workers.get(c.name)
        error = build.get("error") or (worker.error if worker else "not started")
        npy = work / "embeddings" / f"{c.name}.npy"
        if worker is not None and worker.embedded:
            vectors = np.load(npy)
            row.update(score(vectors, plan))
            row["agreement"] = agreement(vectors, ref) if ref is not None else None
        if "folder" in build:
            row.update({"mb": weight_mb(build), "made_with": build["made_with"], "folder": build["folder"]})
        if worker is not None:
            row.update(summary(worker, n_timing))
        if error:
            row.update({"status": f"failed: {error}", "b1": None, "b32": None})
        rows.append(row)
    return rows


def run(cfg: PeersConfig, command: str) -> Path:
    """Build, score, time and report; the report's folder."""
    from bench.peers.render import plot, render
    from bench.peers.report import make_plan, pareto_front, verdicts
    from bench.teachers import minilm_path
    from compress.core.formats.records import utc_now
    from compress.core.formats.writes import write_json_atomic
    from compress.core.hardware import cpu_summary, precisions

    started, load_before = time.monotonic(), os.getloadavg()
    work, out = Path(cfg.work).resolve(), Path(cfg.out)
    (work / "texts").mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    contenders, teacher = select(cfg.only, cfg.skip), minilm_path()
    pythons = interpreters(cfg, contenders)
    stsb, mrpc = read_pairs(Path(cfg.data), cfg.stsb_pairs)
    plan, timing = make_plan(stsb, mrpc), timing_sample(stsb, cfg.timing_sentences)
    texts = {"score": work / "texts" / "score.json", "timing": work / "texts" / "timing.json"}
    texts["score"].write_text(json.dumps(plan.texts), encoding="utf-8")
    texts["timing"].write_text(json.dumps(timing), encoding="utf-8")

    builds, steps = build_all(cfg, contenders, teacher, pythons, precisions().int8_preset)
    build_seconds = time.monotonic() - started
    environments = {venv: {"python": py, "packages": env_versions(py)} for venv, py in pythons.items()}
    workers = start_all(contenders, builds, pythons, threads=cfg.threads, work=work, texts=texts,
                        warmup_passes=cfg.warmup_passes)

    def report(landed: int | None) -> None:
        """peers.json, pareto.png and peers.md from what has been measured; ``landed``: rounds so far (None: all)."""
        rows = make_rows(contenders, builds, workers, plan, work, len(timing))
        header = {"date": utc_now(), **cpu_summary(), "precisions": asdict(precisions()), "threads": cfg.threads,
                  "command": command, "note": cfg.note,
                  "config": asdict(cfg), "full": asdict(FULL), "reduced": {k: getattr(cfg, k) for k in REDUCIBLE
                                                                          if getattr(cfg, k) != getattr(FULL, k)},
                  "environments": environments,
                  "data": {"stsb_pairs": len(stsb), "mrpc_pairs": len(mrpc), "scored_sentences": len(plan.texts),
                           "mrpc_queries": int(len(plan.queries)), "mrpc_candidates": int(len(plan.candidates)),
                           "timing_sentences": len(timing), "timing_tokens": token_stats(teacher, timing)},
                  "teacher": str(teacher), "load_average": {"before": load_before, "after": os.getloadavg()},
                  "minutes": {"build": build_seconds / 60, "total": (time.monotonic() - started) / 60}, "steps": steps,
                  "rounds_done": cfg.rounds if landed is None else landed}
        if landed is not None and landed < cfg.rounds:
            header["note"] = f"{cfg.note} (partial: {landed} of {cfg.rounds} timing rounds so far)".strip()
        result = {"header": header, "rows": rows, "front": {"b1": pareto_front(rows, "b1"), "b32": pareto_front(rows, "b32")},
                  "goal": verdicts(rows)}
        write_json_atomic(out / "peers.json", result)
        plot(rows, result["front"], out / "pareto.png")
        (out / "peers.md").write_text(render(result), encoding="utf-8")

    try:
        timed = {n: w for n, w in workers.items() if not w.error}
        rounds(timed, cfg.rounds, texts["timing"], landed=report)
    finally:
        for w in workers.values():
            w.close()
    report(None)
    return out


def parse(argv=None) -> PeersConfig:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = PeersConfig()
    for name, value in asdict(defaults).items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, tuple):
            parser.add_argument(flag, default="", help="comma-separated contender or step names")
        else:
            kind = int if name == "stsb_pairs" else type(value)
            parser.add_argument(flag, type=kind, default=value, required=name == "out", help=f"(default: {value})")
    args = vars(parser.parse_args(argv))
    for name in ("only", "skip"):
        args[name] = tuple(filter(None, args[name].split(",")))
    cfg = PeersConfig(**args)
    if cfg.refine_on not in REFINE_ON:
        parser.error(f"--refine-on is one of {', '.join(REFINE_ON)}, not {cfg.refine_on!r}")
    if min(cfg.rounds, cfg.timing_sentences, cfg.threads, cfg.distill_sentences, cfg.refine_sentences) < 1:
        parser.error("--rounds, --timing-sentences, --threads and the sentence counts must be at least 1")
    return cfg


def main(argv=None) -> int:
    cfg = parse(argv)
    command = "python -m bench.peers " + " ".join(sys.argv[1:] if argv is None else argv)
    out = run(cfg, command)
    print((out / "peers.md").read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
