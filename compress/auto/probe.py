"""``compress auto``'s step 1 and 2: the latency probe, the models fitted on it, each shape's prediction, the shortlist.

Random-weight students of spread-out shapes are made into every variant the chosen backends offer
(:func:`make_variant`, also used for the finalists) and timed beside the teacher (:func:`probe_latency`); a latency model
(:mod:`compress.auto.search`) and a size model (:func:`size_model`) fitted on them predict every shape
(:func:`predict`), and the shapes predicted to fit are ranked by an accuracy prior (:func:`shortlist`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from pathlib import Path

import numpy as np

from compress.auto.search import Budget, fit_latency_model, held_out_error
from compress.auto.state import Probe, ProbeSample, SearchRun
from compress.auto.targets import Target
from compress.auto.variants import Variant, export_config, usable
from compress.core.errors import CompressError
from compress.core.formats.artifacts import load_config, load_tokenizer, save_model_dir
from compress.core.formats.records import compression_record, utc_now
from compress.core.formats.runtime import load_model
from compress.core.model.shapes import Shape
from compress.eval.latency.config import LatencyConfig
from compress.eval.latency.row import Row
from compress.eval.latency.rows import size_on_disk
from compress.eval.latency.runs import measure_latency
from compress.export import export
from compress.quantize.run import quantize
from compress.students.init import init_student
from compress.students.slices import fits_inside

log = logging.getLogger(__name__)

# The probe is timed in this many runs (every model in turn, then again) and each sample keeps its fastest: one slow
# spell can only slow a model down, and a single slowed sample bends the fitted latency model for a whole family of
# shapes (one probe timed 6L-384 as OpenVINO int8 at 8.71 ms against 3.80 for the larger 6L-384-768, and the model then
# predicted the 3L-384's OpenVINO int8 - 2.1 ms when measured - to miss a 3.2 ms budget).
PROBE_RUNS = 2
# Models timed in turns of short bursts (compress latency --bursts), so that a slow spell of the machine hits every
# one alike; only up to BURST_MODELS at a time, as every one of them stays loaded (the probe's dozens run one by one).
BURSTS, BURST_MODELS = 5, 16


def measured_latency(dirs: list[Path], at: list[tuple[int, int]], repeats: int, runs: int = 1) -> list[Row]:
    """The default timer: ``compress latency`` (each model in its own process), every (batch, seq) of ``at``, the
    whole run repeated ``runs`` times; a few models take turns in bursts, many are timed one after another."""
    batches, seqs = sorted({b for b, _ in at}), sorted({s for _, s in at})
    bursts = min(BURSTS, repeats) if len(dirs) <= BURST_MODELS else 1
    cfg = LatencyConfig(batch=tuple(batches), seq=tuple(seqs), repeats=repeats, warmup=3, peak=False, record=False,
                        repeat_runs=runs, bursts=bursts)
    return measure_latency(dirs, cfg)["rows"]


def variants(run: SearchRun) -> list[Variant]:
    """The variants the search makes of every shape: its backends' (for a task model or an embedding folder) that
    this CPU runs as what they are and the teacher's candidates can be made into."""
    return usable(run.cfg.variant_table, run.cfg.backends, run.teacher_dir)


def probe_shapes(shapes: list[Shape], n: int) -> tuple[list[Shape], list[Shape]]:
    """``n`` shapes spread over the list (by parameters) to fit on, and up to 3 others held out to test the fit."""
    ordered = sorted(shapes, key=lambda s: (s.layers * s.hidden * (4 * s.hidden + 2 * s.ffn), s.label))
    if len(ordered) <= n:
        return ordered, []
    step = (len(ordered) - 1) / (n - 1) if n > 1 else 0
    fit_idx = sorted({round(i * step) for i in range(n)})
    rest = [s for i, s in enumerate(ordered) if i not in fit_idx]
    held = [rest[round(i * (len(rest) - 1) / 2)] for i in range(min(3, len(rest)))] if rest else []
    return [ordered[i] for i in fit_idx], list(dict.fromkeys(held))


