"""``compress auto``'s step 3: the shortlist trained by successive halving, and the finalists it leaves.

The halving itself runs as an Optuna study (:mod:`compress.auto.engine`); this module gives it its plan and its
:class:`Trainer` (one candidate's round, trained by the search target, and the price of the next), reads the finalists
back, and adds the candidates that do not take part in it: the static student (an embedding search's, no shape to halve)
and models earlier searches (``--reuse``) trained further.
"""

from __future__ import annotations

import logging
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from compress.auto.config import AutoConfig
from compress.auto.embedding import STATIC_LABEL
from compress.auto.engine import Halving, Place, Plan, TrainerSpec, run_halving
from compress.auto.probe import encoder_params
from compress.auto.search import round_seconds
from compress.auto.state import Earlier, SearchRun, SearchState, adopt, best_round, copied, latest
from compress.auto.targets import Target, target_kind
from compress.core.checkpoints import work_dir_for
from compress.core.config import from_dict, to_dict
from compress.core.errors import CompressError
from compress.core.formats.artifacts import load_config
from compress.core.model.shapes import Shape
from compress.students.slices import fits_inside

log = logging.getLogger(__name__)


def halve(run: SearchRun, shortlist: list[Shape], earlier: Earlier, *, training_deadline: float, place: Place,
          out: Path) -> tuple[Halving, list[str]]:
    """Successive halving over the shortlist as an Optuna study (:mod:`compress.auto.engine`; each round's training only
    where it ends before ``training_deadline``, monotonic seconds); the halving record and the finalists (those that
    reached the deepest round, and a runner-up when only one did; capped, see below). The state's trained entries are
    rebuilt from the study."""
    search, cfg = run.search, run.cfg
    done = [t for t in search.state["trained"].values() if Path(t["dir"], "config.json").is_file()]  # --resume: never again
    plan = Plan(labels=tuple(s.label for s in shortlist), shapes={s.label: _fields(s) for s in shortlist},
                train_key=search.state["train_key"], rounds=cfg.rounds, eta=cfg.eta, epochs=cfg.train.epochs,
                deadline=time.time() + training_deadline - time.monotonic(), reused=(*earlier.trained.values(), *done))
    trainer = Trainer.of(run.teacher_dir, run.target, search.work, plan.shapes, plan.reused)
    halving = run_halving(place, plan, trainer, spec(run.teacher_dir, out, cfg), cfg.workers, cfg.resume)
    search.state["trained"].update({f"{e['label']}/{e['round']}": e for e in halving.entries})
    search.save()
    scores = {k: t["score"] for k, t in latest(halving.entries).items()}
    # Asynchronous halving lets the first shape and ties go on: at most as many finalists as synchronous halving keeps
    # after the rounds reached (two at least), the best first, so the final measurement costs what it did
    keep = max(2, math.ceil(len(shortlist) / cfg.eta ** (len(halving.survivors) - 1))) if halving.survivors else 0
    finalists = sorted(with_runner_up(halving.survivors, scores), key=lambda c: -scores[c])[:keep] if keep else []
    if not finalists:
        raise CompressError("every candidate's training failed; see the log above")
    return halving, finalists


def _fields(shape: Shape) -> dict:
    return {k: v for k, v in shape.__dict__.items() if k != "origin"}


def spec(teacher_dir: Path, out: Path, cfg: AutoConfig) -> TrainerSpec:
    """How a spawned worker process builds its trainer (plain data: it imports this module only when it trains)."""
    return TrainerSpec("compress.auto.halving:candidate_trainer", {"teacher": str(teacher_dir), "out": str(out), "cfg": to_dict(cfg)})


def candidate_trainer(teacher: str, out: str, cfg: dict, attrs: dict) -> "Trainer":
    """A worker process's trainer, from its :class:`TrainerSpec` and the study's plan (``attrs["plan"]``)."""
    config = from_dict(AutoConfig, cfg, validate=False)
    teacher_dir, work = Path(teacher), work_dir_for(Path(out))
    plan = attrs["plan"]
    target = target_kind(config).joined(teacher_dir, config, work)
    return Trainer.of(teacher_dir, target, work, plan["shapes"], plan["reused"])


