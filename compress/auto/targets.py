"""What a ``compress auto`` search stands on: a task or a sentence-embedding check, one strategy object of two kinds.

Whether a search is over a task model or a sentence-embedding model is decided once, by :func:`target_kind` from the
options (``--embedding``); the search then calls its target and never asks again (a strategy, as Torch-Pruning's
``Importance`` classes are). Both kinds answer the same questions (:class:`Target`):

- what the search is called (``name``; ``key_name`` and ``training_key()`` in its keys) and which head the teacher is
  loaded with (``head``);
- the candidate shapes (``shapes``), how one round of a candidate is trained (``train``), the static candidate or none
  (``has_static``, ``train_static``);
- how a variant is quantized (``quantize_config``) and scored (``variant_score``), how a given folder is scored
  (``given_score``), and the report's words for the score (``score_description``, ``score_column``).

:class:`TaskTarget` distils with ``compress distill`` and scores on the task's dev set; :class:`EmbeddingTarget`
distils with ``distill-embedding`` on the search's sentences and scores by its embedding check
(:mod:`compress.auto.embedding`). A target holds the search's options (``cfg``), so its methods take only what varies.
"""

from __future__ import annotations

import logging
import math
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from compress.auto import embedding as auto_embedding
from compress.auto.config import TASK_LOSSES, AutoConfig
from compress.auto.embedding import EmbeddingCheck
from compress.core.data.resolve import resolve_task, task_of_model
from compress.core.data.sources import load_dev_splits
from compress.core.data.tasks import Task
from compress.core.errors import CompressError
from compress.core.formats.artifacts import load_tokenizer
from compress.core.formats.records import read_metrics
from compress.core.formats.runtime import load_model
from compress.core.formats.sentence import is_sentence_folder
from compress.core.model.shapes import Shape, resolve_shape
from compress.core.model.structure import config_sizes
from compress.distill.task import DistillConfig, distill
from compress.eval.evaluate import dev_evaluator
from compress.quantize.config import QuantizeConfig

log = logging.getLogger(__name__)


class Target(ABC):
    """The questions a search asks of what it stands on; made once (:func:`target_kind`), then only asked."""

    cfg: AutoConfig

    @classmethod
    @abstractmethod
    def resolve(cls, teacher_dir: Path, cfg: AutoConfig) -> "Target":
        """The coordinator's target, refused now (one line) when the teacher or the data cannot serve it."""

    @classmethod
    @abstractmethod
    def joined(cls, teacher_dir: Path, cfg: AutoConfig, work: Path) -> "Target":
        """The target as a worker process sees it: what its coordinator prepared in the work folder ``work``."""

    @abstractmethod
    def prepared(self, teacher_dir: Path, work: Path) -> "Target":
        """The target once the search's work folder is open (what it needs there made once; a resumed search keeps it)."""

    @property
    @abstractmethod
    def name(self) -> str:
        """The search's task in its report."""

    @property
    @abstractmethod
    def key_name(self) -> str:
        """The search's task in its keys (its study's name and what --reuse matches)."""

    @abstractmethod
    def training_key(self) -> list:
        """What a trained candidate depends on beyond the options every search shares (in the training key)."""

    @property
    @abstractmethod
    def head(self) -> str:
        """The head the teacher is loaded with (to cut the probe's random-weight students from)."""

    @abstractmethod
    def shapes(self, teacher_config, names: tuple[str, ...] = ()) -> list[Shape]:
        """The candidate shapes: ``names`` (``--shapes``), or the default grid around the teacher."""

    @abstractmethod
    def train(self, teacher_dir: Path, shape: Shape, out: Path, *, init: str, init_from: str | None,
              epochs: int) -> tuple[float, float]:
        """One round of a candidate into ``out``: (its score, NaN when unscored; the teacher's)."""

    @property
    @abstractmethod
    def has_static(self) -> bool:
        """Whether a static candidate (no shape to halve) is trained beside the halving."""

    @abstractmethod
    def train_static(self, teacher_dir: Path, out: Path) -> dict | None:
        """The static candidate's entry (trained once, beside the halving), or None when it cannot be made here."""

    @abstractmethod
    def quantize_config(self, backend: str, scheme: str, max_eval: int | None) -> QuantizeConfig:
        """How a candidate folder becomes an int8 variant (``max_eval``: a probe's few examples; None: a finalist)."""

    @abstractmethod
    def variant_score(self, path: Path, how, fp32: float) -> float:
        """An int8 or bf16 variant's own score (its fp32 candidate scored ``fp32``)."""

    @abstractmethod
    def given_score(self, folder: Path) -> float | None:
        """A compared model's score (the teacher, ``--compare``), or None when it cannot be scored."""

    @property
    @abstractmethod
    def score_description(self) -> str:
        """What every score is, in the report's words."""

    @property
    @abstractmethod
    def score_column(self) -> str:
        """The report tables' heading of the score column."""


