"""``compress auto``'s successive halving, run as an Optuna study that several workers and machines share.

One Optuna trial is one candidate shape. The coordinator (the ``compress auto`` process that probed) creates the study in
RDB storage (``sqlite:///<work dir>/search.db``, or ``--storage URL``), records the plan in its user attributes (shapes,
training-settings key, rounds, eta, epochs, the deadline) and enqueues one trial per shortlisted shape. Every worker runs
:func:`work`: it takes a waiting trial, trains its rounds (round r: ``epochs * eta**r`` epochs, continuing round r-1)
and reports each round's score at the cumulative epochs; Optuna's ``SuccessiveHalvingPruner`` stops the candidates
that fall out of the best 1/eta at a rung (asynchronous successive halving, Li et al. 2020: a candidate is promoted
when it is in the best 1/eta of those that reached its rung so far, so nobody waits for a round to end).

A worker that dies loses only its running trial: the others' heartbeat check fails it after the grace period and
Optuna's retry callback enqueues it again with its finished rounds (user attributes ``round-<r>``), which the retry
skips; the halving counts the failed trial and its retry as one candidate (:class:`OncePerCandidate`).
:func:`run_halving` is the coordinator's entry; :func:`join` a second machine's; :func:`outcome` reads the study back
as the halving's record.

A trainer is anything with ``train(label, round, epochs) -> entry`` (the entry dict ``compress auto`` keeps per trained
round: label, round, epochs, score, dir, teacher, seconds, init; score NaN when training failed) and
``affordable(round, label, epochs, history, until) -> bool`` (``until``: monotonic seconds; ``history``: the entries
trained so far). Worker processes get a :class:`TrainerSpec` instead and import the trainer only when they train.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import math
import multiprocessing
import os
import socket
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compress.core.errors import CompressError, reason

log = logging.getLogger(__name__)

PHASES = ("training", "measuring", "finished")  # study user attr "phase": a study in the first two can be joined
POLL = 2.0  # seconds a worker waits before looking at the queue again while others train the last trials


@dataclass(frozen=True)
class Place:
    """Where a study lives and how its workers watch each other: heartbeat every ``heartbeat`` s, a running trial
    whose last heartbeat is older than ``grace`` s is failed and retried (at most ``retries`` times)."""

    url: str
    name: str
    heartbeat: int = 60
    grace: int = 180
    retries: int = 2


@dataclass(frozen=True)
class Plan:
    """What the coordinator puts in the study: the queue and what every worker needs to train it alike."""

    labels: tuple[str, ...]  # the shortlist, best prior first (the queue's order)
    shapes: dict[str, dict]  # label -> Shape fields
    train_key: str  # the training settings; a worker with other settings is refused
    rounds: int
    eta: int
    epochs: int  # round 0's epochs; round r trains epochs * eta**r
    deadline: float  # wall-clock (time.time()) end of training, shared by every machine
    reused: tuple[dict, ...] = ()  # entries earlier searches (--reuse) trained alike: copied in, never trained


@dataclass(frozen=True)
class TrainerSpec:
    """A trainer a worker process builds when it first trains: ``factory`` ("module:function") called with
    ``kwargs`` and the study's user attributes (plain data, so a spawned worker imports nothing heavy until then)."""

    factory: str
    kwargs: dict = field(default_factory=dict)

    def build(self, attrs: dict) -> Any:
        module, name = self.factory.split(":")
        return getattr(importlib.import_module(module), name)(**self.kwargs, attrs=attrs)


@dataclass(frozen=True)
class Halving:
    """The study read back: every trained round's entry, the labels with a score after each round (shortlist
    order), why it stopped ('rounds', 'time' or 'all failed') and one row per candidate trial for the report."""

    entries: tuple[dict, ...]
    survivors: tuple[tuple[str, ...], ...]  # survivors[r]: candidates that finished round r with a score
    stopped: str
    trials: tuple[dict, ...]  # number, label, state, rounds, scores, worker, retry_of, stopped


def study_place(storage: str | None, work: Path, key: str, **watch: int) -> Place:
    """The study of the search ``key``: in ``storage`` (any SQLAlchemy URL), else ``search.db`` in the work folder."""
    url = storage or f"sqlite:///{Path(work).resolve() / 'search.db'}"
    return Place(url, "compress-auto-" + hashlib.sha1(key.encode()).hexdigest()[:16], **watch)


def check_url(url: str) -> None:
    """Refuse a storage URL SQLAlchemy cannot parse or has no dialect for, in one line."""
    # deferred: sqlalchemy is only needed when a search runs
    import sqlalchemy

    try:
        sqlalchemy.engine.make_url(url).get_dialect()
    except Exception as err:  # ArgumentError (syntax), NoSuchModuleError (dialect): both a bad option
        raise CompressError(f"--storage {url!r} is not a database URL SQLAlchemy can open ({reason(err)}); "
                            "write e.g. sqlite:////shared/search.db or postgresql://user:pass@host/db") from None



