"""The headline table: accuracy, size and speed of every compressed model, the five targets, a profile.

Called by ``python -m bench`` after the recipe has produced the models. All latencies come
from ONE ``measure_latency`` call repeated ``runs`` times (each model in its own process, all
loaded at once and taking turns in bursts; the GEMM peaks of every engine, the BERT-base
shape on every fp32 backend and the real SST-2 dev sentences in the same call); accuracy comes from the dev evaluations
each stage recorded in its model's metrics.json. ``compute_targets`` turns that report
into the verdicts and is pure, so it is tested on a hand-made report.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from bench.profile import run_worker
from bench.retention import best_rows
from bench.teachers import minilm_path
from compress.core.formats.records import read_compression, read_metrics, utc_now
from compress.core.formats.writes import write_json_atomic
from compress.core.formats.onnx import export_onnx
from compress.core.hardware import hardware, package_versions
from compress.core.data.tasks import get_task
from compress.eval.latency.config import MIN_PASSES, REAL_SLICE_S, LatencyConfig
from compress.eval.latency.report import BELOW_FLOOR, report_record
from compress.eval.latency.runs import measure_latency
from compress.eval.plots import _pyplot, save_figure
from compress.eval.references import published_score
from compress.core.model.shapes import resolve_shape
from compress.teacher.create import create_model

# Table rows: (label, model directory name under the work dir, the model it is: fp32 variants and int8 share it).
ROWS = (
    ("teacher MiniLM-L6 fp32 (PyTorch)", "teacher-sst2", "teacher"),
    ("teacher fp32 (ONNX Runtime)", "teacher-sst2-onnx", "teacher"),
    ("teacher fp32 (OpenVINO)", "teacher-sst2-ov", "teacher"),
    ("teacher int8 (ONNX Runtime dynamic)", "teacher-sst2-int8", "teacher"),
    ("teacher int8 (OpenVINO + NNCF static)", "teacher-sst2-int8-ov", "teacher"),
    ("teacher int8 (PyTorch dynamic)", "teacher-sst2-int8-torch", "teacher"),
    ("student 3L-384 (KD)", "student-3L-384", "3L-384"),
    ("student 3L-384 fp32 (ONNX Runtime)", "student-3L-384-onnx", "3L-384"),
    ("student 3L-384 fp32 (OpenVINO)", "student-3L-384-ov", "3L-384"),
    ("student 3L-384 int8 (ONNX Runtime)", "student-3L-384-int8", "3L-384"),
    ("student 3L-384 int8 (OpenVINO)", "student-3L-384-int8-ov", "3L-384"),
    ("student 3L-384, 50% heads pruned", "student-3L-384-heads50", "3L-384-heads50"),
    ("student 4L-312 (cut from the teacher, KD)", "student-4L-312", "4L-312"),
    ("student 4L-312 fp32 (ONNX Runtime)", "student-4L-312-onnx", "4L-312"),
    ("student 4L-312 fp32 (OpenVINO)", "student-4L-312-ov", "4L-312"),
    ("student 4L-312 int8 (ONNX Runtime)", "student-4L-312-int8", "4L-312"),
    ("student 4L-312 int8 (OpenVINO)", "student-4L-312-int8-ov", "4L-312"),
    ("student 2L-384 (cut from the teacher, KD)", "student-2L-384", "2L-384"),
    ("student 2L-384 int8 (ONNX Runtime)", "student-2L-384-int8", "2L-384"),
    ("student 2L-384 int8 (OpenVINO)", "student-2L-384-int8-ov", "2L-384"),
    ("student 2L-384, 50% FFN neurons pruned", "student-2L-384-ffn50", "2L-384-ffn50"),
    ("student 2L-384, 50% FFN and 50% heads pruned", "student-2L-384-ffn50-heads50", "2L-384-ffn50-heads50"),
    ("student 2L-384, 75% FFN and 50% heads pruned", "student-2L-384-ffn75-heads50", "2L-384-ffn75-heads50"),
    ("student 2L-384, 75% FFN, 50% heads pruned, int8 (ONNX Runtime)", "student-2L-384-ffn75-heads50-int8", "2L-384-ffn75-heads50"),
    ("student 2L-384, 75% FFN, 50% heads pruned, int8 (OpenVINO)", "student-2L-384-ffn75-heads50-int8-ov", "2L-384-ffn75-heads50"),
)
# Each point's timed passes last at least this long (still >= --repeats passes): 20 passes of a 2 ms model take
# 40 ms, which one slow spell of the shared machine can cover whole (a 1.80 ms model once timed 2.50 ms in one run).
# So do the passes over the real SST-2 sentences: the fastest student's pass takes 0.3 s (headline-6's run 2 timed it
# at 2,225 sentences/s against 2,975 and 3,047 in the others, with 2 passes).
MIN_SECONDS = 2.0
# ... and no longer than this once 3 passes are in: the BERT-base shape's 20 passes at batch 32 took 70-90 s per backend
# and run, and its 2 passes over the SST-2 dev set at batch 1 up to 2 minutes, about half of each latency run.
MAX_SECONDS = 20.0
# Target 5's ratio is timed again after the table: the teacher on its fp32 backends and the REAL_CANDIDATES fastest
# students at the retention bar, loaded at once and taking turns (each point's passes in BURSTS bursts, the real
# sentences in half-second turns: compress latency --bursts), so that a slow spell lands on both sides of the ratio.
# In the table, timed one model after another, a slow spell of a few minutes landed on one model of one run
# (headline-fresh: the fastest student's ONNX Runtime int8 did 2,047 sentences/s in run 2 against 3,502 and 3,518, so
# target 5 failed in that run alone). The table itself cannot take turns: every model loaded at once does not fit in
# 24 GiB (OpenVINO keeps one compiled model per padded shape; the BERT-base shape's take about 0.8 GB each).
BURSTS, REAL_CANDIDATES = 4, 3
TASKS = ("sst2", "mrpc", "stsb")  # the teachers the recipe trains: SST-2 for the table, all three for int8 drops
# Target 2's models: the same shape trained on each of TASKS (group -> task -> fp32 folder under the work dir).
INT8_TASK_MODELS = {
    "teacher": {t: f"teacher-{t}" for t in TASKS},
    "3L-384": {t: "student-3L-384" if t == "sst2" else f"student-3L-384-{t}" for t in TASKS},  # as the recipe names them
}
REFERENCE_BACKENDS = ("torch", "onnxruntime", "openvino")  # the BERT-base shape on each: the fastest is the reference
# The targets: (1) speed-up over BERT-base-shape fp32 on its fastest backend, at an SST-2 retention;
# (2) int8 over the same model's fastest fp32, and its drops; (3) BERT-base shape's share of the fp32 peak;
# (4) the best small int8 model's distance to its int8 floor; (5) real SST-2 sentences vs the teacher's fastest fp32.
TARGET_SPEEDUP_VS_BASE = 60.0
TARGET_RETENTION = 0.98
TARGET_INT8_SPEEDUP = 2.5
TARGET_INT8_DROP = 0.5
TARGET_PEAK = 0.75
TARGET_FLOOR = 1.5
TARGET_REAL_SPEEDUP = 10.0


def _dev(model_dir: Path, task: str) -> float | None:
    """The latest dev primary metric a stage recorded for ``task``."""
    metric = get_task(task).primary_metric
    for r in reversed(read_metrics(model_dir)):
        if r.get("kind") == "eval" and r.get("task") == task and r.get("split") in ("dev", "dev_matched"):
            if metric in r.get("metrics", {}):
                return float(r["metrics"][metric])
    return None


def bert_base_shape(work: Path) -> Path:
    """A randomly initialised BERT-base-shaped classifier: the speed reference."""
    out = work / "bert-base-shape"
    if not (out / "config.json").is_file():
        create_model(resolve_shape("base"), out, tokenizer=minilm_path() / "vocab.txt", task="sst2", overwrite=True)
    return out


def models_of(work: Path, auto: list[Path]) -> list[dict[str, Any]]:
    """The table's models present in ``work`` (and the auto-chosen ones): label, directory, model group, SST-2 dev."""
    models = [{"label": label, "dir": work / name, "group": group} for label, name, group in ROWS
              if (work / name / "config.json").is_file()]
    models += [{"label": _auto_label(d), "dir": d, "group": f"auto:{d.name}"} for d in auto if (d / "config.json").is_file()]
    for m in models:
        # An exported fp32 copy scores what its source scored (the export is checked against it).
        m["sst2"] = _dev(m["dir"], "sst2")
    return models


