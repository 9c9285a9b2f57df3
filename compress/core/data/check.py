"""The command line's data check: a stage's task data read and checked before the stage's module is imported.

A stage reads every split of its task before it opens its model's weights or tokenizer, but only after its module
(torch, transformers: seconds, tens of them on a busy machine) is imported. :func:`checked_data` makes the same
reads first, from the options the command line parsed: it resolves the task as the stage does (a preset; a kind and
its ``--train-file``; a model folder's own task, read from its compression.json and config.json as JSON) and reads
each split with :mod:`compress.core.data.sources`, so a wrong ``--text-column``, a dev label the training data lacks
or a TSV named .csv is said in a blink, whatever the model's size. The splits it read are kept for the stage run
inside it (:func:`compress.core.data.sources.reading_once`): a big file is read once per command.

It reads only local data (files, ``--data-dir``): the hub's is the stage's to fetch. A task the JSON files do not
settle (a hub model's, a config.json this module cannot read as transformers would) is left to the stage, which keeps
every check of its own: the library refuses the same inputs in the same words.

Like the readers it calls, it imports no model library (torch, transformers); the command line loads it when a
stage's config is built (``Stage.data_checked``), so ``compress --help`` does not pay for the readers either.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

from compress.core.data.config import DataSource, TaskData, TaskOptions
from compress.core.data.resolve import resolve_task, task_of_folder
from compress.core.data.sources import load_dev_splits, load_split, load_train_split, read_task_data, reading_once
from compress.core.data.tasks import Task, is_kind
from compress.core.formats.layout import SENTENCE_MODULES_FILE
from compress.core.formats.records import read_compression
from compress.core.model.heads import HEADS

CONFIG_FILE = "config.json"
DEFAULT_LABELS = 2  # transformers' num_labels for a config.json that names none


@dataclass(frozen=True)
class Reads:
    """What a stage reads of its task's data before it opens its model, as its options say.

    A training stage's ``data`` is read as :func:`compress.core.data.sources.read_task_data` reads it (``test``: its
    test file too); an evaluation's ``split`` (dev, test, an exact split) from ``source``.
    """

    task: str | None  # --task: a preset or a kind; None: the model's own
    options: TaskOptions  # how a user's own task reads its files
    model: str | Path | None  # the model input whose folder may name the task
    train_file: str | None = None  # a kind's labels are read from it
    data: TaskData | None = None
    seed: int = 0
    test: bool = True
    source: DataSource | None = None
    split: str = "dev"

    @classmethod
    def training(cls, task: str | None, data: TaskData, model: str | Path | None, *, seed: int = 0,
                 test: bool = True) -> Reads:
        """A stage that reads its task's train and dev splits (and with ``test`` its --test-file)."""
        return cls(task or None, data.own, model, data.train_file, data=data, seed=seed, test=test)

    @classmethod
    def evaluation(cls, task: str | None, options: TaskOptions, source: DataSource, split: str,
                   model: str | Path | None) -> Reads:
        """A stage that scores ``split`` of its task, read from ``source`` (``compress eval``)."""
        return cls(task or None, options, model, source=source, split=split)

    @property
    def local(self) -> bool:
        """Whether the data is on this machine (files or a data folder), not the hub's."""
        if self.data is not None:
            return bool(self.data.train_file or self.data.data_dir)
        return self.source is not None and bool(self.source.data_file or self.source.data_dir)


@contextlib.contextmanager
def checked_data(reads: Reads | None) -> Iterator[None]:
    """Read and check the task data ``reads`` names, then run the block with those splits kept for the stage's reads.

    None: the stage reads no task data, and nothing is done. A data error is the stage's own CompressError, raised
    before the block runs.
    """
    if reads is None or not reads.local:
        yield
        return
    with reading_once():
        check_data(reads)
        yield


