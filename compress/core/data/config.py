"""The options of a task's data (:class:`TaskData`, :class:`TaskOptions`) and where it comes from (:class:`DataSource`).

Kept apart from the readers (:mod:`compress.core.data.sources` and the modules it calls, which import pyarrow
and datasets) so that a command's flags and its config checks cost no heavy import.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from compress.core.config import flat_keywords, option
from compress.core.errors import CompressError
from compress.core.data.tasks import Task


def check_max_length(max_length: int, model_max: int | None) -> None:
    """Refuse a ``--max-length`` under 8 tokens, or above the model's ``model_max`` positions (None: unknown yet)."""
    if max_length < 8:
        raise CompressError(f"--max-length {max_length} is too short; use at least 8 tokens")
    if model_max is not None and max_length > model_max:
        raise CompressError(
            f"--max-length {max_length} is above the model's maximum of {model_max} positions; "
            f"use --max-length {model_max} or less"
        )


@dataclass(frozen=True)
class DataSource:
    """Where a task's data comes from. With no fields set: the Hugging Face hub."""

    data_dir: str | None = None  # GLUE root, one task's folder, or a folder of SQuAD JSON files
    data_file: str | None = None  # one csv/tsv/json/jsonl/parquet/SQuAD file for the split asked for
    columns: tuple[tuple[str, str], ...] = field(default=())  # (task field, column in data_file)

    @property
    def description(self) -> str:
        if self.data_file:
            return self.data_file
        if self.data_dir:
            return self.data_dir
        return "the Hugging Face hub"


# Sequences per forward pass when scoring, for `compress eval` and every stage's dev scores alike:
# dynamic int8 scores move with batch composition (about 3 in 100 QNLI dev predictions changed
# between batch 1, 32 and 64), so one default keeps a stage's recorded score and a later eval comparable.
EVAL_BATCH_SIZE = 32


@dataclass(frozen=True)
class TaskOptions:
    """How a user's own task is read from its files (``--task text-classification`` and the other kinds).

    Read once, by ``compress.core.data.resolve``: a model made for the task records them, so later
    stages need them only where a new file's columns differ.
    """

    text_column: str | None = option(None, "your own task: the column holding the text (default: text; the word list "
                                     "of token-classification: tokens)", metavar="COLUMN")
    text_pair_column: str | None = option(None, "your own task: the column holding a pair's second text", metavar="COLUMN")
    label_column: str | None = option(None, "your own task: the column holding the label (default: label; the tag list "
                                      "of token-classification: tags)", metavar="COLUMN")
    labels: tuple[str, ...] = option((), "your own task: label names in output order (default: the training file's, "
                                     "sorted; tags: O first)", metavar="NAME[,...]")
    label_sep: str | None = option(None, "multi-label: the separator between labels in one cell (default: a JSON list)",
                                   metavar="SEP")
    threshold: float | None = option(None, "multi-label: predict a label when its sigmoid is at least this (default: 0.5)")
    task_name: str | None = option(None, "your own task: its name in records and reports (default: the training "
                                   "file's folder, or its name when the folder says train/data)", metavar="NAME")

    def validate(self) -> None:
        if self.threshold is not None and not 0 < self.threshold < 1:
            raise CompressError(f"--threshold must be between 0 and 1, got {self.threshold}")
        if self.label_sep is not None and not self.label_sep.strip():
            raise CompressError("--label-sep must be a visible separator such as ';' or '|'")
        twice = sorted({x for x in self.labels if self.labels.count(x) > 1})
        if twice:
            raise CompressError(f"--labels names {', '.join(twice)} twice; each label names one output")

    @property
    def given(self) -> bool:
        """Whether any option was set (a preset task takes none of them)."""
        return any(getattr(self, f.name) not in (None, ()) for f in fields(self))


@flat_keywords
@dataclass(frozen=True)
class TaskData:
    """Where a training stage's train and dev data come from, and how they are cut."""

    data_dir: str | None = option(None, "local GLUE root / task folder / SQuAD folder (default: the hub)", metavar="DIR")
    train_file: str | None = option(None, "training data: a csv/tsv/json/jsonl/parquet/CoNLL/SQuAD file or a datasets "
                                    "save_to_disk folder", metavar="FILE")
    dev_file: str | None = option(None, "dev data as one file (with --train-file): scores every epoch, picks the best",
                                  metavar="FILE")
    test_file: str | None = option(None, "test data as one file: the kept model is scored on it at the end", metavar="FILE")
    columns: tuple[str, ...] = option((), "FIELD=COLUMN pairs mapping file columns to task fields", metavar="FIELD=COL[,...]")
    own: TaskOptions = field(default_factory=TaskOptions)
    max_train_examples: int | None = option(None, "train on a seeded random subsample of N examples (say so when reporting)")
    max_eval_examples: int | None = option(None, "evaluate on the first N dev examples")
    max_length: int | None = option(None, "tokens per sequence (default: 128 for GLUE, 384 for SQuAD)")
    doc_stride: int = option(128, "SQuAD: overlap between windows of a long context")
    eval_batch_size: int = option(EVAL_BATCH_SIZE, "sequences per forward pass when evaluating")

    def validate(self) -> None:
        if self.data_dir and (self.train_file or self.dev_file):
            raise CompressError("pass either --data-dir or --train-file/--dev-file, not both")
        if bool(self.train_file) != bool(self.dev_file):
            raise CompressError("--train-file and --dev-file go together; pass both")
        if self.columns and not self.train_file:
            raise CompressError("--columns maps the columns of --train-file/--dev-file; pass those too")
        if self.test_file and self.data_dir:
            raise CompressError("--test-file goes with --train-file/--dev-file; with --data-dir use compress eval --split test")
        for pair in self.columns:
            if "=" not in pair:
                raise CompressError(f"--columns expects FIELD=COLUMN pairs, got {pair!r}")
        for name in ("max_train_examples", "max_eval_examples"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise CompressError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
        if self.max_length is not None:  # 0 is a length to refuse, not "the default"
            check_max_length(self.max_length, None)
        if self.eval_batch_size < 1:
            raise CompressError(f"--eval-batch-size must be at least 1, got {self.eval_batch_size}")

    def sources(self) -> tuple["DataSource", "DataSource"]:
        """(train source, dev source)."""
        columns = tuple(tuple(p.split("=", 1)) for p in self.columns)
        if self.train_file:
            return DataSource(data_file=self.train_file, columns=columns), DataSource(data_file=self.dev_file, columns=columns)
        source = DataSource(data_dir=self.data_dir)
        return source, source

    def test_source(self) -> "DataSource | None":
        """The --test-file source, or None."""
        if not self.test_file:
            return None
        return DataSource(data_file=self.test_file, columns=self.sources()[1].columns)

    def describe(self, split: str = "train") -> str:
        """Where ``split``'s data comes from, as records name it: its file, the data folder, or the hub."""
        return self.data_dir or {"dev": self.dev_file, "test": self.test_file}.get(split) or self.train_file or "the Hugging Face hub"

    def resolved_max_length(self, task: Task, model_max: int) -> int:
        length = self.max_length if self.max_length is not None else min(task.behaviour.max_length, model_max)
        check_max_length(length, model_max)
        return length
