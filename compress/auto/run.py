"""``compress auto``: the most accurate model that fits a budget, found and measured on this machine.

``auto(teacher, out, cfg)`` answers "give me the best model for my task that runs in X ms
(or fits in Y MB) here" in four steps, every number measured in this run:

1. **Probe.** Random-weight students of a spread of shapes (depth x width) are built from
   the teacher, turned into every variant the chosen backends offer (torch fp32 and
   dynamic int8, ONNX Runtime int8, OpenVINO fp32, bf16 where the CPU has bf16 kernels, and
   NNCF int8, INC int8) and timed at
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
Spearman of cosine, or the mean cosine to the teacher's embeddings on held-out sentences) instead of a dev set.
"""

from __future__ import annotations

import json
import logging
import math
import re
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from compress.auto import embedding as auto_embedding
from compress.distill.augment import AugmentConfig
from compress.auto.embedding import STATIC_LABEL, STATIC_VARIANT, EmbeddingSearch, EmbeddingTarget
from compress.auto.engine import Place, Plan, TrainerSpec, check_url, finish, join, joinable, run_halving, study_place
from compress.auto.report import report_data, write_report
from compress.core.formats.artifacts import (
    check_output,
    compression_record,
    dir_hash,
    load_config,
    load_tokenizer,
    read_metrics,
    require_model_dir,
    require_torch_weights,
    save_model_dir,
    utc_now,
    write_json_atomic,
)
from compress.core.config import flat_keywords, from_dict, option, to_dict
from compress.core.data.sources import TaskData, load_dev_splits
from compress.core.errors import CompressError
from compress.core.formats.runtime import load_model, openvino_bf16
from compress.core.model.shapes import Shape
from compress.core.model.structure import config_sizes
from compress.core.data.resolve import resolve_task, task_of_model
from compress.core.formats.sentence import is_sentence_folder
from compress.core.data.tasks import Task, get_task, is_kind, task_choices
from compress.core.train import TrainConfig, work_dir_for
from compress.distill.task import DistillConfig, distill
from compress.eval.evaluate import dev_evaluator
from compress.eval.latency.runs import LatencyConfig, measure_latency, size_on_disk
from compress.export import ExportConfig, export
from compress.quantize.run import QuantizeConfig, quantize
from compress.auto.search import Budget, Sample, budget_option, choose, fastest, fit_latency_model, held_out_error, measurement
from compress.auto.search import parse_budgets, points, round_seconds
from compress.students.init import init_student
from compress.students.slices import fits_inside
from compress.core.model.shapes import resolve_shape
from compress.teacher.presets import resolve_model

log = logging.getLogger(__name__)

# What each backend contributes: (variant name, how it is made from an fp32 student folder).
VARIANTS = {
    "torch": (("torch-fp32", None), ("torch-int8", ("quantize", "torch", "dynamic"))),
    "onnxruntime": (("onnxruntime-int8", ("quantize", "onnxruntime", "dynamic")),),
    "openvino": (("openvino-fp32", ("export", "openvino", None)), ("openvino-bf16", ("export", "openvino", "bf16")),
                 ("openvino-int8", ("quantize", "openvino", "static"))),
    "inc": (("inc-int8", ("quantize", "inc", "static")),),
}
# Variants that only a CPU with bf16 kernels (AVX512_BF16, AMX-BF16) runs as such: elsewhere they would be their fp32.
BF16_VARIANTS = ("openvino-bf16",)
# What a search stands on: a task (scored on its dev set), or an --embedding search's sentences and embedding check.
Target = Task | EmbeddingTarget
TASK_LOSSES = ("kd", "hard")  # the candidates' distillation terms unless --losses says otherwise
RESERVE = 0.15  # the share of --time-limit kept for quantizing the finalists and the final measurement