def target_kind(cfg: AutoConfig) -> type[Target]:
    """The one place a task search is told from an embedding search."""
    return EmbeddingTarget if cfg.embedding else TaskTarget


# ---------------------------------------------------------------------------- a task


@dataclass(frozen=True)
class TaskTarget(Target):
    """A search for a task model: candidates distilled by ``compress distill``, every model scored on the task's dev set."""

    task: Task
    cfg: AutoConfig

    @classmethod
    def resolve(cls, teacher_dir: Path, cfg: AutoConfig) -> "TaskTarget":
        """The task resolved once (a preset, a kind and its training file, or the teacher's own), and refused now when
        its data cannot be read later: a user's task is trained on its files, never the hub."""
        if not cfg.task and is_sentence_folder(teacher_dir) and task_of_model(teacher_dir) is None:
            raise CompressError(f"{teacher_dir} is a sentence-embedding model (a sentence-transformers folder) with no task: "
                                "pass --embedding and --corpus FILE_OR_DIR[,...] to search its students, or --task to search "
                                "students of a task")
        task = resolve_task(cfg.task, cfg.data.own, train_file=cfg.data.train_file, model=teacher_dir)
        if task.user and not cfg.data.train_file:
            raise CompressError(f"{teacher_dir} was made for your own {task.kind} task {task.display}: pass its --train-file and "
                                "--dev-file, the data the candidates are distilled on")
        return cls(task, cfg)

    @classmethod
    def joined(cls, teacher_dir: Path, cfg: AutoConfig, work: Path) -> "TaskTarget":
        return cls.resolve(teacher_dir, cfg)

    def prepared(self, teacher_dir: Path, work: Path) -> "TaskTarget":
        return self

    @property
    def name(self) -> str:
        return self.task.name

    @property
    def key_name(self) -> str:
        # A preset given as --task is keyed by it as before (earlier searches stay reusable); any other task by its name.
        return self.cfg.task if self.cfg.task and not self.task.user else self.task.name

    def training_key(self) -> list:
        return []

    @property
    def head(self) -> str:
        return self.task.behaviour.head

    def shapes(self, teacher_config, names: tuple[str, ...] = ()) -> list[Shape]:
        return candidate_shapes(teacher_config, names)

    @property
    def task_option(self) -> str:
        """The --task a stage the search runs is given: a preset's name, or a user's task's kind (its labels and
        columns then come from the folder, the files from the same data options)."""
        return self.task.kind if self.task.user else self.task.name

    def train(self, teacher_dir: Path, shape: Shape, out: Path, *, init: str, init_from: str | None,
              epochs: int) -> tuple[float, float]:
        """One round by ``compress distill``: (its dev score, NaN when unscored; the teacher's)."""
        cfg = self.cfg
        dcfg = DistillConfig(task=self.task_option, student=f"{shape.layers}L-{shape.hidden}-{shape.ffn}", heads=shape.heads,
                             init=init, init_from=init_from, losses=cfg.losses, extra_data=cfg.extra_data, data=cfg.data,
                             train=replace(cfg.train, epochs=epochs))
        distill(teacher_dir, out, dcfg, overwrite=True, task=self.task)
        retention = next(r for r in read_metrics(out) if r.get("kind") == "retention")
        score = float(retention["student"]) if retention["student"] is not None else math.nan
        return score, retention["teacher"]

    @property
    def has_static(self) -> bool:
        return False  # a task model's students all have a shape

    def train_static(self, teacher_dir: Path, out: Path) -> dict | None:
        return None

    def quantize_config(self, backend: str, scheme: str, max_eval: int | None) -> QuantizeConfig:
        """Scored on the task's dev split (a probe's on ``max_eval`` examples, unguarded); a finalist's refused beyond
        --max-drop."""
        data = replace(self.cfg.data, max_eval_examples=max_eval or self.cfg.data.max_eval_examples)
        return QuantizeConfig(backend=backend, scheme=scheme, task=self.task_option, data=data,
                              max_drop=self.cfg.max_drop if max_eval is None else None)

    def variant_score(self, path: Path, how, fp32: float) -> float:
        """A bf16 export scored here; an int8 variant's dev score as quantize measured it (its fp32's when unrecorded)."""
        if how[0] == "export":
            return self.dev_score(path)
        evals = [r for r in read_metrics(path) if r.get("kind") == "eval"]
        return float(evals[-1]["metrics"][self.task.primary_metric]) if evals else fp32

    def dev_score(self, path: Path) -> float:
        """``path``'s primary dev metric as the runtime runs it (a bf16 folder in bf16), on the search's dev split."""
        task, data = self.task, self.cfg.data
        model = load_model(path, head=task.behaviour.head)
        max_length = data.resolved_max_length(task, config_sizes(model.config).max_positions)
        dev = load_dev_splits(task, data)
        scores = dev_evaluator(task, load_tokenizer(path), dev, max_length, batch_size=data.eval_batch_size)(model)
        return float(scores[task.primary_metric])

    def given_score(self, folder: Path) -> float | None:
        """Its dev score as its records hold it."""
        metric = self.task.primary_metric
        evals = [r for r in read_metrics(folder) if r.get("kind") == "eval" and r.get("task") == self.task.name
                 and r.get("split") in ("dev", "dev_matched") and metric in r.get("metrics", {})]
        return evals[-1]["metrics"][metric] if evals else None

    @property
    def score_description(self) -> str:
        return f"{self.task.display} dev {self.task.primary_metric}"

    @property
    def score_column(self) -> str:
        return "dev"