@dataclass(frozen=True)
class Trainer:
    """Trains one candidate's round for the halving's workers and prices the next; writes no shared state (the
    study records each round)."""

    teacher_dir: Path
    target: Target
    work: Path
    shapes: dict[str, Shape]
    reused: dict[tuple[str, int, int], dict]  # (label, round, epochs) -> an entry trained before: --reuse or --resume

    @classmethod
    def of(cls, teacher_dir: Path, target: Target, work: Path, shapes: dict, reused) -> "Trainer":
        return cls(teacher_dir, target, work, {k: Shape(**v) for k, v in shapes.items()},
                   {(e["label"], e["round"], e["epochs"]): e for e in reused})

    def train(self, label: str, round_: int, epochs: int) -> dict:
        entry = self.reused.get((label, round_, epochs))
        if entry is None:
            return self._trained(self.shapes[label], round_, epochs)
        here = self.work / "candidates" / f"{label}-r{round_}"
        return entry if Path(entry["dir"]).resolve() == here.resolve() else copied(entry, self.work)

    def affordable(self, round_: int, label: str, epochs: int, history: list[dict], until: float) -> bool:
        trained = SearchState(self.work, {"trained": dict(enumerate(history))})
        return affordable(round_, [(label, epochs)], trained, Earlier(None, self.reused), until, self.shapes)

    def _trained(self, shape: Shape, round_: int, epochs: int) -> dict:
        """Distil ``shape`` for ``epochs`` (round 0 from the teacher; later rounds continue the previous round's
        student); its entry (score NaN when the training failed)."""
        out = self.work / "candidates" / f"{shape.label}-r{round_}"
        if out.exists():  # a worker killed while writing it: this run starts the round afresh
            shutil.rmtree(out)
        started = time.monotonic()
        init, init_from = _start(self.teacher_dir, shape, round_, self.target.cfg, self.work)
        try:
            score, teacher_score = self.target.train(self.teacher_dir, shape, out, init=init, init_from=init_from,
                                                     epochs=epochs)
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


def affordable(round_: int, plan: list[tuple[str, int]], search: SearchState, earlier: Earlier, until: float,
               shapes: dict[str, Shape]) -> bool:
    """Whether a round's trainings end before ``until`` (monotonic seconds): each candidate priced by its seconds per
    epoch so far (here or in an earlier search), one never trained by its parameters at the others' rate, one an
    earlier search trained alike at nothing (it is copied)."""
    history = [(t["label"], t["epochs"], t["seconds"])
               for t in sorted([*earlier.trained.values(), *search.state["trained"].values()], key=lambda t: t["round"])]
    todo = [(label, units) for label, units in plan if (label, round_, units) not in earlier.trained]
    left = until - time.monotonic()
    need = round_seconds(todo, history, size=lambda label: encoder_params(shapes[label]) if label in shapes else 0.0)
    if left > 0 and need > left:
        log.info("round %d: %s would need about %.0f s of training, %.0f s are left", round_, plan[-1][0], need, left)
    return left > 0 and need <= left


def with_runner_up(survivors: tuple[tuple[str, ...], ...], scores: dict[str, float]) -> list[str]:
    """The last round's survivors, and when a round cut short by time left one, the best other survivor of the
    round before by its latest score (its int8 may meet a budget the one's misses)."""
    finalists = list(survivors[-1])
    if len(finalists) == 1 and len(survivors) >= 2:
        others = sorted((c for c in survivors[-2] if c not in finalists), key=lambda c: -scores[c])
        finalists += others[:1]
    return finalists


# ---------------------------------------------------------------------------- candidates beside the halving


def static_candidate(run: SearchRun) -> list[str]:
    """The search's static (model2vec) student, trained once beside the halving (it has no shape to halve; a resumed
    search keeps it): its label among the finalists, or none."""
    if not run.target.has_static:
        return []
    search = run.search
    key = f"{STATIC_LABEL}/0"
    entry = search.state["trained"].get(key)
    if entry is None or not Path(entry["dir"], "config.json").is_file():
        entry = run.target.train_static(run.teacher_dir, search.work / "candidates" / STATIC_LABEL)
        if entry is None:  # model2vec is not installed (said in the log)
            return []
        search.state["trained"][key] = entry
        search.save()
    return [] if math.isnan(entry["score"]) else [STATIC_LABEL]


def earlier_finalists(earlier: Earlier, finalists: list[str], predicted: dict, search: SearchState, most: int = 2) -> list[str]:
    """Models earlier searches (``--reuse``) trained, of shapes predicted to fit this budget, that score above a
    finalist (whose int8 may yet miss the budget): up to ``most`` of them, best first, join the finalists (copied
    in), so a second budget never ends with a worse model than one already trained for it."""
    here = best_round(search.state["trained"].values())  # what each finalist will be made from
    weakest = min((here[c]["score"] for c in finalists), default=-math.inf)
    fitting = [e for e in earlier.trained.values() if e["label"] not in finalists and predicted.get(e["label"], {}).get("variants")]
    better = sorted((e for e in best_round(fitting).values() if e["score"] > weakest), key=lambda e: -e["score"])[:most]
    for entry in better:
        adopt(entry, search)
    return [e["label"] for e in better]