def auto_search(model_dir: Path) -> dict[str, Any] | None:
    """What ``compress auto`` recorded beside the model it chose: budget, choice, dev score, search minutes."""
    path = model_dir / "search" / "search.json"
    if not path.is_file():
        return None
    report = json.loads(path.read_text())
    chosen = report.get("chosen") or {}
    return {"dir": str(model_dir), "budgets": report.get("budgets", []), "chosen": chosen.get("name"),
            "accuracy": chosen.get("accuracy"), "minutes": round(report.get("seconds", 0) / 60, 1),
            "trained": len(report.get("trained", [])), "halving_stopped": report.get("halving_stopped")}


def _auto_label(model_dir: Path) -> str:
    search = auto_search(model_dir)
    if not search or not search["chosen"]:
        return f"auto-chosen: {model_dir.name}"
    return f"auto-chosen under {'; '.join(search['budgets'])}: {search['chosen']}"


def build_results(work: Path, glue: Path, *, repeats: int = 20, runs: int = 3, auto: list[Path] = (),
                  retention: list[Path] | None = None) -> dict[str, Any]:
    base = bert_base_shape(work)
    models = models_of(work, list(auto))
    for m in models:  # exports carry no eval of their own: their source's score
        if m["sst2"] is None:
            parent = (read_compression(m["dir"]).get("parent") or {}).get("path")
            source = next((o for o in models if o["group"] == m["group"] and o["sst2"] is not None and parent
                           and Path(parent).resolve() == Path(o["dir"]).resolve()), None)
            m["sst2"] = source["sst2"] if source else None
    # The reports as latency.json holds them (rows as dicts): the targets are computed on that, as on a bench.json
    # read back, and go into bench.json as they are.
    latency = report_record(measure_latency([base] + [m["dir"] for m in models], LatencyConfig(
        batch=(1, 32), seq=(128,), repeats=repeats, min_seconds=MIN_SECONDS, max_seconds=MAX_SECONDS, warmup=5, repeat_runs=runs,
        reference_backends=REFERENCE_BACKENDS, lengths="sst2", data_dir=str(glue), lengths_passes=2, record=False)))
    teacher_scores = {t: _dev(work / f"teacher-{t}", t) for t in TASKS}
    for m in models:
        m["retention"] = m["sst2"] / teacher_scores["sst2"] if m["sst2"] is not None and teacher_scores["sst2"] else None
    table = [{k: (str(v) if isinstance(v, Path) else v) for k, v in m.items()} for m in models]
    drops = _int8_drops(work)
    turns = real_in_turns(latency, table, glue, runs)
    targets = compute_targets(latency, table, drops, base.name, real=turns)
    best = targets["speed"].get("model")
    profile = _profile(work, Path(best).name) if best and Path(best).parent == work else None
    return {
        "date": utc_now(), "hardware": hardware(), "packages": package_versions(), "models": table,
        "teacher_scores": teacher_scores, "base": base.name, "int8": drops, "targets": targets, "profile": profile,
        "latency": latency, "real_in_turns": turns, "retention": _retention_rows(retention) if retention else None,
        "retention_files": [str(p) for p in retention or ()],
        "auto": [a for a in (auto_search(Path(d)) for d in auto) if a],
        "settings": _settings(work, read_metrics),
    }


def real_candidates(latency: dict, models: list[dict]) -> tuple[list[str], list[str]]:
    """Target 5's sides, from the table's timings: the teacher's fp32 folders (one per backend) and the
    REAL_CANDIDATES students at the retention bar that scored the real sentences fastest at batch 1."""
    teachers, students = _real_sides(latency.get("real_rows", []), _rows_at(latency, 1), models)
    return [r["model"] for r in teachers], [r["model"] for r in students[:REAL_CANDIDATES]]