def check_data(reads: Reads) -> Task | None:
    """Read every split ``reads`` names, as the stage will; the task they were read for (None: left to the stage)."""
    if not reads.local:
        return None
    task = resolved_task(reads)
    if task is None:
        return None
    if reads.data is not None and reads.test:
        read_task_data(task, reads.data, reads.seed)
    elif reads.data is not None:
        load_train_split(task, reads.data, reads.seed)
        load_dev_splits(task, reads.data)
    else:
        for split in task.resolve_splits(reads.split):
            load_split(task, split.name, reads.source)
    return task


def resolved_task(reads: Reads) -> Task | None:
    """The task the stage will resolve (``compress.core.data.resolve.resolve_task``), or None when the model's own
    task is asked for and its JSON files do not settle it, or when nothing names a task (the stage says what to pass)."""
    if reads.task and not is_kind(reads.task):
        return resolve_task(reads.task, reads.options)  # a preset: the model has no say
    folder = FolderJson.at(reads.model)
    if folder is None:
        return None
    try:
        if task_of_folder(folder) is None and not (reads.task and reads.train_file):
            return None
        return resolve_task(reads.task, reads.options, train_file=reads.train_file, model=folder)
    except Unsettled:
        return None


# ---------------------------------------------------------------------------- a model folder's JSON


class Unsettled(Exception):
    """The folder's JSON files do not say for sure what transformers would read: the stage, which opens it, decides."""


@dataclass(frozen=True)
class FolderJson:
    """A model folder as ``resolve_task`` reads it (``path``, ``record``, ``head``, ``config``), from its JSON files
    alone: what :class:`compress.core.formats.folder.ModelFolder` gives it, short of transformers' config class."""

    path: Path
    record: dict[str, Any]  # compression.json ({} for a plain Hugging Face folder)

    @classmethod
    def at(cls, model: str | Path | None) -> FolderJson | None:
        """The folder at ``model``, its compression.json read and checked as opening it does; None for no local folder
        with a config.json (a hub id: its files are the stage's to fetch)."""
        if not model:
            return None
        path = Path(model).expanduser()
        if not path.is_dir() or not (path / CONFIG_FILE).is_file():
            return None
        return cls(path, read_compression(path))

    def __str__(self) -> str:  # messages name a folder by its path
        return str(self.path)

    @cached_property
    def raw(self) -> dict[str, Any]:
        try:
            raw = json.loads((self.path / CONFIG_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise Unsettled from None  # the stage's reader words what is wrong with it
        if not isinstance(raw, dict):
            raise Unsettled
        return raw

    @cached_property
    def head(self) -> str:
        """The head its architecture names (``BertForSequenceClassification``: sequence-classification), as
        ``ModelFolder.head`` reads it; ``base`` for a sentence-transformers folder and for none named."""
        if (self.path / SENTENCE_MODULES_FILE).is_file():
            return "base"
        archs = self.raw.get("architectures")
        if not archs:
            return "base"
        if not isinstance(archs, list) or not isinstance(archs[0], str):
            raise Unsettled
        by_length = sorted(HEADS.values(), key=lambda h: -len(h.class_suffix))
        return next((h.name for h in by_length if archs[0].endswith(h.class_suffix) and archs[0] != h.class_suffix), "base")

    @cached_property
    def config(self) -> SimpleNamespace:
        """``id2label``, ``num_labels`` and ``problem_type`` as transformers' config would hold them."""
        raw = self.raw
        labels, count, problem = raw.get("id2label"), raw.get("num_labels"), raw.get("problem_type")
        if labels is None:
            labels, count = {}, DEFAULT_LABELS if count is None else count
        if not isinstance(labels, dict) or not isinstance(problem, (str, type(None))):
            raise Unsettled
        count = len(labels) if count is None and labels else count
        if not isinstance(count, int) or isinstance(count, bool) or count < 1 or (labels and count != len(labels)):
            raise Unsettled  # transformers settles a disagreement its own way
        try:
            mapping = {int(k): v for k, v in labels.items()}
        except (TypeError, ValueError):
            raise Unsettled from None
        return SimpleNamespace(id2label=mapping, num_labels=count, problem_type=problem)