def candidate_shapes(teacher_config, names: tuple[str, ...] = ()) -> list[Shape]:
    """A task search's shapes: ``names``, or depths 1..teacher x widths teacher, 3/4, 1/2, 1/3 (heads of the teacher's
    width) x FFN the teacher's ratio to its width, or half of it (at one depth, halving the FFN removes a third of a BERT
    layer's matmul FLOPs but keeps every attention head: 3L-384-768 costs what 2L-384 does)."""
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


# ---------------------------------------------------------------------------- a sentence-embedding model


@dataclass(frozen=True)
class EmbeddingTarget(Target):
    """A search for a sentence-embedding student (``--embedding``): candidates distilled on the search's sentences by
    ``distill-embedding``, a static student beside them, every model scored by the embedding check."""

    cfg: AutoConfig
    check: EmbeddingCheck | None = None  # the sentences and the score, once prepared in the work folder

    @classmethod
    def resolve(cls, teacher_dir: Path, cfg: AutoConfig) -> "EmbeddingTarget":
        """Unprepared: its sentences and score are made in the work folder once it is open (:meth:`prepared`)."""
        auto_embedding.check_teacher(teacher_dir)
        return cls(cfg)

    @classmethod
    def joined(cls, teacher_dir: Path, cfg: AutoConfig, work: Path) -> "EmbeddingTarget":
        return cls(cfg, auto_embedding.load_check(work))

    def prepared(self, teacher_dir: Path, work: Path) -> "EmbeddingTarget":
        """The sentences split once into held-out and training ones, the score fixed and the teacher's measured."""
        cfg = self.cfg
        return replace(self, check=auto_embedding.prepare(teacher_dir, cfg.sentences, cfg.data.data_dir, cfg.train.seed, work))

    @property
    def name(self) -> str:
        return "embedding"  # where a task's name goes

    @property
    def key_name(self) -> str:
        return self.name

    def training_key(self) -> list:
        return [asdict(self.cfg.sentences)]

    @property
    def head(self) -> str:
        return "base"

    def shapes(self, teacher_config, names: tuple[str, ...] = ()) -> list[Shape]:
        return auto_embedding.candidate_shapes(teacher_config, names)

    def train(self, teacher_dir: Path, shape: Shape, out: Path, *, init: str, init_from: str | None,
              epochs: int) -> tuple[float, float]:
        """One round by ``distill-embedding`` (``init_from`` is refused with --embedding): (its score; the teacher's)."""
        cfg = self.cfg
        score = auto_embedding.train_candidate(teacher_dir, self.check, shape, out, init=init, epochs=epochs,
                                               losses=auto_embedding.embedding_losses(cfg.losses, TASK_LOSSES),
                                               train=cfg.train, max_length=cfg.data.max_length)
        return score, self.check.teacher

    @property
    def has_static(self) -> bool:
        return self.cfg.sentences.static  # unless --no-static

    def train_static(self, teacher_dir: Path, out: Path) -> dict | None:
        """The static (model2vec) student; None where model2vec is not installed."""
        return auto_embedding.train_static(teacher_dir, self.check, self.cfg.train, out)

    def quantize_config(self, backend: str, scheme: str, max_eval: int | None) -> QuantizeConfig:
        """Calibrated on the search's training sentences; scored by the search itself."""
        return auto_embedding.quantize_config(self.check, backend, scheme, self.cfg.train.seed, probe=max_eval is not None)

    def variant_score(self, path: Path, how, fp32: float) -> float:
        """The search's check, refused beyond --max-drop."""
        return auto_embedding.variant_score(path, self.check, fp32, self.cfg.max_drop)

    def given_score(self, folder: Path) -> float | None:
        """The search's own check (None when it cannot be scored so, e.g. embeddings of another width against the
        teacher's)."""
        try:
            return auto_embedding.score_folder(folder, self.check)
        except CompressError as err:
            log.warning("%s is shown unscored: %s", folder, err)
            return None

    @property
    def score_description(self) -> str:
        return self.check.description

    @property
    def score_column(self) -> str:
        return "score"