def real_in_turns(latency: dict, models: list[dict], glue: Path, runs: int) -> dict | None:
    """Target 5's sides timed again on the SST-2 dev sentences at batch 1, loaded at once and taking turns (``runs``
    runs); None when the table has no teacher or no student to compare."""
    teachers, students = real_candidates(latency, models)
    if not teachers or not students:
        return None
    return report_record(measure_latency(teachers + students, LatencyConfig(
        batch=(1,), seq=(128,), repeats=BURSTS, bursts=BURSTS, min_seconds=MIN_SECONDS, max_seconds=MAX_SECONDS, warmup=5,
        repeat_runs=runs, peak=False, lengths="sst2", data_dir=str(glue), lengths_batch=1, lengths_passes=2, record=False)))


def _turns_lines(results: dict[str, Any]) -> list[str]:
    """Target 5's second measurement: how it was taken and each model's sentences per second in every run."""
    turns = results.get("real_in_turns")
    if not turns:
        return []
    labels = {m["dir"]: m["label"] for m in results["models"]}
    cfg = turns.get("config", {})
    lines = ["", "## Target 5 timed again, the models taking turns", "",
             f"The teacher on each fp32 backend and the {REAL_CANDIDATES} students at the retention bar that were fastest on "
             f"the real sentences above, each in its own process, all loaded at once, {turns.get('repeat_runs', '?')} runs: "
             f"in each, they took turns of {REAL_SLICE_S:g} s on the {(turns.get('real_inputs') or {}).get('n', '?')} SST-2 "
             f"dev sentences at batch 1 (at least {cfg.get('lengths_passes', '?')} passes and {_fmt(cfg.get('min_seconds'), 'g')} "
             "s each; a model done early kept its turns for extra passes until the last was done, so every model's "
             "median pass comes from the same minutes), so a slow spell of the machine lands on both sides of the ratio.",
             "", "| model | backend | sentences/s (median) | each run | passes in each run |", "|---|---|--:|---|---|"]
    for r in turns.get("real_rows", []):
        if r["batch"] == 1:
            passes = ", ".join(str(p) for p in r.get("runs_passes") or []) or "—"  # reports from before extra passes
            lines.append(f"| {labels.get(r['model'], Path(r['model']).name)} | {r['backend']} | {r['sentences_per_s']:.0f} | "
                         + ", ".join(f"{v:.0f}" for v in r["runs_sentences_per_s"]) + f" | {passes} |")
    return lines


def _settings(work: Path, read_metrics) -> dict[str, Any]:
    """Training-set sizes and times per stage, from the stages' own records."""
    out = {}
    for d in sorted(p for p in work.iterdir() if (p / "config.json").is_file()):
        training = next((r for r in read_metrics(d) if r.get("kind") == "training"), None)
        if training:
            out[d.name] = {"n_train": training.get("n_train"), "seconds": training.get("seconds")}
    return out


def _int8_drops(work: Path) -> dict[str, Any]:
    """Accuracy of each int8 model against its fp32 parent, as the quantize stage measured it."""
    drops = {}
    for d in sorted(work.glob("*-int8*")):
        summary = next((r for r in read_metrics(d) if r.get("kind") == "quantize"), None)
        if summary:
            drops[d.name] = {k: summary[k] for k in ("task", "metric", "parent", "quantized", "drop")}
    return drops


def _retention_rows(paths: list[Path]) -> list[dict[str, Any]]:
    """The retention benchmark's best row per task and student (seeds averaged; each task against its strongest
    teacher across ``paths``), for the per-task table."""
    best = best_rows({str(p): json.loads(Path(p).read_text())["rows"] for p in paths})
    return sorted(best.values(), key=lambda r: (r["student"], r["task"]))


# ---------------------------------------------------------------------------- targets (pure: a report in, verdicts out)


def _real_sides(real_rows: list[dict], b1: dict[str, dict], models: list[dict]) -> tuple[list[dict], list[dict]]:
    """Target 5's sides among real-input rows at batch 1: the teacher's fp32 rows, and the rows of the students at the
    retention bar, fastest first (``b1``: the table's batch-1 rows by model, which say each one's precision)."""
    group = {m["dir"]: m for m in models}
    real = [r for r in real_rows if r["batch"] == 1]
    teachers = [r for r in real if group.get(r["model"], {}).get("group") == "teacher"
                and b1.get(r["model"], {}).get("precision") == "fp32"]
    keeping = {m["dir"] for m in models if m["group"] != "teacher" and (m.get("retention") or 0) >= TARGET_RETENTION
               and m["dir"] in b1}
    return teachers, sorted((r for r in real if r["model"] in keeping), key=lambda r: -r["sentences_per_s"])


def _rows_at(latency: dict, batch: int) -> dict[str, dict]:
    return {r["model"]: r for r in latency["rows"] if r["batch"] == batch and r["seq"] == 128}


def _per_run_min(a: list[float], b: list[float]) -> float:
    """The worst run's ratio a/b (a speed-up holds only if it holds in every run)."""
    return min(x / y for x, y in zip(a, b))


def _below_floor(points: tuple[dict, ...], precision: str) -> list[tuple[str, float]]:
    """(model, x floor) of every row of ``precision`` that ran clearly faster than its floor at the run's measured peak."""
    return [(Path(r["model"]).name, r["x_floor"]) for rows in points for r in rows.values()
            if r.get("precision") == precision and r.get("x_floor") is not None and r["x_floor"] < BELOW_FLOOR]


def _not_judged_if_peak_short(target: dict, precision: str, faster: list[tuple[str, float]]) -> None:
    """A model cannot beat its floor: if one did, the measured peak is too low and the target is not judged."""
    if not faster:
        return
    name, x = min(faster, key=lambda f: f[1])
    target.update(met=False, not_judged=f"{name} ran at {x:.2f}x its floor, faster than the measured {precision} peak "
                                         "allows: the peak fell short (a slow spell while it was measured, or an engine "
                                         "timed below its best), so this run cannot judge it")