def parse_minutes(text: str) -> float:
    """``90m``, ``1.5h``, ``45`` (minutes), ``600s`` -> minutes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(h|m|min|s)?\s*", str(text).lower())
    if not m or float(m.group(1)) <= 0:
        raise CompressError(f"--time-limit {text!r} is not a duration; write e.g. 90m, 1.5h or 600s")
    return float(m.group(1)) * {"h": 60.0, "s": 1 / 60, None: 1.0}.get(m.group(2), 1.0)


def _auto_defaults() -> TrainConfig:
    return TrainConfig(lr=1e-4, epochs=1, batch_size=32, warmup_ratio=0.1)


@flat_keywords
@dataclass(frozen=True)
class AutoConfig:
    task: str = option("", "task to find a model for: a benchmark task, or a kind of your own data with --train-file "
                       "(default: the teacher's own task, from its compression.json or config.json)", choices=task_choices)
    budget: str = option("", "what the model must meet, all of them, separated by ';': p50<=6ms@b1,s128 (also p90, p99, "
                         "mean), throughput>=500/s@b32,s128, size<=20MB, speedup>=10x (over the teacher, measured here)",
                         metavar="BUDGET[;...]")
    backends: tuple[str, ...] = option(("torch", "onnxruntime", "openvino"), "backends to consider: torch (fp32, dynamic int8), "
                                       "onnxruntime (int8), openvino (fp32, bf16 on a CPU with AVX512_BF16 or AMX-BF16, NNCF int8), "
                                       "inc (static int8)", metavar="NAME[,...]")
    time_limit: str = option("90m", "wall-clock limit of the whole search (90m, 1.5h); 15% of it is kept for the last step")
    shapes: tuple[str, ...] = option((), "candidate student shapes (default: depths 1-6 x widths down to a third of the teacher's x "
                                     "the teacher's FFN ratio or half of it; with --embedding: the teacher's width at depths "
                                     "1-6 x its FFN, half and a quarter of it)",
                                     metavar="SHAPE[,...]")
    probes: int = option(8, "shapes timed to fit the latency model (spread over the candidates), plus 3 held out to test it")
    candidates: int = option(6, "shapes trained in the first round: the best by the prior among those predicted to fit")
    rounds: int = option(3, "successive-halving rounds; each keeps the best 1/eta and trains them eta times as long")
    eta: int = option(2, "successive halving's ratio")
    margin: float = option(0.15, "keep shapes predicted at most this fraction beyond a budget (measurement decides at the end)")
    repeats: int = option(20, "timed passes per model and point in the probe (the final measurement takes twice as many)")
    final_runs: int = option(3, "the final measurement repeats the whole run (every finalist in turn) this many times; a "
                             "budget is met only if met in every run, so a model that fits by luck once is not chosen",
                             metavar="K")
    losses: tuple[str, ...] = option(TASK_LOSSES, "distillation terms of every candidate (see compress distill; with "
                                     "--embedding those of compress distill-embedding, mse,cosine unless given)",
                                     metavar="TERM[,...]")
    init_from: str | None = option(None, "cut the candidates that fit inside it from this encoder DIR instead of the teacher "
                                   "(see compress distill --init-from)", metavar="DIR")
    tie: float = option(0.4, "dev points within which finalists count as equally accurate; among them the one with the most "
                        "room under the timed budgets is chosen, as one that fits by a hair may miss in the next run "
                        "(0: the most accurate)")
    max_drop: float | None = option(1.0, "refuse an int8 variant that loses more than this many dev points (with "
                                    "--embedding: points of the embedding score)")
    resume: bool = option(False, "continue an interrupted search: finished probes and candidates are reused")
    compare: tuple[str, ...] = option((), "model folders to measure in the final run beside the finalists and show in the "
                                      "report (e.g. hand-made students; their dev score is read from their metrics.json); "
                                      "never chosen", metavar="DIR[,...]")
    reuse: tuple[str, ...] = option((), "earlier searches of this teacher and task (their --out folders): their latency probe "
                                    "(same backends, points, probes, shapes) and trained candidates (same training settings) "
                                    "are reused, so searching another budget pays only for what is new", metavar="DIR[,...]")
    workers: int = option(1, "local worker processes training candidates (this one included); each trains one candidate "
                          "at a time, so give each its own cores or GPU")
    storage: str | None = option(None, "database of the search's Optuna study (any SQLAlchemy URL, e.g. "
                                 "postgresql://user:pass@host/db; default: search.db in the work folder). Run the same "
                                 "command with the same --out and --storage on another machine to join a search under way "
                                 "as a worker: candidates' folders live under the coordinator's --out, so every machine "
                                 "needs it on a shared file system", metavar="URL")
    extra_data: AugmentConfig = field(default_factory=AugmentConfig)
    data: TaskData = field(default_factory=TaskData)
    sentences: EmbeddingSearch = field(default_factory=EmbeddingSearch)
    train: TrainConfig = field(default_factory=_auto_defaults)

    @property
    def embedding(self) -> bool:
        """A search of sentence-embedding students (``--embedding``), not of a task model."""
        return self.sentences.embedding

    def validate(self) -> None:
        if self.task and not is_kind(self.task):
            get_task(self.task)
        budget_option(self.budget)
        if self.embedding:  # a task search's options first: "drop --task" says more than "pass --corpus"
            self._check_embedding()
        self.sentences.validate()
        for name in self.backends:
            if name not in _variant_table(self):
                raise CompressError(f"unknown backend {name!r} in --backends; valid: {', '.join(_variant_table(self))}")
        parse_minutes(self.time_limit)
        for name, value in (("probes", self.probes), ("candidates", self.candidates), ("rounds", self.rounds),
                            ("repeats", self.repeats), ("final-runs", self.final_runs)):
            if value < 1:
                raise CompressError(f"--{name} must be at least 1, got {value}")
        if self.workers < 1:
            raise CompressError(f"--workers must be at least 1 (this process), got {self.workers}")
        if self.storage is not None:
            check_url(self.storage)
        if self.eta < 2:
            raise CompressError(f"--eta must be at least 2, got {self.eta}")
        if self.margin < 0:
            raise CompressError(f"--margin must be 0 or more, got {self.margin}")
        if self.tie < 0:
            raise CompressError(f"--tie must be 0 (the most accurate alone) or more dev points, got {self.tie}")
        if self.init_from and not (Path(self.init_from) / "config.json").is_file():  # said now, not after the probe
            raise CompressError(f"--init-from {self.init_from} is not a model directory (no config.json); pass an encoder folder")
        for folder in self.compare:
            require_model_dir(folder)  # before hours of search, not at its end
        for folder in self.reuse:
            if not (work_dir_for(Path(folder)) / "state.json").is_file():
                raise CompressError(f"--reuse {folder}: no search was found there (its work folder "
                                    f"{work_dir_for(Path(folder))} holds no state.json); give the --out folder of an earlier search")

    def _check_embedding(self) -> None:
        """Refuse, one line each, the options of a task search given to an --embedding one."""
        if self.task:
            raise CompressError(f"--embedding searches sentence-embedding students, which have no task: drop --task {self.task} "
                                "(or drop --embedding to search students of the task)")
        if self.data.train_file or self.data.dev_file:
            raise CompressError("--train-file/--dev-file are a task's data; an --embedding search distils on unlabelled "
                                "sentences: pass them as --corpus FILE_OR_DIR[,...]")
        if self.init_from:
            raise CompressError("--init-from cuts task students from another encoder; an --embedding search cuts its "
                                "students from the teacher: drop --init-from")
        if self.extra_data != AugmentConfig():
            raise CompressError("--augment and --transfer-text enlarge a task's training set; an --embedding search "
                                "distils on --corpus/--sentences-from: drop them")
        if "inc" in self.backends:
            raise CompressError("--backends inc cannot calibrate a sentence-embedding folder; with --embedding choose among "
                                f"{', '.join(auto_embedding.VARIANTS)}")
        auto_embedding.embedding_losses(self.losses, TASK_LOSSES)


# A timer: (model dirs, (batch, seq) points, repeats, runs) -> rows as `compress latency` makes them
# (model, batch, seq, p50_ms, ..., throughput, speedup against the first model; with runs > 1
# also runs_p50_ms, slowest_run and speedup_min).
Timer = Callable[[list[Path], list[tuple[int, int]], int, int], list[dict]]


# The probe is timed in this many runs (every model in turn, then again) and each sample keeps its fastest: one slow
# spell can only slow a model down, and a single slowed sample bends the fitted latency model for a whole family of
# shapes (one probe timed 6L-384 as OpenVINO int8 at 8.71 ms against 3.80 for the larger 6L-384-768, and the model then
# predicted the 3L-384's OpenVINO int8 - 2.1 ms when measured - to miss a 3.2 ms budget).
PROBE_RUNS = 2
# Models timed in turns of short bursts (compress latency --bursts), so that a slow spell of the machine hits every
# one alike; only up to BURST_MODELS at a time, as every one of them stays loaded (the probe's dozens run one by one).
BURSTS, BURST_MODELS = 5, 16


def measured_latency(dirs: list[Path], at: list[tuple[int, int]], repeats: int, runs: int = 1) -> list[dict]:
    """The default timer: ``compress latency`` (each model in its own process), every (batch, seq) of ``at``, the
    whole run repeated ``runs`` times; a few models take turns in bursts, many are timed one after another."""
    batches, seqs = sorted({b for b, _ in at}), sorted({s for _, s in at})
    bursts = min(BURSTS, repeats) if len(dirs) <= BURST_MODELS else 1
    cfg = LatencyConfig(batch=tuple(batches), seq=tuple(seqs), repeats=repeats, warmup=3, peak=False, record=False,
                        repeat_runs=runs, bursts=bursts)
    return measure_latency(dirs, cfg)["rows"]


@dataclass
class _Search:
    """Everything the search has done so far; ``state.json`` in the work directory."""

    work: Path
    state: dict = field(default_factory=dict)

    @classmethod
    def open(cls, work: Path, resume: bool, key: str, probe_key: str, train_key: str) -> "_Search":
        file = work / "state.json"
        if resume and file.is_file():
            state = json.loads(file.read_text())
            if state.get("key") != key:
                raise CompressError(f"{work} holds a search for another teacher, task or budget; drop --resume or pick another --out")
            return cls(work, state)
        if work.exists():
            shutil.rmtree(work)
        work.mkdir(parents=True)
        return cls(work, {"key": key, "probe_key": probe_key, "train_key": train_key, "probe": None, "trained": {},
                          "finalists": None})

    def save(self) -> None:
        write_json_atomic(self.work / "state.json", self.state)


@dataclass(frozen=True)
class _Earlier:
    """What earlier searches (``--reuse``) can give this one: a probe and trained candidates by (label, round, epochs)."""

    probe: dict | None
    trained: dict[tuple[str, int, int], dict]

    @classmethod
    def read(cls, folders: tuple[str, ...], probe_key: str, train_key: str) -> "_Earlier":
        probe, trained = None, {}
        for folder in folders:
            state = json.loads((work_dir_for(Path(folder)) / "state.json").read_text())
            if probe is None and state.get("probe_key") == probe_key and state.get("probe"):
                probe = {**state["probe"], "reused_from": str(folder)}
            if state.get("train_key") == train_key:
                for t in state["trained"].values():
                    if not math.isnan(t["score"]) and Path(t["dir"], "config.json").is_file():
                        trained.setdefault((t["label"], t["round"], t["epochs"]), t)
        return cls(probe, trained)


def auto(teacher: str | Path, out: str | Path, cfg: AutoConfig, *, overwrite: bool = False, timer: Timer | None = None) -> Path:
    """Find, train and measure the most accurate student of ``teacher`` on its task that meets ``cfg.budget``.

    The task is what ``cfg.task`` names (a preset, or a kind with ``--train-file``), else the teacher's own; with
    ``cfg.embedding`` there is none: the teacher is a sentence-embedding model and its students are scored by the
    embedding check (:mod:`compress.auto.embedding`). A linear sequence of steps: open the search, probe and shortlist
    the shapes, train them by successive halving, measure the finalists and write the chosen one.
    """
    cfg.validate()
    timer = timer or measured_latency
    started = time.monotonic()
    deadline = started + parse_minutes(cfg.time_limit) * 60
    out = check_output(Path(out), overwrite, inputs=(teacher, cfg), resume=cfg.resume)
    teacher_dir = require_torch_weights(resolve_model(teacher), "compress auto (the teacher)")
    task = search_task(teacher_dir, cfg)
    budgets = parse_budgets(cfg.budget)
    at = sorted(points(budgets) or {(1, 128)})
    keys = _keys(teacher_dir, task, cfg, budgets, at)
    place = study_place(cfg.storage, work_dir_for(out), keys[0])
    if cfg.storage and not cfg.resume and joinable(place):  # a search under way: this process only trains
        return _join(teacher_dir, cfg, out, place, keys[2])
    shapes = (auto_embedding.candidate_shapes if cfg.embedding else candidate_shapes)(load_config(teacher_dir), cfg.shapes)
    search, earlier = _open_search(out, keys, cfg)
    if cfg.embedding:  # the sentences split once into held-out and training ones, the teacher's score
        task = auto_embedding.prepare(teacher_dir, cfg.sentences, cfg.data.data_dir, cfg.train.seed, search.work)
    probe = search.state["probe"] or earlier.probe or _probe(teacher_dir, task, shapes, cfg, at, search, timer)
    search.state["probe"] = probe
    search.save()
    model, predicted, shortlist = _shortlist(probe, shapes, budgets, at, cfg, load_config(teacher_dir))
    static = _static_candidate(teacher_dir, task, cfg, search)
    halving, finalists = _halve(teacher_dir, task, shortlist, cfg, search, earlier,
                                deadline - RESERVE * (deadline - started), place, out)
    finalists += _earlier_finalists(earlier, finalists, predicted, search) + static
    artifacts = _finalists(teacher_dir, task, finalists, predicted, cfg, search)
    compared = [Path(c) for c in cfg.compare]
    rows = timer([teacher_dir, *[Path(a["dir"]) for a in artifacts], *compared], at, 2 * cfg.repeats, cfg.final_runs)
    results = _results(rows, teacher_dir, artifacts, budgets)
    chosen = choose(results, budgets, cfg.tie)
    if chosen is None:  # a faster candidate that fits beats nothing
        results += _second_run(teacher_dir, task, finalists, predicted, cfg, search, budgets, at, timer)
        chosen = choose(results, budgets, cfg.tie)
    report = report_data(cfg, task, budgets, probe, model, predicted, halving, results, chosen, teacher_dir, started, search)
    report["compared"] = _compared(rows, [teacher_dir, *compared], task, budgets, at[0])
    finish(place)  # a later run with this --storage starts anew rather than joining
    if chosen is None:
        _refuse_nothing_fits(out, report, results, budgets, at)
    return _write_chosen(Path(chosen["dir"]), out, report, overwrite)


def _keys(teacher_dir: Path, task: Target, cfg: AutoConfig, budgets, at) -> tuple[str, str, str]:
    """The search's key (its study's name derives from it), and the keys of what its probe and its trainings depend on."""
    # A preset given as --task is keyed by it as before (earlier searches stay reusable); any other task by its name.
    common = [str(teacher_dir.resolve()), cfg.task if cfg.task and not task.user else task.name]
    key = json.dumps(common + [[b.text for b in budgets], list(cfg.backends)])
    # What a probe and a trained candidate depend on: another budget with the same keys can reuse them.
    probe_key = json.dumps(common + [list(cfg.backends), at, list(cfg.shapes), cfg.probes, cfg.repeats])
    train_key = json.dumps(common + [list(cfg.losses), asdict(cfg.extra_data), asdict(cfg.data), asdict(cfg.train)]
                           + ([dir_hash(Path(cfg.init_from))] if cfg.init_from else [])
                           + ([asdict(cfg.sentences)] if cfg.embedding else []), default=str)
    return key, probe_key, train_key


def _open_search(out: Path, keys: tuple[str, str, str], cfg: AutoConfig) -> tuple["_Search", "_Earlier"]:
    """The search's state in the output's work folder (new, or resumed) and what ``--reuse`` lends it."""
    return _Search.open(work_dir_for(out), cfg.resume, *keys), _Earlier.read(cfg.reuse, *keys[1:])


def _shortlist(probe: dict, shapes: list[Shape], budgets, at, cfg: AutoConfig, teacher_config):
    """The latency model fitted on the probe, each shape's prediction, and the most promising shapes predicted to fit."""
    # The held-out shapes measured the model's error (probe["error"]); the ranking then uses every probe.
    model = fit_latency_model([Sample(s["variant"], s["batch"], s["seq"], Shape(**s["shape"]), s["ms"]) for s in probe["samples"]])
    sizes = _size_model(probe)
    predicted = {shape.label: _predict(model, sizes, shape, probe, budgets, cfg.margin) for shape in shapes}
    fitting = [s for s in shapes if predicted[s.label]["variants"]]
    if not fitting:
        best = min(probe["rows"], key=lambda r: r["p50_ms"] if (r["batch"], r["seq"]) == at[0] else math.inf)
        raise CompressError(
            f"no student shape is predicted to meet {'; '.join(b.text for b in budgets)}: the fastest model probed was "
            f"{best['name']} at {best['p50_ms']:.2f} ms (p50, batch {best['batch']}, seq {best['seq']}); relax the budget "
            "or add a faster backend (--backends)")
    shortlist = rank_by_prior(fitting, teacher_config)[: cfg.candidates]
    log.info("%d of %d shapes predicted to fit; training %s", len(fitting), len(shapes), ", ".join(s.label for s in shortlist))
    return model, predicted, shortlist


