"""compress auto's successive halving on Optuna: the pruner's rungs, one or two workers, a worker killed mid-trial,
a second process joining a search under way, bad --storage / --workers refused. A tiny teacher and a fake timer
(tests/auto/test_auto.py's)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import optuna
import pytest

from compress.auto import run as auto_run
from compress.auto import targets as auto_targets
from compress.auto.config import AutoConfig
from compress.auto.engine import (Place, Plan, TrainerSpec, cumulative_epochs, load, prepare, start_workers, study_place,
                                  work)
from compress.auto.run import auto, summarize
from compress.auto.targets import target_kind
from compress.core.config import to_dict
from compress.core.errors import CompressError
from compress.core.model.shapes import Shape
from compress.core.checkpoints import work_dir_for
from compress.auto.search import parse_budgets, points
from tests.auto.test_auto import _cfg, fake_timer, teacher  # noqa: F401  (teacher: the module's tiny fine-tuned teacher)

BUDGET = "p50<=2.2ms@b1,s32"
SHAPES = (Shape(1, 32, 2, 64), Shape(1, 48, 3, 96), Shape(2, 32, 2, 64))


def _finished(study) -> dict[str, list[str]]:
    """Per shape: the states of its candidate trials that finished (COMPLETE or PRUNED)."""
    done: dict[str, list[str]] = {}
    for t in study.get_trials(deepcopy=False):
        label = (t.system_attrs.get("fixed_params") or {}).get("shape")
        if label and t.state.name in ("COMPLETE", "PRUNED"):
            done.setdefault(label, []).append(t.state.name)
    return done


def _study_of(out: Path):
    url = f"sqlite:///{work_dir_for(out).resolve() / 'search.db'}"
    (name,) = optuna.get_all_study_names(url)
    return optuna.load_study(study_name=name, storage=url)


def _plan(labels, deadline: float = 3600.0) -> Plan:
    shapes = {s.label: {k: v for k, v in s.__dict__.items() if k != "origin"} for s in SHAPES}
    return Plan(labels=tuple(labels), shapes=shapes, train_key="test", rounds=2, eta=2, epochs=1,
                deadline=time.time() + deadline)


def _spec(teacher_dir: Path, out: Path, cfg: AutoConfig) -> TrainerSpec:
    return TrainerSpec("compress.auto.halving:candidate_trainer", {"teacher": str(teacher_dir), "out": str(out), "cfg": to_dict(cfg)})


def _wait(condition, seconds: float, what: str):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        found = condition()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"waited {seconds:.0f} s for {what}")


def test_cumulative_epochs_cross_exactly_one_rung_per_round():
    # epochs 1, eta 2: after rounds 0, 1, 2 a candidate has trained 1, 1+2 = 3, 3+4 = 7 epochs; rungs sit at 1, 2, 4, 8
    assert [cumulative_epochs(1, 2, r) for r in range(3)] == [1, 3, 7]
    # epochs 2, eta 3: 2, 2+6 = 8, 8+18 = 26; rungs at 2, 6, 18, 54
    assert [cumulative_epochs(2, 3, r) for r in range(3)] == [2, 8, 26]
    for epochs, eta in ((1, 2), (2, 3), (3, 2), (1, 4)):
        for r in range(5):
            step = cumulative_epochs(epochs, eta, r)
            assert epochs * eta**r <= step < epochs * eta ** (r + 1)  # past rung r, short of rung r+1
    # Optuna's pruner records exactly rungs 0..r after round r (a first trial is always promoted)
    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.SuccessiveHalvingPruner(
        min_resource=1, reduction_factor=2, min_early_stopping_rate=0))
    trial = study.ask()
    for r in range(3):
        trial.report(0.5, cumulative_epochs(1, 2, r))
        assert not trial.should_prune()
        rungs = {k for k in study._storage.get_trial(trial._trial_id).system_attrs if k.startswith("completed_rung_")}
        assert rungs == {f"completed_rung_{i}" for i in range(r + 1)}
    # a second trial below the first at rung 0 (2 competing: the best 2 // 2 = 1 go on) is pruned after round 0
    second = study.ask()
    second.report(0.4, cumulative_epochs(1, 2, 0))
    assert second.should_prune()


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")  # the test asks for a trial by hand, as a dead worker did
def test_resume_reopens_the_study_and_retries_what_a_dead_run_left_running(tmp_path):
    place = Place(f"sqlite:///{tmp_path / 'search.db'}", "resume")
    labels = [s.label for s in SHAPES]
    study = prepare(place, _plan(labels), resume=False)
    taken = study.ask()  # a worker of the run that died took the first shape
    taken.set_user_attr("round-0", {"label": labels[0], "round": 0, "epochs": 1, "score": 50.0, "dir": "x"})
    again = prepare(place, _plan(labels), resume=True)
    trials = again.get_trials(deepcopy=False)
    assert trials[taken.number].state.name == "FAIL"
    (retry,) = [t for t in trials if t.system_attrs.get("failed_trial") == taken.number]
    # queued again with the rounds it had finished; every shape queued once, none twice
    assert retry.state.name == "WAITING" and retry.user_attrs["round-0"]["score"] == 50.0
    assert sorted(t.system_attrs["fixed_params"]["shape"] for t in trials if t.state.name == "WAITING") == sorted(labels)
    # without --resume (or with other rounds) the search starts anew
    fresh = prepare(place, Plan(**{**_plan(labels).__dict__, "rounds": 3}), resume=True)
    assert [t.state.name for t in fresh.get_trials(deepcopy=False)] == ["WAITING"] * 3


@pytest.mark.slow
def test_one_and_two_workers_choose_the_same_shape(teacher, tmp_path):  # noqa: F811
    teacher_dir, data = teacher
    chosen, trials = {}, {}
    for workers in (1, 2):
        out = auto(teacher_dir, tmp_path / f"w{workers}", _cfg(data, BUDGET, workers=workers), timer=fake_timer())
        chosen[workers] = json.loads((out / "search" / "search.json").read_text())["chosen"]["name"]
        study = _study_of(out)
        labels = study.user_attrs["plan"]["labels"]
        assert len(labels) == 3 and {k: len(v) for k, v in _finished(study).items()} == {label: 1 for label in labels}
        trials[workers] = {t.user_attrs.get("worker") for t in study.get_trials(deepcopy=False) if t.user_attrs.get("worker")}
        assert study.user_attrs["phase"] == "finished"
        report = (out / "search" / "report.md").read_text()
        assert "## Successive halving (one Optuna trial per candidate)" in report
    assert chosen[1] == chosen[2]
    assert len(trials[1]) == 1 and len(trials[2]) == 2  # host:pid of the worker that trained each candidate


@pytest.mark.e2e
def test_a_worker_killed_mid_trial_loses_only_that_trial(teacher, tmp_path):  # noqa: F811
    teacher_dir, data = teacher
    cfg = _cfg(data, BUDGET)
    out = tmp_path / "out"
    work_dir = work_dir_for(out)
    work_dir.mkdir(parents=True)
    place = Place(f"sqlite:///{work_dir.resolve() / 'search.db'}", "killed", heartbeat=1, grace=3)
    labels = [s.label for s in SHAPES]
    prepare(place, _plan(labels), resume=False)  # the coordinator's steps: the study and its queue
    (worker,) = start_workers(place, _spec(teacher_dir, out, cfg), 1)

    def running():
        study = load(place)
        return next((t for t in study.get_trials(deepcopy=False) if t.state.name == "RUNNING"
                     and str(t.user_attrs.get("worker", "")).endswith(f":{worker.pid}")), None)

    killed = _wait(running, 120, "the worker process to take a trial")
    time.sleep(2)  # into its training
    os.kill(worker.pid, signal.SIGKILL)
    worker.join()
    label = killed.system_attrs["fixed_params"]["shape"]
    partial = work_dir / "candidates" / f"{label}-r0"
    partial.mkdir(parents=True, exist_ok=True)
    (partial / "half-written").write_text("killed while saving")  # as a kill during saving leaves it

    ran = work(place, spec=_spec(teacher_dir, out, cfg))  # a live worker: fails the stale trial, runs its retry
    study = load(place)
    by_number = {t.number: t for t in study.get_trials(deepcopy=False)}
    assert by_number[killed.number].state.name == "FAIL"
    retry = [t for t in by_number.values() if t.system_attrs.get("failed_trial") == killed.number]
    assert len(retry) == 1 and retry[0].state.name in ("COMPLETE", "PRUNED") and ran >= 1
    assert {k: len(v) for k, v in _finished(study).items()} == {label: 1 for label in labels}
    for folder in (work_dir / "candidates").iterdir():  # every candidate folder whole, none half-written
        assert (folder / "config.json").is_file() and not (folder / "half-written").exists(), folder


@pytest.mark.e2e
def test_a_second_process_with_storage_joins_the_search_and_only_trains(teacher, tmp_path):  # noqa: F811
    # On SQLite; the same search on a real PostgreSQL server, started by the test itself: tests/auto/test_postgres.py.
    teacher_dir, data = teacher
    url = f"sqlite:///{(tmp_path / 'shared.db').resolve()}"
    cfg = _cfg(data, BUDGET, storage=url)
    out = tmp_path / "out"
    # The coordinator's steps: the study named by this search's key, its plan and queue; one of its workers running.
    target = target_kind(cfg).resolve(teacher_dir, cfg)
    budgets = parse_budgets(BUDGET)
    keys = auto_run._keys(teacher_dir, target, budgets, sorted(points(budgets)))
    place = study_place(url, work_dir_for(out), keys[0])
    plan = _plan([s.label for s in SHAPES])
    prepare(place, Plan(**{**plan.__dict__, "train_key": keys[2]}), resume=False)
    (coordinator_worker,) = start_workers(place, _spec(teacher_dir, out, cfg), 1)
    calls: list = []
    try:
        joined = auto(teacher_dir, out, cfg, timer=fake_timer(calls=calls))  # the second process: no probe, no report
    finally:
        coordinator_worker.join(timeout=300)
    assert joined == out and calls == [] and not out.exists()
    assert not (work_dir_for(out) / "probe").exists() and not (work_dir_for(out) / "state.json").exists()
    study = load(place)
    assert {k: len(v) for k, v in _finished(study).items()} == {s.label: 1 for s in SHAPES}
    assert any(t.user_attrs.get("worker", "").endswith(f":{os.getpid()}") for t in study.get_trials(deepcopy=False))
    assert "worked on the search" in summarize(out, cfg, {})[0]
    # Other training settings: refused rather than trained differently.
    prepare(place, Plan(**{**plan.__dict__, "train_key": keys[2]}), resume=False)
    with pytest.raises(CompressError, match="other settings"):
        auto(teacher_dir, out, _cfg(data, BUDGET, storage=url, lr=5e-4), timer=fake_timer())


def test_bad_storage_or_workers_are_refused_before_any_training(teacher, tmp_path, monkeypatch):  # noqa: F811
    teacher_dir, data = teacher
    trained, calls = [], []
    monkeypatch.setattr(auto_targets, "distill", lambda *a, **k: trained.append(a))
    for url, piece in (("not a url", "is not a database URL"), ("nosuchdb://host/db", "is not a database URL"),
                       (f"sqlite:///{tmp_path}/no/such/dir/x.db", "cannot open it")):
        with pytest.raises(CompressError, match=f"--storage .*{piece}") as caught:
            cfg = AutoConfig(**{**_cfg(data, BUDGET).__dict__, "storage": url})  # checked by auto(), first thing
            auto(teacher_dir, tmp_path / "out", cfg, timer=fake_timer(calls=calls))
        assert "\n" not in str(caught.value)
    assert trained == [] and calls == []
    with pytest.raises(CompressError, match="--workers must be at least 1"):
        _cfg(data, BUDGET, workers=0)