def compute_targets(latency: dict, models: list[dict], drops: dict, base: str,
                    task_models: dict[str, dict[str, str]] = INT8_TASK_MODELS, real: dict | None = None) -> dict[str, Any]:
    """Targets 1-5 from one latency report (rows per model and point, ``real_rows``, peaks, the reference).

    ``real``: a second report whose ``real_rows`` target 5 is judged on (:func:`real_in_turns`); without
    it, the first report's.

    ``models``: dicts with ``dir`` (the latency row's ``model``), ``label``, ``group`` (fp32
    variants and int8 of one model share it) and ``retention`` (SST-2, of the teacher).
    ``drops``: int8 directory name -> the quantize stage's record (task, drop).
    ``task_models``: the groups target 2 judges -> their fp32 folder per task (the int8 drops are of
    ``<folder>-int8-ov`` or ``<folder>-int8``, whichever backend is the group's fastest int8 at b1).
    """
    b1, b32 = _rows_at(latency, 1), _rows_at(latency, 32)
    return {"speed": _speed_target(models, b1), "int8": _int8_target(models, b1, b32, drops, task_models),
            "peak": _peak_target(latency, b1, b32, base), "floor": _floor_target(models, b1, b32),
            "real": _real_target(latency, models, b1, real)}


def _speed_target(models: list[dict], b1: dict[str, dict]) -> dict[str, Any]:
    """Target 1: the fastest compressed model at the retention bar, against BERT-base on its fastest fp32 backend."""
    keeping = [m for m in models if m["group"] != "teacher" and (m.get("retention") or 0) >= TARGET_RETENTION
               and m["dir"] in b1]
    best = max(keeping, key=lambda m: b1[m["dir"]]["speedup_vs_best_fp32"], default=None)
    out = {"target": f">= {TARGET_SPEEDUP_VS_BASE:g}x faster than BERT-base-shape fp32 on its fastest fp32 backend "
                     f"(b1, s128; every run) at >= {TARGET_RETENTION:.0%} of the teacher's SST-2 accuracy"}
    if best:
        row = b1[best["dir"]]
        out.update(model=best["dir"], label=best["label"], retention=best["retention"],
                   speedup=row["speedup_vs_best_fp32"], speedup_min=row["speedup_vs_best_fp32_min"],
                   reference=row["best_fp32_backend"], speedup_vs_torch=row.get("speedup_vs_torch"),
                   met=row["speedup_vs_best_fp32_min"] >= TARGET_SPEEDUP_VS_BASE)
    else:
        out["met"] = False
    return out


def _int8_pairs(models: list[dict], b1: dict[str, dict], b32: dict[str, dict]) -> dict[str, dict]:
    """Per model group and batch: its fastest int8 row against its fastest fp32 variant, run by run."""
    pairs: dict[str, dict] = {}
    for name in {m["group"] for m in models}:
        members = [m for m in models if m["group"] == name]
        for batch, rows in ((1, b1), (32, b32)):
            fp32 = [rows[m["dir"]] for m in members if m["dir"] in rows and rows[m["dir"]]["precision"] == "fp32"]
            int8 = [rows[m["dir"]] for m in members if m["dir"] in rows and rows[m["dir"]]["precision"] == "int8"]
            if not fp32 or not int8:
                continue
            n = len(fp32[0]["runs_p50_ms"])
            best_fp32 = [min(r["runs_p50_ms"][i] for r in fp32) for i in range(n)]
            fast = min(int8, key=lambda r: r["p50_ms"])
            pairs.setdefault(name, {})[batch] = {
                "int8": fast["model"], "int8_backend": fast["backend"],
                "fp32": min(fp32, key=lambda r: r["p50_ms"])["backend"],
                "speedup": float(np.median(best_fp32)) / fast["p50_ms"], "speedup_min": _per_run_min(best_fp32, fast["runs_p50_ms"]),
            }
    return pairs


def _int8_target(models: list[dict], b1: dict[str, dict], b32: dict[str, dict], drops: dict,
                 task_models: dict[str, dict[str, str]]) -> dict[str, Any]:
    """Target 2: int8 against the same model's fastest fp32 variant, run by run; met by any model trained on all three
    tasks whose fastest int8 keeps the speed-up in every run and drops at most TARGET_INT8_DROP on each."""
    pairs = _int8_pairs(models, b1, b32)
    judged = {}
    for name, folders in task_models.items():
        speed = pairs.get(name, {})
        backend = (speed.get(1) or {}).get("int8_backend") or ""
        suffix = "-int8-ov" if backend.startswith("openvino") else "-int8"  # rows name the variant: "openvino-int8"
        task_drops = {t: drops[f"{d}{suffix}"]["drop"] for t, d in folders.items() if f"{d}{suffix}" in drops}
        judged[name] = {
            "drops": task_drops, "drops_of": ", ".join(f"{d}{suffix}" for d in folders.values()),
            "met": len(speed) == 2 and all(p["speedup_min"] >= TARGET_INT8_SPEEDUP for p in speed.values())
                   and len(task_drops) == len(folders) and all(d <= TARGET_INT8_DROP for d in task_drops.values()),
        }
    return {
        "target": f"int8 on its fastest backend >= {TARGET_INT8_SPEEDUP:g}x the same model on its fastest fp32 backend "
                  f"(b1 and b32, every run), <= {TARGET_INT8_DROP} point drop on SST-2, MRPC, STS-B",
        "pairs": pairs, "judged": judged, "met": any(j["met"] for j in judged.values()),
    }