def _halve(teacher_dir: Path, task: Target, shortlist: list[Shape], cfg: AutoConfig, search: "_Search", earlier: "_Earlier",
           training_deadline: float, place: Place, out: Path):
    """Successive halving over the shortlist as an Optuna study (:mod:`compress.auto.engine`; each round's training only
    where it ends before the deadline); the halving record and the finalists (those that reached the deepest round, and
    a runner-up when only one did; capped, see below). The state's trained entries are rebuilt from the study."""
    done = [t for t in search.state["trained"].values() if Path(t["dir"], "config.json").is_file()]  # --resume: never again
    plan = Plan(labels=tuple(s.label for s in shortlist), shapes={s.label: _fields(s) for s in shortlist},
                train_key=search.state["train_key"], rounds=cfg.rounds, eta=cfg.eta, epochs=cfg.train.epochs,
                deadline=time.time() + training_deadline - time.monotonic(), reused=(*earlier.trained.values(), *done))
    trainer = _Trainer.of(teacher_dir, task, cfg, search.work, plan.shapes, plan.reused)
    halving = run_halving(place, plan, trainer, _spec(teacher_dir, out, cfg), cfg.workers, cfg.resume)
    search.state["trained"].update({f"{e['label']}/{e['round']}": e for e in halving.entries})
    search.save()
    scores = {k: t["score"] for k, t in _latest(halving.entries).items()}
    # Asynchronous halving lets the first shape and ties go on: at most as many finalists as synchronous halving keeps
    # after the rounds reached (two at least), the best first, so the final measurement costs what it did
    keep = max(2, math.ceil(len(shortlist) / cfg.eta ** (len(halving.survivors) - 1))) if halving.survivors else 0
    finalists = sorted(_with_runner_up(halving.survivors, scores), key=lambda c: -scores[c])[:keep] if keep else []
    if not finalists:
        raise CompressError("every candidate's training failed; see the log above")
    return halving, finalists