def _storage(place: Place):
    """The RDB storage with heartbeats and the retry of stale trials (their finished rounds inherited)."""
    # deferred: optuna (and sqlalchemy) are only needed when a search trains
    import optuna

    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)  # heartbeats are "experimental"
    # Optuna 4.9 renamed the callback and its keyword; before it: RetryFailedTrialCallback, failed_trial_callback
    kwarg = "heartbeat_stale_trial_callback" if hasattr(optuna.storages, "RetryHeartbeatStaleTrialCallback") else "failed_trial_callback"
    retry = _retry_callback(place)
    # SQLite serialises writers; a worker waits for the lock rather than failing at the default 5 s
    engine = {"connect_args": {"timeout": 60}} if place.url.startswith("sqlite") else {}
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        return optuna.storages.RDBStorage(place.url, engine_kwargs=engine, heartbeat_interval=place.heartbeat,
                                          grace_period=place.grace, **{kwarg: retry})
    except Exception as err:  # a driver not installed, a server not reachable, a file not writable
        raise CompressError(f"--storage {place.url!r}: cannot open it ({reason(err)})") from None


def _retry_callback(place: Place):
    """Queue a failed trial again (``place.retries`` times at most) with its reported values and finished rounds."""
    # deferred: see _storage
    import optuna

    retry_cls = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None) or optuna.storages.RetryFailedTrialCallback
    return retry_cls(max_retry=place.retries, inherit_intermediate_values=True)


def _pruner(settings: dict) -> OncePerCandidate:
    # deferred: see _storage
    import optuna

    return OncePerCandidate(optuna.pruners.SuccessiveHalvingPruner(
        min_resource=settings["epochs"], reduction_factor=settings["eta"], min_early_stopping_rate=0))


def _retried(trials) -> set[int]:
    """Numbers of the trials a retry took over (Optuna's retry callback lists them in the retry's ``retry_history``)."""
    return {n for t in trials for n in t.system_attrs.get("retry_history", ())}


class _WithoutRetried:
    """A study whose trials leave out those a retry took over: the retry carries their rounds and rung values."""

    def __init__(self, study):
        self._study = study

    def __getattr__(self, name: str):
        return getattr(self._study, name)

    def get_trials(self, deepcopy: bool = True, states=None) -> list:
        trials = self._study.get_trials(deepcopy=deepcopy)
        retried = _retried(trials)
        return [t for t in trials if t.number not in retried and (states is None or t.state in states)]


@dataclass(frozen=True)
class OncePerCandidate:
    """Optuna's successive-halving pruner counting each candidate once at a rung. A retried trial (its worker died)
    leaves its rung values in both the failed trial and its retry, which copies them; counted twice, they would stand
    for two candidates and move the rung's cut (e.g. eta 2, values 70, 30, 20, 50: 50 is second of four and goes on;
    with 70 twice it is third of five and stops). The failed one is left out: its retry speaks for it."""

    pruner: Any  # optuna.pruners.SuccessiveHalvingPruner

    def prune(self, study, trial) -> bool:
        return self.pruner.prune(_WithoutRetried(study), trial)


def cumulative_epochs(epochs: int, eta: int, round_: int) -> int:
    """Epochs a candidate has trained after ``round_`` (the step its score is reported at): e (eta^(r+1) - 1) / (eta - 1),
    which passes the pruner's rung r (e eta^r) and stays below rung r+1: one rung per round."""
    return epochs * (eta ** (round_ + 1) - 1) // (eta - 1)


def load(place: Place):
    """The study at ``place``, or None when there is none (its pruner set from the plan it records)."""
    # deferred: see _storage
    import optuna

    storage = _storage(place)
    try:
        study = optuna.load_study(study_name=place.name, storage=storage, sampler=optuna.samplers.RandomSampler(seed=0))
    except KeyError:  # optuna's "no such study"
        return None
    if "plan" in study.user_attrs:
        study.pruner = _pruner(study.user_attrs["plan"])
    return study


def _plan_attrs(plan: Plan) -> dict:
    return {"labels": list(plan.labels), "shapes": plan.shapes, "train_key": plan.train_key, "rounds": plan.rounds,
            "eta": plan.eta, "epochs": plan.epochs, "deadline": plan.deadline, "reused": list(plan.reused)}


def _settled(plan: dict) -> dict:
    return {k: v for k, v in plan.items() if k not in ("deadline", "reused")}