def _peak_target(latency: dict, b1: dict[str, dict], b32: dict[str, dict], base: str) -> dict[str, Any]:
    """Target 3: the BERT-base shape on its fastest fp32 backend, as a share of the measured fp32 peak."""
    peak = (latency.get("peaks") or {}).get("fp32", {}).get("gflops")
    ref = (latency.get("reference") or {}).get("p50_ms", {})
    share = {}
    for batch, rows in ((1, b1), (32, b32)):
        base_row = next((r for m, r in rows.items() if Path(m).name == base), None)
        times = {b: v.get(f"b{batch},s128") for b, v in ref.items() if v.get(f"b{batch},s128")}
        if base_row and times and peak:
            fastest = min(times, key=times.get)
            # The FLOPs of the graph that backend ran (an exported classifier's last layer computes one token).
            gflops = ((latency.get("reference") or {}).get("gflops_per_seq") or {}).get(fastest, {}).get("128")
            share[batch] = {"backend": fastest, "p50_ms": times[fastest],
                            "pct": 100 * (gflops or base_row["gflops_per_seq"]) * batch / (times[fastest] / 1e3) / peak}
    out = {"target": f"BERT-base-shape fp32 on its fastest backend >= {TARGET_PEAK:.0%} of the measured fp32 peak at b1 and b32",
           "peak_gflops": peak, "share": share,
           "met": len(share) == 2 and all(v["pct"] >= 100 * TARGET_PEAK for v in share.values())}
    faster = [(f"BERT-base shape b{b} ({v['backend']})", 100 / v["pct"]) for b, v in share.items() if 100 / v["pct"] < BELOW_FLOOR]
    _not_judged_if_peak_short(out, "fp32", faster + _below_floor((b1, b32), "fp32"))
    return out


def _floor_target(models: list[dict], b1: dict[str, dict], b32: dict[str, dict]) -> dict[str, Any]:
    """Target 4: the best small int8 model (not the teacher) at b1, its distance to the int8 floor."""
    small = [b1[m["dir"]] for m in models if m["group"] != "teacher" and m["dir"] in b1
             and b1[m["dir"]]["precision"] == "int8" and b1[m["dir"]].get("x_floor")]
    closest = min(small, key=lambda r: r["p50_ms"], default=None)
    out = {"target": f"the fastest small int8 model within {TARGET_FLOOR:g}x of its int8 floor (b1, s128)",
           **({"model": closest["model"], "backend": closest["backend"], "p50_ms": closest["p50_ms"],
               "floor_ms": closest["floor_ms"], "x_floor": closest["x_floor"]} if closest else {}),
           "met": bool(closest) and closest["x_floor"] <= TARGET_FLOOR}
    _not_judged_if_peak_short(out, "int8", _below_floor((b1, b32), "int8"))
    return out


def _real_target(latency: dict, models: list[dict], b1: dict[str, dict], real: dict | None) -> dict[str, Any]:
    """Target 5: real SST-2 dev sentences at batch 1, the fastest student at the retention bar against the teacher's
    fastest fp32 backend, run by run (on ``real``'s rows when given, else the table's)."""
    turns = real is not None
    teacher_fp32, students = _real_sides((real if turns else latency).get("real_rows", []), b1, models)
    out = {"target": f"real SST-2 dev sentences at batch 1: the fastest student at >= {TARGET_RETENTION:.0%} retention "
                     f">= {TARGET_REAL_SPEEDUP:g}x the teacher on its fastest fp32 backend (every run"
                     + ("; timed again with the models taking turns" if turns else "") + ")", "met": False}
    if teacher_fp32 and students:
        n = len(teacher_fp32[0]["runs_sentences_per_s"])
        best_teacher = [max(r["runs_sentences_per_s"][i] for r in teacher_fp32) for i in range(n)]
        fastest = students[0]
        speedup_min = _per_run_min(fastest["runs_sentences_per_s"], best_teacher)
        out.update(model=fastest["model"], backend=fastest["backend"], sentences_per_s=fastest["sentences_per_s"],
                   teacher_sentences_per_s=float(np.median(best_teacher)),
                   teacher_backend=max(teacher_fp32, key=lambda r: r["sentences_per_s"])["backend"],
                   speedup=fastest["sentences_per_s"] / float(np.median(best_teacher)), speedup_min=speedup_min,
                   met=speedup_min >= TARGET_REAL_SPEEDUP)
    return out


def _profile(work: Path, model: str) -> dict[str, Any]:
    """Profile the best compressed model (and its fp32 parent): matmuls vs the rest; runtime settings."""
    target = work / model
    record = read_compression(target)
    fp32 = Path(record["parent"]["path"]) if record.get("format") == "onnx" and record.get("parent") else target
    result: dict[str, Any] = {"model": model, "fp32_parent": fp32.name}
    if record.get("format") == "openvino":  # ORT and torch profiles say nothing about an IR: the plugin's own counters
        result["ov_profile"] = run_worker({"kind": "ov-profile", "model_dir": str(target), "batch": 1, "seq": 128}, 2)
        return result
    if record.get("format") not in (None, "pytorch", "onnx"):
        return result
    result["torch_fp32"] = run_worker({"kind": "torch-profile", "model_dir": str(fp32), "batch": 1, "seq": 128}, 2)
    with tempfile.TemporaryDirectory() as tmp:
        onnx_fp32 = export_onnx(fp32, Path(tmp) / "fp32")
        result["ort_fp32"] = {
            level: run_worker({"kind": "ort-latency", "model_dir": str(onnx_fp32), "batch": 1, "seq": 128, "level": level}, 2)
            for level in ("ORT_DISABLE_ALL", "ORT_ENABLE_ALL")
        }
    if record.get("format") == "onnx":
        result["ort_int8_profile"] = run_worker({"kind": "ort-profile", "model_dir": str(target), "batch": 1, "seq": 128}, 2)
        result["ort_int8"] = {
            f"{level} x{threads}": run_worker({"kind": "ort-latency", "model_dir": str(target), "batch": 1, "seq": 128,
                                               "level": level}, threads)
            for level in ("ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_ALL") for threads in (1, 2)
        }
    return result


# ---------------------------------------------------------------------------- report


def write_results(results: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "bench.json", results)
    _plot(results, out / "pareto_sst2.png")
    (out / "report.md").write_text(render(results), encoding="utf-8")