def make_variant(source: Path, dest: Path, how, target: Target, max_eval: int | None) -> Path:
    """``source`` (an fp32 student folder) as one backend variant in ``dest`` (made once; reused on resume);
    ``max_eval``: a probe's folder, checked on that few examples (None: a finalist)."""
    if how is None:
        return source
    if (dest / "compression.json").is_file():
        return dest
    kind, backend, scheme = how
    if kind == "export":  # scheme: the precision or quantization asked of the runtime (None: fp32)
        return export(source, dest, export_config(backend, scheme), overwrite=True)
    return quantize(source, dest, target.quantize_config(backend, scheme, max_eval), overwrite=True)


def probe_latency(run: SearchRun, shapes: list[Shape]) -> Probe:
    """Time random-weight students of spread-out shapes as every variant; the samples the latency model is fitted on."""
    cfg, teacher_dir, work = run.cfg, run.teacher_dir, run.search.work
    fit, held = probe_shapes(shapes, cfg.probes)
    teacher = load_model(teacher_dir, head=run.target.head)
    tokenizer = load_tokenizer(teacher_dir)
    dirs, meta = [], []
    for shape in fit + held:
        source = work / "probe" / shape.label / "fp32"
        if not (source / "config.json").is_file():
            model, info = init_student(teacher, shape, method="random", seed=0)
            save_model_dir(model, source, tokenizer=tokenizer, overwrite=True,
                           record=compression_record(stage="auto-probe", method="random", parent=teacher_dir, extra={"init": info}))
        for name, how in variants(run):
            path = make_variant(source, work / "probe" / shape.label / name, how, run.target, max_eval=8)
            dirs.append(path)
            meta.append((name, dataclasses.replace(shape, origin=""), shape in held))
    rows = run.timer([teacher_dir, *dirs], run.at, cfg.repeats, PROBE_RUNS)
    # The teacher sets every speedup budget, and the probe's dozens of models are timed one after another: it is
    # timed again after them and its faster time kept, so one slow spell cannot loosen every budget at once (one
    # did on a 2-core machine: 40.3 ms, against 27.1 in the next probe).
    again = {r.point: r.p50_ms for r in run.timer([teacher_dir], run.at, cfg.repeats, 1)}
    by_dir: dict[str, list[Row]] = {}
    for row in rows:
        by_dir.setdefault(row.model, []).append(row)
    samples = [ProbeSample(variant, shape, held_out, row.batch, row.seq, _fastest_run(row), size_on_disk(path), row.params)
               for path, (variant, shape, held_out) in zip(dirs, meta) for row in by_dir[str(path)]]
    timings = {f"{r.batch},{r.seq}": [_fastest_run(r), again[r.point]] for r in by_dir[str(teacher_dir)]}
    return Probe(samples=tuple([s for s in samples if not s.held_out] + [s for s in samples if s.held_out]),
                 error=_held_out_error(samples), teacher={point: min(ms) for point, ms in timings.items()},
                 teacher_timings=timings, teacher_size_bytes=size_on_disk(teacher_dir), rows=tuple(rows), when=utc_now())


def _held_out_error(samples: list[ProbeSample]) -> dict | None:
    """The latency model's error on the probe's held-out shapes (None when none was held out)."""
    if not any(s.held_out for s in samples):
        return None
    as_samples = [s.sample for s in samples]
    held_flags = {id(x): s.held_out for x, s in zip(as_samples, samples)}
    error = held_out_error(as_samples, lambda x: held_flags[id(x)])
    return {"median": error["median"], "worst": error["worst"],
            "errors": [{"variant": e["sample"].backend, "shape": e["sample"].shape.label, "batch": e["sample"].batch,
                        "seq": e["sample"].seq, "measured_ms": e["sample"].ms, "predicted_ms": e["predicted_ms"],
                        "percent": e["percent"]} for e in error["errors"]]}


def _fastest_run(row: Row) -> float:
    """A timed row's p50 in its fastest run."""
    return min(row.runs_p50_ms or (row.p50_ms,))


# ---------------------------------------------------------------------------- prediction and the shortlist