def prepare(place: Place, plan: Plan, resume: bool):
    """The coordinator's study: reopened on ``resume`` when it holds the same plan (its finished trials kept, the trials
    a dead run left running failed and retried), else made anew (maximize) with one queued trial per shape."""
    # deferred: see _storage
    import optuna

    study = load(place)
    # the same search: the same queue, shapes, settings and rounds (this run's deadline and reused entries are its own)
    same = study is not None and _settled(study.user_attrs.get("plan", {})) == _settled(_plan_attrs(plan))
    if study is not None and not (resume and same):
        optuna.delete_study(study_name=place.name, storage=study._storage)
        study = None
    if study is None:
        study = optuna.create_study(study_name=place.name, storage=_storage(place), direction="maximize",
                                    sampler=optuna.samplers.RandomSampler(seed=0), pruner=_pruner(_plan_attrs(plan)))
    else:
        _retry_running(study, place)
    study.set_user_attr("plan", _plan_attrs(plan))  # the deadline is this run's
    study.set_user_attr("phase", "training")
    taken = {_label(t) for t in study.get_trials(deepcopy=False) if _label(t) and t.state.name != "FAIL"}
    for label in plan.labels:
        if label not in taken:
            study.enqueue_trial({"shape": label})
    return study


def _retry_running(study, place: Place) -> None:
    """Trials a dead run left RUNNING (``--resume`` says it is dead): failed now, and retried like stale ones."""
    # deferred: see _storage
    from optuna.trial import TrialState

    retry = _retry_callback(place)
    for t in study.get_trials(deepcopy=True, states=(TrialState.RUNNING,)):
        study.tell(t.number, state=TrialState.FAIL)
        retry(study, t)


def _label(frozen) -> str | None:
    """The shape a trial trains: its queued ("fixed") parameter; None for a trial nobody queued."""
    return (frozen.system_attrs.get("fixed_params") or {}).get("shape")


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _history(study) -> list[dict]:
    """Every round trained so far, by any worker (what prices the next one), each once (a retry carries the rounds of
    the trial it took over)."""
    trials = _WithoutRetried(study).get_trials(deepcopy=False)
    return [v for t in trials for k, v in sorted(t.user_attrs.items()) if k.startswith("round-")]


def _objective(study, trainer_box: list, spec: TrainerSpec | None):
    """One trial = one candidate: each round trained (or inherited from a retried trial), reported, maybe pruned."""
    # deferred: see _storage
    import optuna

    def objective(trial) -> float:
        frozen = next(t for t in study.get_trials(deepcopy=False) if t.number == trial.number)
        label = _label(frozen)
        if label is None:  # asked after another worker emptied the queue: not a candidate
            trial.set_user_attr("stray", True)
            raise optuna.TrialPruned("no candidate was waiting")
        attrs = study.user_attrs
        plan = attrs["plan"]
        trial.suggest_categorical("shape", plan["labels"])  # the queued label (recorded as the trial's parameter)
        trial.set_user_attr("worker", worker_name())
        if not trainer_box:
            trainer_box.append(spec.build(attrs))
        trainer = trainer_box[0]
        until = time.monotonic() + plan["deadline"] - time.time()  # the shared wall-clock deadline, on this clock
        last = None
        for r in range(plan["rounds"]):
            epochs = plan["epochs"] * plan["eta"] ** r
            entry = trial.user_attrs.get(f"round-{r}")  # a retried trial's finished rounds
            if entry is None:
                if not trainer.affordable(r, label, epochs, _history(study), until):
                    trial.set_user_attr("stopped", "time")
                    if last is None:
                        raise optuna.TrialPruned("no time left for its first round")
                    return last
                entry = trainer.train(label, r, epochs)
                if math.isnan(entry["score"]):  # the training failed: the trial FAILs (Optuna's rule for NaN), never retried
                    trial.set_user_attr("failed_round", r)
                    return math.nan
                trial.set_user_attr(f"round-{r}", entry)
            last = entry["score"]
            step = cumulative_epochs(plan["epochs"], plan["eta"], r)
            if step not in frozen.intermediate_values:  # a retry inherits the values its trial reported
                trial.report(last, step)
            if r < plan["rounds"] - 1 and trial.should_prune():  # after the last round there is nothing left to stop
                raise optuna.TrialPruned(f"{label} after round {r}: not in the best 1/{plan['eta']} at its rung")
        return last

    return objective


def _open_trials(study) -> tuple[int, int]:
    """(waiting, running) trials of the study."""
    states = [t.state.name for t in study.get_trials(deepcopy=False)]
    return states.count("WAITING"), states.count("RUNNING")