def _b1(results) -> dict[str, dict]:
    return _rows_at(results["latency"], 1)


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the (latency, accuracy) points no other point beats: none is as fast and as accurate, and better in one.

    In order of latency. Ties (same time and accuracy) keep the first.
    """
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front, best = [], float("-inf")
    for i in order:
        if points[i][1] > best:  # more accurate than everything at least as fast
            front.append(i)
            best = points[i][1]
    return front


def _plot(results, path: Path) -> None:
    """SST-2 accuracy vs b1 latency, every model row a point; the Pareto front labelled and joined; BERT-base drawn."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    b1 = _b1(results)
    ax.set_xscale("log")
    shown = [(m, b1[m["dir"]]) for m in results["models"] if m.get("sst2") is not None and b1.get(m["dir"])]
    for m, row in shown:
        marker = "s" if row["precision"] == "int8" else "o"
        ax.scatter(row["p50_ms"], m["sst2"], s=max(20, row["params"] / 2e5), alpha=0.7, marker=marker)
    # Only the front is labelled: 30 labels between 1 and 10 ms overlap into one blot (the table names every point).
    front = [shown[i] for i in pareto_front([(row["p50_ms"], m["sst2"]) for m, row in shown])]
    ax.plot([row["p50_ms"] for _, row in front], [m["sst2"] for m, _ in front], color="black", linewidth=0.6, alpha=0.5)
    for i, (m, row) in enumerate(front):
        ax.annotate(m["label"], (row["p50_ms"], m["sst2"]), fontsize=6, xytext=(4, 3 if i % 2 else -8), textcoords="offset points")
    share = results["targets"]["peak"]["share"].get(1) or results["targets"]["peak"]["share"].get("1")
    if share:
        ax.axvline(share["p50_ms"], color="grey", linestyle="--", linewidth=0.8)
        ax.annotate(f"BERT-base shape fp32 ({share['backend']})", (share["p50_ms"], ax.get_ylim()[0]), fontsize=7, rotation=90)
    for model in ("BERT-base-uncased", "DistilBERT", "TinyBERT-4L", "MiniLM-L6"):
        pub = published_score(model, "sst2")
        if pub:
            ax.axhline(pub[0], color="lightgrey", linestyle=":", linewidth=0.8)
            ax.annotate(f"{model} (published)", (0.01, pub[0]), xycoords=("axes fraction", "data"), fontsize=6, color="grey",
                        xytext=(0, 1), textcoords="offset points")
    ax.set_xlabel("latency, batch 1, sequence 128 (ms, log scale; median of the runs)")
    ax.set_ylabel("SST-2 dev accuracy (%)")
    ax.set_title("SST-2: accuracy vs latency (squares: int8; size ~ parameters; labelled: the Pareto front)")
    ax.grid(alpha=0.3)
    save_figure(fig, path)
    plt.close(fig)


def _fmt(x, spec=".2f", none="—"):
    return none if x is None else format(x, spec)


def _verdict(met: bool, target: dict | None = None) -> str:
    if target and target.get("not_judged"):
        return f"**NOT JUDGED** ({target['not_judged']})"
    return "**MET**" if met else "**NOT MET**"


def render(results: dict[str, Any]) -> str:
    """report.md: the settings, the table, the targets, then each section the results have."""
    lines = [*_header_lines(results), *_table_lines(results), *_target_lines(results), *_int8_lines(results),
             *_retention_lines(results), *_auto_lines(results), *_profile_lines(results), *_settings_lines(results)]
    return "\n".join(lines) + "\n"


def _header_lines(results: dict[str, Any]) -> list[str]:
    """The title and the run's settings: date, hardware, versions, training and latency settings."""
    hw, pk, lat = results["hardware"], results["packages"], results["latency"]
    inputs = lat.get("real_inputs") or {}
    return [
        "# Headline benchmark: accuracy vs speed of compressed MiniLM-L6 students",
        "",
        f"- date: {results['date']}; total time {results.get('seconds', 0) / 60:.0f} min; command `{results.get('command', 'python -m bench')}`",
        f"- hardware: {hw['cpu']} ({hw['core'] + ', ' if hw.get('core') else ''}{hw['generation'] + ', ' if hw.get('generation') else ''}{hw['usable_cores']} usable cores, flags {', '.join(hw['flags'])}), no GPU; "
        f"1-minute load before timing {_fmt(lat.get('load_avg_1min'), '.2f')}",
        f"- versions: {', '.join(f'{k} {v}' for k, v in pk.items())}",
        "- reduced settings: SST-2 training is a seeded sample of 20,000 of its 67,349 sentences (max length 64); "
        "MRPC and STS-B train on their full training sets (max length 128); all dev sets complete; CoLA and RTE appear "
        "through the retention benchmark's per-task students below. "
        "Students: `compress distill`'s defaults (KD + hard labels, 3 epochs, lr 1e-4; 20,000 sentences is above the "
        "augmentation limit); the 4L-312 and the 2L-384 (12 heads of 32, as the teacher's) are cut from the teacher "
        "(`--init teacher`). For target 2, the 3L-384 is also distilled on MRPC and STS-B from their teachers "
        "(same settings, no augmentation). The 2L-384's FFN is pruned to half its neurons (Taylor importance on 2,048 "
        "training sentences), then half its heads (6 of 12 in each layer, gate-gradient importance), then half its "
        "remaining FFN neurons (384 of 768 in each layer: the 75% FFN rows); each cut is recovered by 3 epochs of "
        "distillation from the SST-2 teacher (`--recovery distill --recovery-teacher`, KD + hard labels, lr 1e-4).",
        *([f"- auto-chosen rows: `compress auto` with the teacher and SST-2 sample above, its own training defaults (1 "
           "epoch per first-round candidate, successive halving), ONNX Runtime and OpenVINO variants, within the time "
           "limit the recipe gives it; budget and choice in the compress auto section below."] if results.get("auto") else []),
        *([f"- adopted stages: {', '.join(sorted(results['adopted']))} were trained earlier with this recipe's exact "
           "settings and adopted into the run directory instead of being trained twice."] if results.get("adopted") else []),
        f"- latency: {lat['repeat_runs']} runs (every model in its own process, {lat['threads']} threads"
        + (f"; all loaded at once, taking turns: each point's passes in {lat['config']['bursts']} bursts, the real "
           f"inputs in turns of {REAL_SLICE_S:g} s" if (lat.get("config", {}).get("bursts") or 1) > 1 else
           ", one after another")
        + f"; each point timed for at least {lat.get('config', {}).get('repeats', '?')} passes and "
        f"{_fmt(lat.get('config', {}).get('min_seconds'), 'g')} s"
        + (f", but for no more than {lat['config']['max_seconds']:g} s once {MIN_PASSES} passes are in, and no pass over the "
           "real inputs started past that (the BERT-base shape's slow points)" if lat.get("config", {}).get("max_seconds") else "")
        + "); rows give the median of the runs' medians and the "
        "worst run's speed-up in brackets. Random token ids at batch 1 and 32, sequence 128; real inputs: the SST-2 "
        "dev set's "
        f"{inputs.get('n', '?')} sentences at their own lengths (mean {_fmt(inputs.get('mean_tokens'), '.1f')} tokens), "
        "batch 1 one at a time and batch 32 sorted with dynamic padding"
        + (f"; OpenVINO rows are compiled for each fixed shape: every grid point's, and the real inputs padded to a multiple "
           f"of {lat['config']['lengths_multiple']} tokens" if lat.get("config", {}).get("openvino_shapes") == "static" else "")
        + ". The speed reference is the BERT-base shape on "
        "its fastest fp32 backend of " + ", ".join(REFERENCE_BACKENDS) + " in the same run; 'vs eager' is against it in "
        "PyTorch eager. Floors: FLOPs at the measured peak of the precision each model ran in.",
        "",
    ]


