"""compress auto's successive halving on a real PostgreSQL server, started on 127.0.0.1 by this module (pgserver's
build of PostgreSQL, from PyPI): two worker processes share one study, one is killed in the middle of a trial, and the
search ends with every candidate trained once, the killed one retried, and the single process's halving and choice.

The candidates' training is scripted (:class:`ScriptedTrainer`: each round's score from :data:`SCORES` after a pause,
as a seeded training gives the same score in any process); everything else is the search's own code path: the study,
its queue and plan (:func:`~compress.auto.engine.prepare`), spawned workers
(:func:`~compress.auto.engine.start_workers`) with heartbeats and the retry of stale trials, Optuna's successive-halving
pruner, the study read back (:func:`~compress.auto.engine.outcome`) and the choice
(:func:`~compress.auto.search.choose`).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import optuna
import pytest

from compress.auto.engine import Halving, Place, Plan, TrainerSpec, load, outcome, prepare, start_workers, work
from compress.auto.search import choose, parse_budgets
from compress.core.model.shapes import Shape

pytestmark = pytest.mark.e2e  # a server and worker processes of their own

SHAPES = (Shape(1, 32, 2, 64), Shape(2, 32, 2, 64), Shape(1, 48, 3, 96), Shape(2, 48, 3, 96), Shape(1, 64, 4, 128),
          Shape(2, 64, 4, 128))
LABELS = tuple(s.label for s in SHAPES)  # the queue's order

# Dev score after round 0 and round 1 per candidate. With eta 2, judged at rung 0 in queue order, a candidate goes on
# when it is in the best max(1, n // 2) of the n judged so far: 70 (the first), then 50, 60, 40, 55 fall out and 58
# goes on (third of six, the bar is the third best, 58). Were the killed first candidate's 70 counted twice, the bar
# would be the third of seven, 60, and 58 would fall out.
SCORES = {LABELS[0]: (70.0, 74.0), LABELS[1]: (50.0, 52.0), LABELS[2]: (60.0, 63.0), LABELS[3]: (40.0, 45.0),
          LABELS[4]: (55.0, 57.0), LABELS[5]: (58.0, 66.0)}


def _plan(labels=LABELS) -> Plan:
    shapes = {s.label: {k: v for k, v in s.__dict__.items() if k != "origin"} for s in SHAPES}
    return Plan(labels=tuple(labels), shapes=shapes, train_key="test", rounds=2, eta=2, epochs=1,
                deadline=time.time() + 3600)


# ---------------------------------------------------------------------------- the server


@pytest.fixture(scope="module")
def postgres():
    """A PostgreSQL server of this module's own on 127.0.0.1, as every machine of a search reaches it: the URL of its
    database (``postgresql+psycopg2://postgres@127.0.0.1:PORT/postgres``; trust authentication, no Unix socket), where
    each test keeps its studies under names of its own. Stopped and removed at the end."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs, imported by pgserver, warns when XDG_RUNTIME_DIR is unset
        import pgserver
        from pgserver import utils
        from pgserver._commands import POSTGRES_BIN_PATH
    # Not under pytest's base folder: it is 0700, and another pytest session may set it back while the server runs.
    root = Path(tempfile.mkdtemp(prefix="compress-postgres-"))
    user = None
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root: as pgserver.get_server does, a user of its own runs it
        user = "pgserver"
        entry = utils.ensure_user_exists(user)
        os.chown(root, entry.pw_uid, entry.pw_gid)
        utils.ensure_prefix_permissions(root)
        utils.ensure_prefix_permissions(POSTGRES_BIN_PATH)
        utils.ensure_folder_permissions(POSTGRES_BIN_PATH, 0o055)  # group and others read and run the binaries
        utils.ensure_folder_permissions(POSTGRES_BIN_PATH.parent / "lib", 0o044)
    data, log = root / "data", root / "server.log"
    try:
        pgserver.initdb(["--auth=trust", "--encoding=utf8", "--no-sync", "-U", "postgres"], pgdata=data, user=user,
                        timeout=120)
        # get_server listens on a Unix socket alone; a search's machines reach the server over TCP, so start it by hand.
        # A port found free may be taken before the server binds it: try another.
        for attempt in range(3):
            port = utils.find_suitable_port("127.0.0.1")
            options = f"-h 127.0.0.1 -p {port} -k '' -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
            try:
                pgserver.pg_ctl(["-w", "-t", "60", "-o", options, "-l", str(log), "start"], pgdata=data, user=user,
                                timeout=90)
                break
            except subprocess.CalledProcessError:
                if attempt == 2:
                    raise
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/postgres"
    finally:
        if (data / "postmaster.pid").exists():
            pgserver.pg_ctl(["-w", "-m", "immediate", "stop"], pgdata=data, user=user, timeout=60)
        shutil.rmtree(root, ignore_errors=True)


def test_the_server_is_postgresql_on_127_0_0_1(postgres):
    import sqlalchemy

    engine = sqlalchemy.create_engine(postgres)
    with engine.connect() as connection:
        version = connection.execute(sqlalchemy.text("SHOW server_version_num")).scalar()
        address = connection.execute(sqlalchemy.text("SELECT host(inet_server_addr())")).scalar()
    engine.dispose()
    assert engine.dialect.name == "postgresql" and engine.dialect.driver == "psycopg2"
    assert int(version) >= 150000 and address == "127.0.0.1"


# ---------------------------------------------------------------------------- a scripted trainer


def _journal(path: Path) -> list[tuple[str, str, int, int]]:
    """The journal's lines as (event, label, round, pid)."""
    if not path.exists():
        return []
    rows = [line.split() for line in path.read_text().splitlines()]
    return [(event, label, int(round_), int(pid)) for event, label, round_, pid in rows]


@dataclass(frozen=True)
class ScriptedTrainer:
    """The search's trainer without the training: a round's score from :data:`SCORES` after ``pace`` seconds. Every
    attempt is written to ``journal`` ("start"/"end", label, round, pid). With ``hang`` (the first label, a round), the
    first attempt at it never ends (its worker is killed in it), and the other candidates' first rounds wait until it
    has begun, so rung 0 judges them in the order a single process does."""

    journal: str
    pace: float = 0.0
    hang: tuple[str, int] | None = None

    def train(self, label: str, round_: int, epochs: int) -> dict:
        path = Path(self.journal)
        with path.open("a") as f:  # one short line, appended: whole even with two writers
            f.write(f"start {label} {round_} {os.getpid()}\n")
        if self.hang is not None:
            first, hung = self.hang
            began = [e for e in _journal(path) if e[:3] == ("start", first, hung)]
            if (label, round_) == (first, hung) and len(began) == 1:
                time.sleep(300)  # killed in here
            if label != first and round_ == 0:
                end = time.monotonic() + 120
                while not any(e[:3] == ("start", first, hung) for e in _journal(path)):
                    if time.monotonic() > end:
                        raise RuntimeError(f"{first} never began round {hung}")
                    time.sleep(0.05)
        time.sleep(self.pace)
        with path.open("a") as f:
            f.write(f"end {label} {round_} {os.getpid()}\n")
        return {"label": label, "round": round_, "epochs": epochs, "score": SCORES[label][round_],
                "dir": f"candidates/{label}-r{round_}", "seconds": self.pace}

    def affordable(self, round_: int, label: str, epochs: int, history: list, until: float) -> bool:
        return True


def scripted_trainer(journal: str, pace: float, hang: list | None, attrs: dict) -> ScriptedTrainer:
    """A spawned worker's trainer (its :class:`TrainerSpec` factory)."""
    return ScriptedTrainer(journal, pace, tuple(hang) if hang else None)


def _chosen(halving: Halving) -> str:
    """The model the search chooses among the candidates of the last round reached, by their last score."""
    scores = {e["label"]: e["score"] for e in sorted(halving.entries, key=lambda e: e["round"])}
    results = [{"name": label, "accuracy": scores[label], "measurement": {"size_bytes": 5e6, "points": {}}}
               for label in halving.survivors[-1]]
    return choose(results, parse_budgets("size<=20MB"))["name"]


# ---------------------------------------------------------------------------- the search on PostgreSQL


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")  # the test asks for trials by hand, as workers would
@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_a_retried_candidate_counts_once_at_its_rung(kind, request, tmp_path):
    url = request.getfixturevalue("postgres") if kind == "postgresql" else f"sqlite:///{tmp_path / 'search.db'}"
    place = Place(url, "rungs", heartbeat=1, grace=1)
    study = prepare(place, _plan(LABELS[:4]), resume=False)
    first = study.ask()  # the first shape, taken by a worker that dies in its second round
    first.report(70.0, 1)
    assert not first.should_prune()  # the first at rung 0 goes on
    study._storage.record_heartbeat(first._trial_id)  # its last heartbeat
    time.sleep(2.0)  # older than the grace period now
    optuna.storages.fail_stale_trials(study)  # another worker's check: failed, and queued again
    trials = study.get_trials(deepcopy=False)
    (retry,) = [t for t in trials if t.system_attrs.get("failed_trial") == first.number]
    assert trials[first.number].state.name == "FAIL" and retry.state.name == "WAITING"
    assert retry.system_attrs["completed_rung_0"] == 70.0 and retry.intermediate_values == {1: 70.0}
    # Judged next at rung 0 (the retry is queued behind them): 30 and 20 fall out; 50 is second of [70, 30, 20, 50] and
    # goes on. Counting the failed trial and its retry as two (70, 70, 30, 20, 50), the bar would be 70.
    verdicts = []
    for value in (30.0, 20.0, 50.0):
        trial = study.ask()
        trial.report(value, 1)
        verdicts.append(trial.should_prune())
    assert verdicts == [True, True, False]


def test_two_workers_one_killed_mid_trial_lose_nothing_and_choose_as_one_process(postgres, tmp_path):
    """Two spawned workers share a study on PostgreSQL; the one that takes the first (best) candidate is killed with
    SIGKILL in its second round. The other fails the stale trial once its heartbeat is 3 s old, runs its retry (round 0
    inherited, round 1 trained again) and the rest of the queue. Every candidate ends once, every round is trained to
    its end once, and the halving (who reached each round, with what score) and the choice are a single process's.

    Asynchronous halving judges a candidate against those that reached its rung before it, so in general which of the
    others go on depends on the order workers finish them; the best candidate at every rung goes on in any order and is
    chosen either way. Here the order is pinned (the others wait for the first's second round, then one worker judges
    them in queue order), so the whole halving must match: the killed candidate counted twice would drop the sixth."""
    alone_place = Place(postgres, "alone")
    prepare(alone_place, _plan(), resume=False)
    assert work(alone_place, trainer=ScriptedTrainer(str(tmp_path / "alone.log"))) == len(LABELS)
    alone = outcome(load(alone_place))
    assert alone.survivors == (LABELS, (LABELS[0], LABELS[5])) and _chosen(alone) == LABELS[0]

    place = Place(postgres, "two", heartbeat=1, grace=3)
    journal = tmp_path / "two.log"
    prepare(place, _plan(), resume=False)
    spec = TrainerSpec("tests.auto.test_postgres:scripted_trainer",
                       {"journal": str(journal), "pace": 1.0, "hang": [LABELS[0], 1]})
    workers = start_workers(place, spec, 2)
    try:
        end = time.monotonic() + 60
        while not (began := [e[3] for e in _journal(journal) if e[:3] == ("start", LABELS[0], 1)]):
            assert time.monotonic() < end, "no worker began the first candidate's second round in 60 s"
            time.sleep(0.1)
        (victim,) = [p for p in workers if p.pid == began[0]]
        (survivor,) = [p for p in workers if p is not victim]
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(timeout=30)
        survivor.join(timeout=90)
        assert victim.exitcode == -signal.SIGKILL and survivor.exitcode == 0
    finally:
        for p in workers:
            if p.is_alive():
                p.kill()
                p.join()

    study = load(place)
    trials = [t for t in study.get_trials(deepcopy=False) if (t.system_attrs.get("fixed_params") or {}).get("shape")]
    (killed,) = [t for t in trials if t.state.name == "FAIL"]
    (retry,) = [t for t in trials if t.system_attrs.get("failed_trial") == killed.number]
    assert killed.user_attrs["worker"].endswith(f":{victim.pid}") and killed.params == {"shape": LABELS[0]}
    assert retry.state.name == "COMPLETE" and retry.user_attrs["worker"].endswith(f":{survivor.pid}")
    assert retry.params == {"shape": LABELS[0]} and retry.value == SCORES[LABELS[0]][1]
    # No candidate lost or doubled: each ends once (COMPLETE or PRUNED), nothing waits or runs.
    ended = Counter(t.system_attrs["fixed_params"]["shape"] for t in trials if t.state.name in ("COMPLETE", "PRUNED"))
    assert ended == Counter(LABELS) and len(trials) == len(LABELS) + 1
    # Every round trained to its end once, the rounds the single process trained; only the killed attempt began twice.
    lines = _journal(journal)
    trained_alone = Counter((e["label"], e["round"]) for e in alone.entries)
    assert Counter((label, r) for e, label, r, _ in lines if e == "end") == trained_alone
    began = Counter((label, r) for e, label, r, _ in lines if e == "start")
    assert began.pop((LABELS[0], 1)) == 2 and set(began.values()) == {1}
    assert [pid for e, label, r, pid in lines if (e, label, r) == ("start", LABELS[0], 1)] == [victim.pid, survivor.pid]
    # The single process's halving and choice.
    two = outcome(study)
    assert two.survivors == alone.survivors and two.stopped == alone.stopped == "rounds"
    assert sorted((e["label"], e["round"], e["score"]) for e in two.entries) == sorted(
        (e["label"], e["round"], e["score"]) for e in alone.entries)
    assert _chosen(two) == _chosen(alone) == LABELS[0]