def _join(teacher_dir: Path, cfg: AutoConfig, out: Path, place: Place, train_key: str) -> Path:
    """Train candidates of a search another ``compress auto`` coordinates (same --out and --storage) until its queue
    is done; the coordinator measures and writes ``out``."""
    plan = joinable(place)
    task = worker_task(teacher_dir, cfg, work_dir_for(out))
    trainer = _Trainer.of(teacher_dir, task, cfg, work_dir_for(out), plan["shapes"], plan["reused"])
    ran = join(place, train_key, trainer, _spec(teacher_dir, out, cfg), cfg.workers)
    log.info("trained %d candidate(s) of the search in %s; its coordinator writes %s", ran, place.url, out)
    return out


def _fields(shape: Shape) -> dict:
    return {k: v for k, v in shape.__dict__.items() if k != "origin"}


def _spec(teacher_dir: Path, out: Path, cfg: AutoConfig) -> TrainerSpec:
    """How a spawned worker process builds its trainer (plain data: it imports this module only when it trains)."""
    return TrainerSpec("compress.auto.run:candidate_trainer", {"teacher": str(teacher_dir), "out": str(out), "cfg": to_dict(cfg)})


def candidate_trainer(teacher: str, out: str, cfg: dict, attrs: dict) -> "_Trainer":
    """A worker process's trainer, from its :class:`TrainerSpec` and the study's plan (``attrs["plan"]``)."""
    config = from_dict(AutoConfig, cfg, validate=False)
    teacher_dir, work = Path(teacher), work_dir_for(Path(out))
    plan = attrs["plan"]
    return _Trainer.of(teacher_dir, worker_task(teacher_dir, config, work), config, work, plan["shapes"], plan["reused"])


@dataclass(frozen=True)
class _Trainer:
    """Trains one candidate's round for the halving's workers and prices the next; writes no shared state (the
    study records each round)."""

    teacher_dir: Path
    task: Target
    cfg: AutoConfig
    work: Path
    shapes: dict[str, Shape]
    reused: dict[tuple[str, int, int], dict]  # (label, round, epochs) -> an entry trained before: --reuse or --resume

    @classmethod
    def of(cls, teacher_dir: Path, task: Target, cfg: AutoConfig, work: Path, shapes: dict, reused) -> "_Trainer":
        return cls(teacher_dir, task, cfg, work, {k: Shape(**v) for k, v in shapes.items()},
                   {(e["label"], e["round"], e["epochs"]): e for e in reused})

    def train(self, label: str, round_: int, epochs: int) -> dict:
        entry = self.reused.get((label, round_, epochs))
        if entry is None:
            return _train_candidate(self.teacher_dir, self.task, self.shapes[label], round_, epochs, self.cfg, self.work)
        here = self.work / "candidates" / f"{label}-r{round_}"
        return entry if Path(entry["dir"]).resolve() == here.resolve() else _copied(entry, self.work)

    def affordable(self, round_: int, label: str, epochs: int, history: list[dict], until: float) -> bool:
        trained = _Search(self.work, {"trained": dict(enumerate(history))})
        return _affordable(round_, [(label, epochs)], trained, _Earlier(None, self.reused), until, self.shapes)