def size_model(probe: Probe) -> dict[str, tuple[float, float]]:
    """Per variant: bytes = a * encoder parameters + b, fitted on the probe folders (least squares on two or more)."""
    fits = {}
    for variant in {s.variant for s in probe.samples}:
        pts = {(s.shape, s.size_bytes) for s in probe.samples if s.variant == variant}
        x = np.array([encoder_params(shape) for shape, _ in pts], dtype=float)
        y = np.array([v for _, v in pts], dtype=float)
        if len(x) >= 2 and np.ptp(x) > 0:
            a, b = np.polyfit(x, y, 1)
        else:
            a, b = 0.0, float(y.mean())
        fits[variant] = (float(a), float(b))
    return fits


def encoder_params(shape: Shape) -> int:
    return shape.layers * (4 * shape.hidden * shape.hidden + 2 * shape.hidden * shape.ffn)


def predict(model, sizes: dict, shape: Shape, probe: Probe, budgets: tuple[Budget, ...], margin: float) -> dict:
    """Predicted measurement of ``shape`` per variant (``sizes``: :func:`size_model`), and the variants predicted
    to meet every budget (within margin)."""
    out = {"measurements": {}, "variants": []}
    for variant in sorted({s.variant for s in probe.samples}):
        pts = {}
        for key, teacher_ms in probe.teacher.items():
            b, s = map(int, key.split(","))
            ms = model.predict(variant, b, s, shape)
            pts[(b, s)] = {k: ms for k in ("p50_ms", "p90_ms", "p99_ms", "mean_ms")}
            pts[(b, s)].update(throughput=b / ms * 1e3, speedup=teacher_ms / ms)
        a, c = sizes[variant]
        m = {"size_bytes": a * encoder_params(shape) + c, "points": pts}
        out["measurements"][variant] = m
        if all(_met_with_margin(budget, m, margin) for budget in budgets):
            out["variants"].append(variant)
    return out


def _met_with_margin(budget: Budget, m: dict, margin: float) -> bool:
    value = budget.value(m)
    upper = budget.kind in ("latency", "size")  # a ceiling; throughput and speed-up are floors
    return value <= budget.limit * (1 + margin) if upper else value >= budget.limit / (1 + margin)


def shortlist(run: SearchRun, probe: Probe, shapes: list[Shape]) -> tuple[dict[str, dict], list[Shape]]:
    """Each shape's prediction by the latency model fitted on the probe, and the most promising shapes predicted to fit."""
    budgets, cfg = run.budgets, run.cfg
    # The held-out shapes measured the model's error (probe.error); the ranking then uses every probe.
    model = fit_latency_model([s.sample for s in probe.samples])
    sizes = size_model(probe)
    predicted = {shape.label: predict(model, sizes, shape, probe, budgets, cfg.margin) for shape in shapes}
    fitting = [s for s in shapes if predicted[s.label]["variants"]]
    if not fitting:
        best = min(probe.rows, key=lambda r: r.p50_ms if r.point == run.at[0] else math.inf)
        raise CompressError(
            f"no student shape is predicted to meet {'; '.join(b.text for b in budgets)}: the fastest model probed was "
            f"{best.name} at {best.p50_ms:.2f} ms (p50, batch {best.batch}, seq {best.seq}); relax the budget "
            "or add a faster backend (--backends)")
    chosen = rank_by_prior(fitting, load_config(run.teacher_dir))[: cfg.candidates]
    log.info("%d of %d shapes predicted to fit; training %s", len(fitting), len(shapes), ", ".join(s.label for s in chosen))
    return predicted, chosen


def rank_by_prior(shapes: list[Shape], teacher_config) -> list[Shape]:
    """The accuracy prior: shapes cut from the teacher's weights (no wider than it) first, then more parameters first,
    then deeper first (at equal parameters, deep-and-thin students distil better: MobileBERT, MiniLM)."""
    def params(s: Shape) -> int:
        return s.layers * (4 * s.hidden * s.hidden + 2 * s.hidden * s.ffn)

    return sorted(shapes, key=lambda s: (not fits_inside(teacher_config, s), -params(s), -s.layers, s.label))