def _table_lines(results: dict[str, Any]) -> list[str]:
    """The table of every model measured, the teachers' scores, the plot and the peaks."""
    lat = results["latency"]
    b1, b32 = _rows_at(lat, 1), _rows_at(lat, 32)
    real = {(r["model"], r["batch"]): r for r in lat.get("real_rows", [])}
    lines = [
        "## Measured here",
        "",
        "| model | precision | SST-2 | retention | params | MB | b1 ms | b32 ms | x floor b1 | vs BERT-base b1 | vs eager b1 "
        "| vs BERT-base b32 | real b1 sent/s | real b32 sent/s |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    base_dir = next((r["model"] for r in lat["rows"] if Path(r["model"]).name == results["base"]), None)
    entries = ([{"label": "BERT-base shape, random weights (PyTorch eager; the speed reference's model)", "dir": base_dir}]
               if base_dir else []) + results["models"]
    for m in entries:
        r1, r32 = b1.get(m["dir"]), b32.get(m["dir"])
        if not r1:
            continue
        real1, real32 = real.get((m["dir"], 1)), real.get((m["dir"], 32))
        lines.append(
            f"| {m['label']} | {r1['precision']} | {_fmt(m.get('sst2'))} | "
            f"{_fmt(m['retention'] if m.get('retention') else None, '.1%')} | {r1['params'] / 1e6:.1f}M | "
            f"{r1['size_mb']:.0f} | {r1['p50_ms']:.2f} | {_fmt((r32 or {}).get('p50_ms'), '.1f')} | {_fmt(r1.get('x_floor'), '.1f')} | "
            f"{_fmt(r1.get('speedup_vs_best_fp32'), '.1f')}x ({_fmt(r1.get('speedup_vs_best_fp32_min'), '.1f')}x) | "
            f"{_fmt(r1.get('speedup_vs_torch'), '.1f')}x | {_fmt((r32 or {}).get('speedup_vs_best_fp32'), '.1f')}x | "
            f"{_fmt((real1 or {}).get('sentences_per_s'), '.0f')} | {_fmt((real32 or {}).get('sentences_per_s'), '.0f')} |"
        )
    ts = results["teacher_scores"]
    lines += ["", "Teachers (MiniLM-L6 fine-tuned per task), dev: " + ", ".join(
        f"{get_task(k).display} {get_task(k).primary_metric} {_fmt(v)}" for k, v in ts.items()) + ".", "",
        "![SST-2 accuracy vs latency](pareto_sst2.png)", ""]
    peaks = lat.get("peaks") or {}
    if peaks:
        lines.append("Peaks measured in the same run: " + ", ".join(
            f"{p} {v['gflops']:.0f} {v.get('unit', 'GFLOP/s')} ({v.get('best')})" for p, v in peaks.items()
            if isinstance(v, dict) and v.get("gflops")) + ".")
        lines.append("")
    return lines


def _target_lines(results: dict[str, Any]) -> list[str]:
    """The five targets, met or not, with their numbers; target 5's measurement in turns."""
    t = results["targets"]
    lines = ["## Targets", ""]
    sp = t["speed"]
    if sp.get("model"):
        lines.append(f"1. {_verdict(sp['met'])} — {sp['target']}: the fastest is {sp['label']} at {sp['speedup']:.1f}x "
                     f"(worst run {sp['speedup_min']:.1f}x; reference BERT-base on {sp['reference']}; "
                     f"{_fmt(sp.get('speedup_vs_torch'), '.1f')}x against PyTorch eager) at {100 * sp['retention']:.1f}% retention.")
    else:
        lines.append(f"1. {_verdict(False)} — {sp['target']}: no compressed model kept {TARGET_RETENTION:.0%} of the teacher's SST-2 accuracy.")
    i8 = t["int8"]
    lines.append(f"2. {_verdict(i8['met'])} — {i8['target']}:")
    judged = i8.get("judged") or {}
    for name, j in judged.items():
        speed = i8["pairs"].get(name, {})
        pair_text = "; ".join(f"b{b}: {p['int8_backend']} int8 {p['speedup']:.2f}x the {p['fp32']} fp32 (worst run {p['speedup_min']:.2f}x)"
                              for b, p in sorted(speed.items(), key=lambda kv: int(kv[0])))
        lines.append(f"   - {name}: {_verdict(j['met'])}; {pair_text or 'not measured'}; drops ({j['drops_of']}) "
                     + (", ".join(f"{get_task(k).display} {v:+.2f}" for k, v in j["drops"].items()) or "not measured") + ".")
    others = [(g, p.get(1) or p.get("1")) for g, p in sorted(i8["pairs"].items()) if g not in judged]
    if any(p for _, p in others):
        lines.append("   - Other models (no MRPC and STS-B versions), int8 over their own fastest fp32 at b1: " + ", ".join(
            f"{g} {p['speedup']:.2f}x ({p['int8_backend']} vs {p['fp32']}; worst run {p['speedup_min']:.2f}x)" for g, p in others if p) + ".")
    pk_ = t["peak"]
    lines.append(f"3. {_verdict(pk_['met'], pk_)} — {pk_['target']}: " + ", ".join(
        f"b{b} {v['pct']:.0f}% ({v['backend']}, {v['p50_ms']:.1f} ms)" for b, v in sorted(pk_["share"].items(), key=lambda kv: int(kv[0])))
        + f" of {_fmt(pk_['peak_gflops'], '.0f')} GFLOP/s.")
    fl = t["floor"]
    lines.append(f"4. {_verdict(fl['met'], fl)} — {fl['target']}: "
                 + (f"{Path(fl['model']).name} ({fl['backend']}) {fl['p50_ms']:.2f} ms = {fl['x_floor']:.1f}x its floor of "
                    f"{fl['floor_ms']:.2f} ms." if fl.get("model") else "no small int8 model measured."))
    rl = t["real"]
    lines.append(f"5. {_verdict(rl['met'])} — {rl['target']}: "
                 + (f"{Path(rl['model']).name} ({rl['backend']}) {rl['sentences_per_s']:.0f} sentences/s vs the teacher's "
                    f"{rl['teacher_sentences_per_s']:.0f} ({rl['teacher_backend']}): {rl['speedup']:.2f}x, worst run "  # 9.96 is not 10.0
                    f"{rl['speedup_min']:.2f}x." if rl.get("model") else "not measured."))
    lines += _turns_lines(results)
    return lines


def _int8_lines(results: dict[str, Any]) -> list[str]:
    """Each int8 model's dev score against its fp32 parent."""
    lines = ["", "## int8 accuracy (dev, against the fp32 parent, measured by the quantize stage)", "",
             "| int8 model | task | metric | fp32 | int8 | drop |", "|---|---|---|--:|--:|--:|"]
    for name, d in results["int8"].items():
        lines.append(f"| {name} | {get_task(d['task']).display} | {d['metric']} | {d['parent']:.2f} | {d['quantized']:.2f} | {d['drop']:+.2f} |")
    return lines


def _retention_lines(results: dict[str, Any]) -> list[str]:
    """The retention benchmark's best row per task, from the files given (none: no section)."""
    lines: list[str] = []
    if results.get("retention"):
        lines += ["", "## Per-task students (the retention benchmark's best row per task; same shapes, so the same speed as above)", "",
                  "| student | task | row | dev | teacher | retention | seeds |", "|---|---|---|--:|--:|--:|--:|"]
        for r in results["retention"]:
            lines.append(f"| {r['student']} | {get_task(r['task']).display} | ({r['row']}) | {r['value']:.2f} | {r['teacher']:.2f} | "
                         f"{100 * r['retention']:.1f}% | {r['seeds']} |")
        if results.get("retention_files"):
            lines += ["", f"From {len(results['retention_files'])} retention.json files: "
                      + ", ".join(f"`{f}`" for f in results["retention_files"]) + "."]
    return lines


def _auto_lines(results: dict[str, Any]) -> list[str]:
    """What compress auto searched and chose (none: no section)."""
    lines: list[str] = []
    if results.get("auto"):
        lines += ["", "## compress auto (the most accurate model under a budget, searched and re-measured here)", "",
                  "| budget | chosen | SST-2 | search min | candidates trained | successive halving stopped |",
                  "|---|---|--:|--:|--:|---|"]
        for a in results["auto"]:
            lines.append(f"| {'; '.join(a['budgets'])} | {a['chosen']} | {_fmt(a['accuracy'], '.2f')} | {a['minutes']:.1f} | "
                         f"{a['trained']} | {a['halving_stopped']} |")
    return lines


def _profile_lines(results: dict[str, Any]) -> list[str]:
    """Where the fastest model's time goes (none profiled: no section)."""
    lines: list[str] = []
    prof = results.get("profile")
    if prof and (prof.get("ov_profile") or prof.get("torch_fp32")):
        lines += ["", f"## Profile of the fastest model at the retention bar ({prof['model']})", ""]
    if prof and prof.get("ov_profile"):  # an OpenVINO IR: the plugin's counters only
        ov = prof["ov_profile"]
        lines.append(f"- OpenVINO's per-layer counters, batch 1, seq 128, 2 threads: {ov['total_ms']:.2f} ms of layer time "
                     f"(p50 {ov['p50_ms']:.2f} ms with the counters on), {100 * ov['matmul_share']:.0f}% in matrix products; "
                     "top (layer type, kernel): " + ", ".join(f"{o['op']} {o['ms']:.2f}" for o in ov["top"][:6]) + ".")
    if prof and prof.get("torch_fp32"):
        tf = prof["torch_fp32"]
        lines.append(f"- fp32 parent ({prof['fp32_parent']}) in PyTorch eager, batch 1: {tf['total_ms']:.2f} ms of operator time, "
                     f"{100 * tf['matmul_share']:.0f}% in matrix products; top: " + ", ".join(f"{o['op']} {o['ms']:.2f}" for o in tf["top"][:5]) + ".")
        of = prof["ort_fp32"]
        lines.append(f"- the same fp32 model exported to ONNX: {of['ORT_DISABLE_ALL']['p50_ms']:.2f} ms without graph optimisation, "
                     f"{of['ORT_ENABLE_ALL']['p50_ms']:.2f} ms with all of it (fused attention, LayerNorm, GELU).")
        if "ort_int8_profile" in prof:
            op = prof["ort_int8_profile"]
            lines.append(f"- int8 in ONNX Runtime: {op['total_ms']:.2f} ms of kernel time, {100 * op['matmul_share']:.0f}% in (quantized) "
                         "matrix products; top: " + ", ".join(f"{o['op']} {o['ms']:.2f}" for o in op["top"][:6]) + ".")
    return lines


def _settings_lines(results: dict[str, Any]) -> list[str]:
    """Training examples and seconds of every stage."""
    lines = ["", "## Training cost per stage", "", "| model | training examples | seconds |", "|---|--:|--:|"]
    for name, s in results["settings"].items():
        lines.append(f"| {name} | {s['n_train'] if s['n_train'] is not None else '—'} | {_fmt(s['seconds'], '.0f')} |")
    return lines