def _refuse_nothing_fits(out: Path, report: dict, results: list[dict], budgets, at) -> None:
    """Write the search's report beside the output and stop: no model measured meets the budget."""
    quickest = fastest(results, at[0])
    write_report(work_dir_for(out) / "search", report)
    raise CompressError(
        f"nothing measured meets {'; '.join(b.text for b in budgets)}: the fastest was {quickest['name']} at "
        f"{quickest['measurement']['points'][at[0]]['p50_ms']:.2f} ms (p50, batch {at[0][0]}, seq {at[0][1]}); "
        f"the search's report is in {work_dir_for(out) / 'search'}")


def search_task(teacher_dir: Path, cfg: AutoConfig) -> Target:
    """The task of the search, resolved once (a preset, a kind and its training file, or the teacher's own), and
    refused now when its data cannot be read later: a user's task is trained on its files, never the hub. An
    --embedding search has none: its target, prepared in the work folder once it is open (auto_embedding.prepare)."""
    if cfg.embedding:
        auto_embedding.check_teacher(teacher_dir)
        return EmbeddingTarget()
    if not cfg.task and is_sentence_folder(teacher_dir) and task_of_model(teacher_dir) is None:
        raise CompressError(f"{teacher_dir} is a sentence-embedding model (a sentence-transformers folder) with no task: "
                            "pass --embedding and --corpus FILE_OR_DIR[,...] to search its students, or --task to search "
                            "students of a task")
    task = resolve_task(cfg.task, cfg.data.own, train_file=cfg.data.train_file, model=teacher_dir)
    if task.user and not cfg.data.train_file:
        raise CompressError(f"{teacher_dir} was made for your own {task.kind} task {task.display}: pass its --train-file and "
                            "--dev-file, the data the candidates are distilled on")
    return task


def worker_task(teacher_dir: Path, cfg: AutoConfig, work: Path) -> Target:
    """The search's task as a worker process sees it: an --embedding search's sentences and score are the ones its
    coordinator prepared in the work folder."""
    return auto_embedding.load_target(work) if cfg.embedding else search_task(teacher_dir, cfg)


def task_option(task: Task) -> str:
    """The --task a stage the search runs is given: a preset's name, or a user's task's kind (its labels and columns
    then come from the folder, the files from the same data options)."""
    return task.kind if task.user else task.name


# ---------------------------------------------------------------------------- shapes


