"""``compress auto``: the most accurate model that fits a budget, found and measured on this machine.

``auto(teacher, out, cfg)`` answers "give me the best model for my task that runs in X ms
(or fits in Y MB) here" in four steps, every number measured in this run:

1. **Probe.** Random-weight students of a spread of shapes (depth x width) are built from
   the teacher, turned into every variant the chosen backends offer (torch fp32 and
   dynamic int8, ONNX Runtime int8, OpenVINO fp32, bf16 where the CPU has bf16 kernels, and
   NNCF int8, INC int8, CTranslate2 float32 and int8 where its converter takes the family) and timed at
   the budgets' (batch, seq) points, each model in its own process, beside the teacher
   (the reference of ``speedup`` budgets; timed before and after the others, its faster time
   kept). A non-negative linear latency model per variant
   and point (:mod:`compress.auto.search`) is fitted on them; its error on held-out probe shapes
   is reported. It only ranks shapes: the final answer is measured.
2. **Shortlist.** Shapes predicted to fit every budget on some variant (within
   ``--margin``) are ranked by an accuracy prior: cut from the teacher's weights first (any
   shape no wider than the teacher), then by parameters.
3. **Successive halving.** The ``--candidates`` best are distilled for ``--epochs``; those in the
   best 1/eta continue from where they stopped for eta times as long, and so on (``--rounds``),
   with the distillation recipe of ``compress distill`` (``--losses``, ``--augment``, ...). It runs
   as an Optuna study (:mod:`compress.auto.engine`: one trial per candidate, its pruner's
   asynchronous successive halving), so ``--workers`` local processes and other machines
   (``--storage``) train candidates side by side. ``--time-limit`` stops it early, keeping 15% of it
   for step 4: a candidate's next round starts only when it still ends before that (priced by its
   seconds per epoch so far, a new shape by its parameters at the others' rate, a candidate an
   earlier search trained alike at nothing). The candidates that reached the deepest round (and a
   runner-up when only one did), best first and no more than synchronous halving keeps, are the finalists.
4. **Quantize and measure.** The finalists become every variant predicted to fit (int8
   with its dev score), then all of them and the teacher are timed in one run, repeated
   ``--final-runs`` times; the most accurate one that meets every budget in every run is
   copied to ``out``. When no finalist does, the other trained candidates are timed in a
   second run (a faster shape that fits beats nothing). Nothing fitting is an error
   naming the fastest model measured.

The work directory (``.OUT.work``) keeps every probe, trained candidate and variant:
``--resume`` after a crash never trains a finished candidate again; ``--reuse`` lends
earlier searches of other budgets (their probe, their candidates trained alike) to this one,
and their models trained further that fit this budget and beat its finalists join them. The report
(``OUT/search/report.md``, ``search.json``, ``pareto.png``) lists every candidate with
its predicted and measured latency, accuracy and time spent.

With ``--embedding`` the teacher is a sentence-embedding model and the same four steps search its students
(:mod:`compress.auto.embedding`): distilled on unlabelled sentences (``--corpus``, ``--sentences-from``) by
``distill-embedding``, a static (model2vec) student beside them, and every model scored by the embedding check (STS-B
Spearman of cosine, or the mean cosine to the teacher's embeddings on held-out sentences) instead of a dev set. Which of
the two a search is, is decided once: its target (:mod:`compress.auto.targets`) answers for it.

This module holds the stage's entry, :func:`auto`, as one sequence of steps; the steps are in :mod:`compress.auto.probe`
(1, 2), :mod:`compress.auto.halving` (3) and :mod:`compress.auto.finalists` (4), the options in
:mod:`compress.auto.config`, the state and the records they pass on in :mod:`compress.auto.state`.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from compress.auto.config import AutoConfig, parse_minutes
from compress.auto.engine import Place, finish, join, joinable, study_place
from compress.auto.finalists import compared, final_run, make_finalists, measured, second_run
from compress.auto.halving import Trainer, earlier_finalists, halve, spec, static_candidate
from compress.auto.probe import measured_latency, probe_latency, shortlist
from compress.auto.report import ReportData, report_data, write_report
from compress.auto.search import Budget, choose, fastest, parse_budgets, points
from compress.auto.state import Earlier, Probe, SearchRun, SearchState, Timer
from compress.auto.targets import Target, target_kind
from compress.core.checkpoints import work_dir_for
from compress.core.errors import CompressError
from compress.core.formats.artifacts import load_config, require_torch_weights
from compress.core.formats.records import dir_hash
from compress.core.preflight import check_output
from compress.teacher.presets import resolve_model

log = logging.getLogger(__name__)

RESERVE = 0.15  # the share of --time-limit kept for quantizing the finalists and the final measurement


def auto(teacher: str | Path, out: str | Path, cfg: AutoConfig, *, overwrite: bool = False, timer: Timer | None = None) -> Path:
    """Find, train and measure the most accurate student of ``teacher`` on its task that meets ``cfg.budget``.

    The task is what ``cfg.task`` names (a preset, or a kind with ``--train-file``), else the teacher's own; with
    ``cfg.embedding`` there is none: the teacher is a sentence-embedding model and its students are scored by the
    embedding check (:mod:`compress.auto.embedding`). A linear sequence of steps: open the search, probe and shortlist
    the shapes, train them by successive halving, measure the finalists and write the chosen one.
    """
    cfg.validate()
    started = time.monotonic()
    deadline = started + parse_minutes(cfg.time_limit) * 60
    # With --storage the --out is shared: the same command elsewhere joins the search under way, unlocked.
    out = check_output(Path(out), overwrite, inputs=(teacher, cfg), resume=cfg.resume, shared=bool(cfg.storage))
    teacher_dir = require_torch_weights(resolve_model(teacher), "compress auto (the teacher)")
    target = target_kind(cfg).resolve(teacher_dir, cfg)
    budgets = parse_budgets(cfg.budget)
    at = sorted(points(budgets) or {(1, 128)})
    keys = _keys(teacher_dir, target, budgets, at)
    place = study_place(cfg.storage, work_dir_for(out), keys[0])
    if cfg.storage and not cfg.resume and joinable(place):  # a search under way: this process only trains
        return _join(teacher_dir, cfg, out, place, keys[2])
    shapes = target.shapes(load_config(teacher_dir), cfg.shapes)
    search, earlier = _open_search(out, keys, cfg)
    # an --embedding search's sentences split once into held-out and training ones, the teacher's score
    run = SearchRun(teacher_dir=teacher_dir, target=target.prepared(teacher_dir, search.work), search=search,
                    budgets=budgets, at=at, timer=timer or measured_latency)
    kept = search.state["probe"]  # a resumed search's own, as state.json holds it
    probe = Probe.from_dict(kept) if kept else earlier.probe or probe_latency(run, shapes)
    search.state["probe"] = probe.to_dict()
    search.save()
    predicted, shortlisted = shortlist(run, probe, shapes)
    static = static_candidate(run)
    halving, finalists = halve(run, shortlisted, earlier, training_deadline=deadline - RESERVE * (deadline - started),
                               place=place, out=out)
    finalists += earlier_finalists(earlier, finalists, predicted, search) + static
    artifacts = make_finalists(run, finalists, predicted)
    given = [Path(c) for c in cfg.compare]
    rows = final_run(run, [*[Path(a["dir"]) for a in artifacts], *given])
    results = measured(run, rows, artifacts)
    chosen = choose(results, budgets, cfg.tie)
    if chosen is None:  # a faster candidate that fits beats nothing
        results += second_run(run, finalists, predicted)
        chosen = choose(results, budgets, cfg.tie)
    report = report_data(ReportData(run=run, probe=probe, predicted=predicted, halving=halving, results=results,
                                    chosen=chosen, started=started))
    report["compared"] = compared(run, rows, [teacher_dir, *given])
    finish(place)  # a later run with this --storage starts anew rather than joining
    if chosen is None:
        _refuse_nothing_fits(out, report, results, budgets, at)
    return _write_chosen(Path(chosen["dir"]), out, report, overwrite)


def _keys(teacher_dir: Path, target: Target, budgets: tuple[Budget, ...], at: list[tuple[int, int]]) -> tuple[str, str, str]:
    """The search's key (its study's name derives from it), and the keys of what its probe and its trainings depend on."""
    cfg = target.cfg
    common = [str(teacher_dir.resolve()), target.key_name]
    key = json.dumps(common + [[b.text for b in budgets], list(cfg.backends)])
    # What a probe and a trained candidate depend on: another budget with the same keys can reuse them.
    probe_key = json.dumps(common + [list(cfg.backends), at, list(cfg.shapes), cfg.probes, cfg.repeats])
    train_key = json.dumps(common + [list(cfg.losses), asdict(cfg.extra_data), asdict(cfg.data), asdict(cfg.train)]
                           + ([dir_hash(Path(cfg.init_from))] if cfg.init_from else [])
                           + target.training_key(), default=str)
    return key, probe_key, train_key


def _open_search(out: Path, keys: tuple[str, str, str], cfg: AutoConfig) -> tuple[SearchState, Earlier]:
    """The search's state in the output's work folder (new, or resumed) and what ``--reuse`` lends it."""
    return SearchState.open(work_dir_for(out), cfg.resume, *keys), Earlier.read(cfg.reuse, *keys[1:])


def _join(teacher_dir: Path, cfg: AutoConfig, out: Path, place: Place, train_key: str) -> Path:
    """Train candidates of a search another ``compress auto`` coordinates (same --out and --storage) until its queue
    is done; the coordinator measures and writes ``out``."""
    plan = joinable(place)
    work = work_dir_for(out)
    target = target_kind(cfg).joined(teacher_dir, cfg, work)
    trainer = Trainer.of(teacher_dir, target, work, plan["shapes"], plan["reused"])
    ran = join(place, train_key, trainer, spec(teacher_dir, out, cfg), cfg.workers)
    log.info("trained %d candidate(s) of the search in %s; its coordinator writes %s", ran, place.url, out)
    return out


def _refuse_nothing_fits(out: Path, report: dict, results: list[dict], budgets, at) -> None:
    """Write the search's report beside the output and stop: no model measured meets the budget."""
    quickest = fastest(results, at[0])
    write_report(work_dir_for(out) / "search", report)
    raise CompressError(
        f"nothing measured meets {'; '.join(b.text for b in budgets)}: the fastest was {quickest['name']} at "
        f"{quickest['measurement']['points'][at[0]]['p50_ms']:.2f} ms (p50, batch {at[0][0]}, seq {at[0][1]}); "
        f"the search's report is in {work_dir_for(out) / 'search'}")


def _write_chosen(source: Path, out: Path, report: dict, overwrite: bool) -> Path:
    """Copy the chosen folder to ``out`` (staged beside it, then renamed into place) with the search's report."""
    staged = out.parent / f".{out.name}.auto-tmp"
    if staged.exists():
        shutil.rmtree(staged)
    shutil.copytree(source, staged)
    write_report(staged / "search", report)
    if out.exists():
        if not overwrite and any(out.iterdir()):
            raise CompressError(f"output directory {out} is not empty; pass --overwrite to replace it or choose another --out")
        shutil.rmtree(out)
    staged.rename(out)
    log.info("chose %s", report["chosen"]["name"])
    return out


def summarize(out: Path, cfg: AutoConfig, inputs: dict[str, Any]) -> tuple[str, list[str]]:
    """What ``compress auto`` prints: the report's table (a process that joined a search: where its coordinator writes)."""
    if not (out / "search" / "report.md").is_file() and cfg.storage:
        return f"worked on the search in {cfg.storage} until its queue was done; its coordinator writes {out}", []
    text = (out / "search" / "report.md").read_text(encoding="utf-8")
    return text, []