def work(place: Place, trainer: Any = None, spec: TrainerSpec | None = None) -> int:
    """The worker loop: while the study has waiting or running trials, fail stale ones (their retries queued), take a
    waiting one, or wait for the others. ``trainer`` (built already) or ``spec`` (built at the first trial). Returns the
    number of trials this worker ran."""
    # deferred: see _storage
    import optuna

    study = load(place)
    if study is None:
        raise CompressError(f"no search {place.name} in {place.url}")
    box, objective, ran = [trainer] if trainer is not None else [], None, 0
    objective = _objective(study, box, spec)
    while True:
        optuna.storages.fail_stale_trials(study)
        waiting, running = _open_trials(study)
        if not waiting and not running:
            return ran
        if waiting:
            study.optimize(objective, n_trials=1, catch=())
            ran += 1
        else:
            time.sleep(POLL)


def _worker_process(place: Place, spec: TrainerSpec, level: int) -> None:
    """A spawned local worker: logging as its parent's, then :func:`work`."""
    logging.basicConfig(level=level, format=f"%(asctime)s worker {os.getpid()} %(name)s: %(message)s")
    work(place, spec=spec)


def start_workers(place: Place, spec: TrainerSpec, n: int) -> list:
    """``n`` local worker processes ("spawn": a fresh interpreter that imports only this module until it trains)."""
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_worker_process, args=(place, spec, logging.getLogger().getEffectiveLevel()),
                         name=f"compress-auto-worker-{i}") for i in range(n)]
    for p in procs:
        p.start()
    return procs


def work_with(place: Place, trainer: Any, spec: TrainerSpec, workers: int) -> int:
    """This process's worker loop beside ``workers - 1`` local worker processes; they are stopped if this one fails."""
    procs = start_workers(place, spec, workers - 1)
    ok = False
    try:
        ran = work(place, trainer=trainer, spec=spec)
        ok = True
    finally:
        for p in procs:
            if not ok:
                p.terminate()
            p.join()
    return ran


def run_halving(place: Place, plan: Plan, trainer: Any, spec: TrainerSpec, workers: int = 1, resume: bool = False) -> Halving:
    """The coordinator: the study prepared (see :func:`prepare`), worked until its queue is done, read back."""
    study = prepare(place, plan, resume)
    log.info("successive halving in study %s (%s): %d candidates, %d worker(s) here", place.name, place.url,
             len(plan.labels), workers)
    work_with(place, trainer, spec, workers)
    study.set_user_attr("phase", "measuring")
    return outcome(study)


def joinable(place: Place) -> dict | None:
    """The plan of a study at ``place`` that is under way (a second machine joins it), else None."""
    study = load(place)
    if study is None or "plan" not in study.user_attrs or study.user_attrs.get("phase") not in PHASES[:2]:
        return None
    return study.user_attrs["plan"]


def join(place: Place, train_key: str, trainer: Any, spec: TrainerSpec, workers: int = 1) -> int:
    """Work on a study another ``compress auto`` coordinates (no probe, no report); the number of trials run here."""
    plan = joinable(place)
    if plan is None:
        raise CompressError(f"no search under way in {place.url}")
    if plan["train_key"] != train_key:
        raise CompressError(f"the search in {place.url} trains its candidates with other settings; join it with the "
                            "coordinator's teacher, task, data and training options")
    log.info("joining search %s in %s as a worker", place.name, place.url)
    return work_with(place, trainer, spec, workers)


def finish(place: Place) -> None:
    """Mark the study finished: a later ``compress auto`` with the same --storage starts a new search, not joins it."""
    study = load(place)
    if study is not None:
        study.set_user_attr("phase", "finished")


def outcome(study) -> Halving:
    """The halving as the study holds it (every candidate trial; retries of a killed trial are merged by label)."""
    plan = study.user_attrs["plan"]
    trials = sorted((t for t in study.get_trials(deepcopy=False) if _label(t)), key=lambda t: t.number)
    by_round: dict[tuple[str, int], dict] = {}
    rows = []
    for t in trials:
        rounds = sorted((int(k.split("-")[1]), v) for k, v in t.user_attrs.items() if k.startswith("round-"))
        for r, entry in rounds:
            by_round[(entry["label"], r)] = entry  # a retry's (later) record wins
        rows.append({"number": t.number, "label": _label(t), "state": t.state.name, "rounds": len(rounds),
                     "scores": [e["score"] for _, e in rounds], "worker": t.user_attrs.get("worker"),
                     "retry_of": t.system_attrs.get("failed_trial"), "stopped": t.user_attrs.get("stopped")})
    entries = [e for e in by_round.values() if not math.isnan(e["score"])]
    survivors = []
    for r in range(plan["rounds"]):
        kept = tuple(label for label in plan["labels"] if (label, r) in by_round)
        if not kept:
            break
        survivors.append(kept)
    stopped = "all failed" if not entries else "time" if any(row["stopped"] == "time" for row in rows) else "rounds"
    return Halving(tuple(entries), tuple(survivors), stopped, tuple(rows))