def candidate_shapes(teacher_config, names: tuple[str, ...] = ()) -> list[Shape]:
    """The shapes to search: ``names``, or depths 1..teacher x widths teacher, 3/4, 1/2, 1/3 (heads of the teacher's width)
    x FFN the teacher's ratio to its width, or half of it (at one depth, halving the FFN removes a third of a BERT layer's
    matmul FLOPs but keeps every attention head: 3L-384-768 costs what 2L-384 does)."""
    sizes = config_sizes(teacher_config)
    h, layers, head_dim = sizes.hidden, sizes.layers, sizes.head_size
    if names:  # heads as wide as the teacher's (so a student of its width takes its layers), where the width allows
        shapes = [resolve_shape(n) for n in names]
        return [Shape(s.layers, s.hidden, s.hidden // head_dim, s.ffn) if s.hidden % head_dim == 0 else s for s in shapes]
    ratio = sizes.ffn / h
    shapes = []
    for width in dict.fromkeys([h, 3 * h // 4, h // 2, h // 3]):
        width -= width % head_dim
        if width < head_dim:
            continue
        for depth in sorted({d for d in (1, 2, 3, 4, 6) if d <= layers} | {max(1, layers // 2)}):
            for ffn in dict.fromkeys([int(ratio * width), int(ratio * width) // 2]):
                shapes.append(Shape(depth, width, width // head_dim, ffn))
    return shapes


def rank_by_prior(shapes: list[Shape], teacher_config) -> list[Shape]:
    """The accuracy prior: shapes cut from the teacher's weights (no wider than it) first, then more parameters first,
    then deeper first (at equal parameters, deep-and-thin students distil better: MobileBERT, MiniLM)."""
    def params(s: Shape) -> int:
        return s.layers * (4 * s.hidden * s.hidden + 2 * s.hidden * s.ffn)

    return sorted(shapes, key=lambda s: (not fits_inside(teacher_config, s), -params(s), -s.layers, s.label))


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


# ---------------------------------------------------------------------------- step 1: probe


def _make_variant(source: Path, dest: Path, how, cfg: AutoConfig, task: Target, max_eval: int | None) -> Path:
    """``source`` (an fp32 student folder) as one backend variant in ``dest`` (made once; reused on resume)."""
    if how is None:
        return source
    if (dest / "compression.json").is_file():
        return dest
    kind, backend, scheme = how
    if kind == "export":  # scheme: the floating-point precision asked of the runtime (None: fp32)
        return export(source, dest, ExportConfig(format=backend, precision=scheme or "fp32"), overwrite=True)
    if cfg.embedding:  # calibrated on the search's training sentences; scored by the search itself
        qcfg = auto_embedding.quantize_config(task, backend, scheme, cfg.train.seed, probe=max_eval is not None)
    else:
        data = replace(cfg.data, max_eval_examples=max_eval or cfg.data.max_eval_examples)
        qcfg = QuantizeConfig(backend=backend, scheme=scheme, task=task_option(task), data=data,
                              max_drop=cfg.max_drop if max_eval is None else None)
    return quantize(source, dest, qcfg, overwrite=True)


def _probe(teacher_dir: Path, task: Target, shapes: list[Shape], cfg: AutoConfig, at, search: _Search, timer: Timer) -> dict:
    """Time random-weight students of spread-out shapes as every variant; the samples the latency model is fitted on."""
    fit, held = probe_shapes(shapes, cfg.probes)
    teacher = load_model(teacher_dir, head="base" if cfg.embedding else task.behaviour.head)
    tokenizer = load_tokenizer(teacher_dir)
    dirs, meta = [], []
    for shape in fit + held:
        source = search.work / "probe" / shape.label / "fp32"
        if not (source / "config.json").is_file():
            model, info = init_student(teacher, shape, method="random", seed=0)
            save_model_dir(model, source, tokenizer=tokenizer, overwrite=True,
                           record=compression_record(stage="auto-probe", method="random", parent=teacher_dir, extra={"init": info}))
        for name, how in _variants(cfg):
            path = _make_variant(source, search.work / "probe" / shape.label / name, how, cfg, task, max_eval=8)
            dirs.append(path)
            meta.append({"variant": name, "shape": shape.__dict__, "held_out": shape in held})
    rows = timer([teacher_dir, *dirs], at, cfg.repeats, PROBE_RUNS)
    # The teacher sets every speedup budget, and the probe's dozens of models are timed one after another: it is
    # timed again after them and its faster time kept, so one slow spell cannot loosen every budget at once (one
    # did on a 2-core machine: 40.3 ms, against 27.1 in the next probe).
    again = {(r["batch"], r["seq"]): r["p50_ms"] for r in timer([teacher_dir], at, cfg.repeats, 1)}
    by_dir = {}
    for row in rows:
        by_dir.setdefault(str(row["model"]), []).append(row)
    samples = []
    for path, info in zip(dirs, meta):
        for row in by_dir[str(path)]:
            shape = {k: v for k, v in info["shape"].items() if k != "origin"}
            samples.append({**info, "shape": shape, "batch": row["batch"], "seq": row["seq"], "ms": _fastest_run(row),
                            "size_bytes": size_on_disk(path), "params": row.get("params")})
    fitted = [s for s in samples if not s["held_out"]]
    error = None
    if any(s["held_out"] for s in samples):
        as_samples = [Sample(s["variant"], s["batch"], s["seq"], Shape(**s["shape"]), s["ms"]) for s in samples]
        held_flags = {id(x): s["held_out"] for x, s in zip(as_samples, samples)}
        error = held_out_error(as_samples, lambda x: held_flags[id(x)])
        error = {"median": error["median"], "worst": error["worst"],
                 "errors": [{"variant": e["sample"].backend, "shape": e["sample"].shape.label, "batch": e["sample"].batch,
                             "seq": e["sample"].seq, "measured_ms": e["sample"].ms, "predicted_ms": e["predicted_ms"],
                             "percent": e["percent"]} for e in error["errors"]]}
    timings = {f"{r['batch']},{r['seq']}": [_fastest_run(r), again[(r["batch"], r["seq"])]] for r in by_dir[str(teacher_dir)]}
    return {"samples": fitted + [s for s in samples if s["held_out"]], "error": error,
            "teacher": {point: min(ms) for point, ms in timings.items()}, "teacher_timings": timings,
            "teacher_size_bytes": size_on_disk(teacher_dir),
            "rows": [{**r, "model": str(r["model"])} for r in rows], "when": utc_now()}


def _fastest_run(row: dict) -> float:
    """A timed row's p50 in its fastest run."""
    return min(row.get("runs_p50_ms") or [row["p50_ms"]])


def _variant_table(cfg: AutoConfig) -> dict[str, tuple]:
    """What each backend contributes: to a task model, or (--embedding) to a sentence-embedding folder."""
    return auto_embedding.VARIANTS if cfg.embedding else VARIANTS


def _variants(cfg: AutoConfig) -> list[tuple[str, Any]]:
    """The variants of the chosen backends this CPU runs as what they are (bf16 ones where it has bf16 kernels)."""
    table = _variant_table(cfg)
    bf16 = "openvino" in cfg.backends and openvino_bf16()
    return [v for name in cfg.backends for v in table[name] if bf16 or v[0] not in BF16_VARIANTS]


def _size_model(probe: dict) -> dict[str, tuple[float, float]]:
    """Per variant: bytes = a * encoder parameters + b, fitted on the probe folders (least squares on two or more)."""
    fits = {}
    for variant in {s["variant"] for s in probe["samples"]}:
        pts = {(json.dumps(s["shape"]), s["size_bytes"]) for s in probe["samples"] if s["variant"] == variant}
        x = np.array([_encoder_params(Shape(**json.loads(k))) for k, _ in pts], dtype=float)
        y = np.array([v for _, v in pts], dtype=float)
        if len(x) >= 2 and np.ptp(x) > 0:
            a, b = np.polyfit(x, y, 1)
        else:
            a, b = 0.0, float(y.mean())
        fits[variant] = (float(a), float(b))
    return fits


def _encoder_params(shape: Shape) -> int:
    return shape.layers * (4 * shape.hidden * shape.hidden + 2 * shape.hidden * shape.ffn)


def _predict(model, sizes: dict, shape: Shape, probe: dict, budgets: tuple[Budget, ...], margin: float) -> dict:
    """Predicted measurement of ``shape`` per variant (``sizes``: :func:`_size_model`), and the variants predicted
    to meet every budget (within margin)."""
    out = {"measurements": {}, "variants": []}
    for variant in sorted({s["variant"] for s in probe["samples"]}):
        pts = {}
        for key, teacher_ms in probe["teacher"].items():
            b, s = map(int, key.split(","))
            ms = model.predict(variant, b, s, shape)
            pts[(b, s)] = {k: ms for k in ("p50_ms", "p90_ms", "p99_ms", "mean_ms")}
            pts[(b, s)].update(throughput=b / ms * 1e3, speedup=teacher_ms / ms)
        a, c = sizes[variant]
        m = {"size_bytes": a * _encoder_params(shape) + c, "points": pts}
        out["measurements"][variant] = m
        if all(_met_with_margin(budget, m, margin) for budget in budgets):
            out["variants"].append(variant)
    return out


def _met_with_margin(budget: Budget, m: dict, margin: float) -> bool:
    value = budget.value(m)
    upper = budget.kind in ("latency", "size")  # a ceiling; throughput and speed-up are floors
    return value <= budget.limit * (1 + margin) if upper else value >= budget.limit / (1 + margin)


# ---------------------------------------------------------------------------- step 3: training


def _train_candidate(teacher_dir: Path, task: Target, shape: Shape, round_: int, epochs: int,
                     cfg: AutoConfig, work: Path) -> dict:
    """Distil ``shape`` for ``epochs`` (round 0 from the teacher; later rounds continue the previous round's student);
    its entry (score NaN when the training failed)."""
    out = work / "candidates" / f"{shape.label}-r{round_}"
    if out.exists():  # a worker killed while writing it: this run starts the round afresh
        shutil.rmtree(out)
    started = time.monotonic()
    init, init_from = _start(teacher_dir, shape, round_, cfg, work)
    try:
        if cfg.embedding:
            score = auto_embedding.train_candidate(teacher_dir, task, shape, init, epochs,
                                                   auto_embedding.embedding_losses(cfg.losses, TASK_LOSSES), cfg.train,
                                                   cfg.data.max_length, out)
            teacher_score = task.teacher
        else:
            score, teacher_score = _distil(teacher_dir, task, shape, init, init_from, epochs, cfg, out)
    except CompressError as err:
        log.warning("candidate %s (round %d) failed: %s", shape.label, round_, err)
        return {"label": shape.label, "round": round_, "epochs": epochs, "score": math.nan, "dir": str(out)}
    return {"label": shape.label, "round": round_, "epochs": epochs, "score": score, "dir": str(out),
            "teacher": teacher_score, "seconds": round(time.monotonic() - started, 1), "init": init_from or init}


def _start(teacher_dir: Path, shape: Shape, round_: int, cfg: AutoConfig, work: Path) -> tuple[str, str | None]:
    """How a candidate's round starts, (init, init_from): round 0 from --init-from's weights, else the teacher's (cut to
    a narrower width), whenever the shape fits inside; a later round from the previous round's student."""
    if round_ > 0:
        return str(work / "candidates" / f"{shape.label}-r{round_ - 1}"), None
    if cfg.init_from and fits_inside(load_config(Path(cfg.init_from)), shape):
        return "teacher", cfg.init_from
    return ("teacher" if fits_inside(load_config(teacher_dir), shape) else "random"), None


def _distil(teacher_dir: Path, task: Task, shape: Shape, init: str, init_from: str | None, epochs: int, cfg: AutoConfig,
            out: Path) -> tuple[float, float]:
    """One round of a task candidate by ``compress distill``: (its dev score, NaN when unscored; the teacher's)."""
    dcfg = DistillConfig(task=task_option(task), student=f"{shape.layers}L-{shape.hidden}-{shape.ffn}", heads=shape.heads,
                         init=init, init_from=init_from, losses=cfg.losses, extra_data=cfg.extra_data, data=cfg.data,
                         train=replace(cfg.train, epochs=epochs))
    distill(teacher_dir, out, dcfg, overwrite=True, task=task)
    retention = next(r for r in read_metrics(out) if r.get("kind") == "retention")
    score = float(retention["student"]) if retention["student"] is not None else math.nan
    return score, retention["teacher"]


def _static_candidate(teacher_dir: Path, task: EmbeddingTarget, cfg: AutoConfig, search: _Search) -> list[str]:
    """An --embedding search's static (model2vec) student, trained once beside the halving (it has no shape to halve;
    a resumed search keeps it): its label among the finalists, or none."""
    if not (cfg.embedding and cfg.sentences.static):
        return []
    key = f"{STATIC_LABEL}/0"
    entry = search.state["trained"].get(key)
    if entry is None or not Path(entry["dir"], "config.json").is_file():
        entry = auto_embedding.train_static(teacher_dir, task, cfg.train, search.work / "candidates" / STATIC_LABEL)
        if entry is None:  # model2vec is not installed (said in the log)
            return []
        search.state["trained"][key] = entry
        search.save()
    return [] if math.isnan(entry["score"]) else [STATIC_LABEL]


def _affordable(round_: int, plan: list[tuple[str, int]], search: _Search, earlier: _Earlier, until: float,
                shapes: dict[str, Shape]) -> bool:
    """Whether a round's trainings end before ``until`` (monotonic seconds): each candidate priced by its seconds per
    epoch so far (here or in an earlier search), one never trained by its parameters at the others' rate, one an
    earlier search trained alike at nothing (it is copied)."""
    history = [(t["label"], t["epochs"], t["seconds"])
               for t in sorted([*earlier.trained.values(), *search.state["trained"].values()], key=lambda t: t["round"])]
    todo = [(label, units) for label, units in plan if (label, round_, units) not in earlier.trained]
    left = until - time.monotonic()
    need = round_seconds(todo, history, size=lambda label: _encoder_params(shapes[label]) if label in shapes else 0.0)
    if left > 0 and need > left:
        log.info("round %d: %s would need about %.0f s of training, %.0f s are left", round_, plan[-1][0], need, left)
    return left > 0 and need <= left


def _earlier_finalists(earlier: _Earlier, finalists: list[str], predicted: dict, search: _Search, most: int = 2) -> list[str]:
    """Models earlier searches (``--reuse``) trained, of shapes predicted to fit this budget, that score above a
    finalist (whose int8 may yet miss the budget): up to ``most`` of them, best first, join the finalists (copied
    in), so a second budget never ends with a worse model than one already trained for it."""
    here = _best_round(search.state["trained"].values())  # what each finalist will be made from
    weakest = min((here[c]["score"] for c in finalists), default=-math.inf)
    fitting = [e for e in earlier.trained.values() if e["label"] not in finalists and predicted.get(e["label"], {}).get("variants")]
    better = sorted((e for e in _best_round(fitting).values() if e["score"] > weakest), key=lambda e: -e["score"])[:most]
    for entry in better:
        _adopt(entry, search)
    return [e["label"] for e in better]


def _with_runner_up(survivors: tuple[tuple[str, ...], ...], latest: dict[str, float]) -> list[str]:
    """The last round's survivors, and when a round cut short by time left one, the best other survivor of the
    round before (its int8 may meet a budget the one's misses)."""
    finalists = list(survivors[-1])
    if len(finalists) == 1 and len(survivors) >= 2:
        others = sorted((c for c in survivors[-2] if c not in finalists), key=lambda c: -latest[c])
        finalists += others[:1]
    return finalists


def _per_label(entries, rank) -> dict[str, dict]:
    """One record per candidate label: the highest by ``rank`` (on a tie, the one listed later)."""
    kept: dict[str, dict] = {}
    for t in entries:
        if t["label"] not in kept or rank(t) >= rank(kept[t["label"]]):
            kept[t["label"]] = t
    return kept


def _best_round(entries) -> dict[str, dict]:
    """Each candidate's best-scoring round, by label (on a tie the later one; a failed round only when none scored): a longer round
    is not always better (MRPC 4L-288-576: 84.09 after 3 epochs, 83.75 after 4 more)."""
    return _per_label(entries, lambda t: (-math.inf if math.isnan(t["score"]) else t["score"], t["round"]))


def _latest(entries) -> dict[str, dict]:
    """Each candidate's record of its latest round, by label."""
    return _per_label(entries, lambda t: t["round"])


def _adopt(entry: dict, search: _Search) -> float:
    """A candidate an earlier search trained with the same settings, copied in and recorded in the state."""
    search.state["trained"][f"{entry['label']}/{entry['round']}"] = _copied(entry, search.work)
    search.save()
    return entry["score"]


def _copied(entry: dict, work: Path) -> dict:
    """An earlier search's trained candidate copied into ``work``'s candidates (a later round continues from it)."""
    out = work / "candidates" / f"{entry['label']}-r{entry['round']}"
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(entry["dir"], out)
    log.info("candidate %s (round %d): reused from %s", entry["label"], entry["round"], entry["dir"])
    return {**entry, "dir": str(out), "reused_from": entry["dir"]}


# ---------------------------------------------------------------------------- step 4: finalists


def _finalists(teacher_dir: Path, task: Target, labels: list[str], predicted: dict, cfg: AutoConfig, search: _Search,
               add: bool = False) -> list[dict]:
    """Every finalist as each variant predicted to fit it, with its dev score (int8 measured after quantizing);
    recorded in the state as its finalists (``add``: beside those already there)."""
    best = _best_round(search.state["trained"].values())
    artifacts = []
    for label in labels:
        last = best[label]
        source = Path(last["dir"])
        if label not in predicted:  # the static student: no shape, so no prediction; it is its own only variant
            artifacts.append({"label": label, "variant": STATIC_VARIANT, "dir": str(source), "accuracy": float(last["score"]),
                              "teacher": last["teacher"], "predicted": None})
            continue
        for name, how in _variants(cfg):
            if name not in predicted[label]["variants"]:
                continue
            try:
                # named by round: a resumed search that trained further never reuses the variant of an older round
                dest = search.work / "final" / f"{label}-r{last['round']}-{name}"
                path = _make_variant(source, dest, how, cfg, task, max_eval=None)
                accuracy = _variant_accuracy(path, how, task, last["score"], cfg)
            except CompressError as err:  # e.g. the accuracy guard refused the int8 model
                log.warning("%s as %s: %s", label, name, err)
                continue
            artifacts.append({"label": label, "variant": name, "dir": str(path), "accuracy": float(accuracy),
                              "teacher": last["teacher"], "predicted": predicted[label]["measurements"][name]})
    search.state["finalists"] = (search.state["finalists"] if add else []) + [
        {k: v for k, v in a.items() if k != "predicted"} for a in artifacts]
    search.save()
    return artifacts


def _variant_accuracy(path: Path, how, task: Target, fp32: float, cfg: AutoConfig) -> float:
    """A variant's score: an int8 or bf16 one's own (int8: its dev score as quantize measured it; bf16: scored here;
    with --embedding the search's check, refused beyond --max-drop), any other its fp32 candidate's."""
    if how is None or (how[0] != "quantize" and how[2] != "bf16"):
        return fp32
    if cfg.embedding:
        return auto_embedding.variant_score(path, task, fp32, cfg.max_drop)
    if how[0] == "export":
        return _dev_score(path, task, cfg)
    evals = [r for r in read_metrics(path) if r.get("kind") == "eval"]
    return float(evals[-1]["metrics"][task.primary_metric]) if evals else fp32


def _dev_score(path: Path, task: Task, cfg: AutoConfig) -> float:
    """``path``'s primary dev metric as the runtime runs it (a bf16 folder in bf16), on the search's dev split."""
    model = load_model(path, head=task.behaviour.head)
    max_length = cfg.data.resolved_max_length(task, config_sizes(model.config).max_positions)
    dev = load_dev_splits(task, cfg.data)
    scores = dev_evaluator(task, load_tokenizer(path), dev, max_length, batch_size=cfg.data.eval_batch_size)(model)
    return float(scores[task.primary_metric])


def _second_run(teacher_dir: Path, task: Target, finalists: list[str], predicted: dict, cfg: AutoConfig, search: _Search,
                budgets, at, timer: Timer) -> list[dict]:
    """When every finalist missed a budget: every other trained candidate (most accurate first) as each variant
    predicted to fit, timed in a second final run beside the teacher. Marked ``second_run`` in the report."""
    best = _best_round(search.state["trained"].values())
    others = sorted((c for c in best if c not in finalists and predicted.get(c, {}).get("variants")),
                    key=lambda c: -best[c]["score"])
    if not others:
        return []
    log.info("no finalist met %s; timing the other candidates too: %s", "; ".join(b.text for b in budgets), ", ".join(others))
    artifacts = [{**a, "second_run": True} for a in _finalists(teacher_dir, task, others, predicted, cfg, search, add=True)]
    rows = timer([teacher_dir, *[Path(a["dir"]) for a in artifacts]], at, 2 * cfg.repeats, cfg.final_runs)
    return _results(rows, teacher_dir, artifacts, budgets)


def _results(rows: list[dict], teacher_dir: Path, artifacts: list[dict], budgets) -> list[dict]:
    by_dir: dict[str, list[dict]] = {}
    for row in rows:
        by_dir.setdefault(str(row["model"]), []).append(row)
    results = []
    for a in artifacts:
        m = measurement(by_dir[a["dir"]], size_on_disk(Path(a["dir"])))
        results.append({**a, "name": f"{a['label']} {a['variant']}", "measurement": m,
                        "meets": {b.text: b.met(m) for b in budgets}})
    return results


def _compared(rows: list[dict], folders: list[Path], task: Target, budgets, at: tuple[int, int]) -> list[dict]:
    """The teacher and the ``--compare`` folders as measured in the final run: score, p50, budgets met."""
    out = []
    for folder in folders:
        mine = [r for r in rows if str(r["model"]) == str(folder)]
        m = measurement(mine, size_on_disk(folder))
        out.append({"name": folder.name, "dir": str(folder), "accuracy": _given_score(folder, task),
                    "measured_p50_ms": m["points"][at]["p50_ms"], "size_bytes": m["size_bytes"],
                    "meets": {b.text: b.met(m) for b in budgets}})
    return out


def _given_score(folder: Path, task: Target) -> float | None:
    """A compared model's score: its dev score as its records hold it; with --embedding the search's own check (None
    when it cannot be scored so, e.g. embeddings of another width against the teacher's)."""
    if isinstance(task, EmbeddingTarget):
        try:
            return auto_embedding.score_folder(folder, task)
        except CompressError as err:
            log.warning("%s is shown unscored: %s", folder, err)
            return None
    metric = task.primary_metric
    evals = [r for r in read_metrics(folder) if r.get("kind") == "eval" and r.get("task") == task.name
             and r.get("split") in ("dev", "dev_matched") and metric in r.get("metrics", {})]
    return evals[-1]["metrics"][metric] if evals else None


# ---------------------------------------------------------------------------- the report and the output


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
