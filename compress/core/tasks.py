"""The task registry: every GLUE task, the AX diagnostic set and SQuAD v1.1 / v2.0.

A :class:`Task` holds facts (text fields, label names in the official order, metrics,
splits and where each split lives in every supported layout); reading files is
``compress.core.data``'s job. Everything that depends on the *kind* of task (which
model head and outputs, which label type, which losses, how long a default input is,
how a prediction is written) lives on its :class:`TaskKind`, ``task.behaviour``, so
no other module branches on the kind.

Label names follow the order of the Hugging Face ``nyu-mll/glue`` dataset, which is
the order of the label ids every fine-tuned hub checkpoint uses. Legacy GLUE
processors list MNLI as (contradiction, entailment, neutral): never map by id
between the two, always through names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from compress.core.config import Choices
from compress.core.errors import CompressError

CLASSIFICATION = "classification"
REGRESSION = "regression"
SPAN = "span"  # extractive question answering (SQuAD)
UNLABELLED = -1  # the label of an unlabelled row (the hub's GLUE test splits)


@dataclass(frozen=True)
class TaskKind:
    """What depends on the kind of task; one record per kind (``KINDS``)."""

    name: str  # CLASSIFICATION, REGRESSION or SPAN
    head: str  # the model head: "sequence-classification" or "question-answering"
    outputs: tuple[str, ...]  # the head's output names, in order: ("logits",) or ("start_logits", "end_logits")
    problem_type: str | None  # transformers' config.problem_type for the head (None: not a classifier head)
    label_dtype: str | None  # the label column's dtype ("int64", "float32"); None: answers, not labels
    max_length: int  # default input length in tokens (SQuAD windows are longer)
    per_token: bool  # the outputs score token positions (batch, seq), so padding must leave them
    soft_loss: str  # loss on the teacher's outputs: "kl" (T²-scaled), "span_kl" (over unpadded positions) or "mse"
    hard_loss: str  # loss on gold labels: "cross_entropy", "mse" or "span_cross_entropy"
    prediction: str  # what one prediction is: "label" (a name), "score" (a float) or "answer" (a text span)

    @property
    def label_type(self) -> type | None:
        """The Python type of one gold label (int, float); None when examples carry answers, not labels."""
        return {"int64": int, "float32": float}.get(self.label_dtype)

    @property
    def unlabelled(self) -> int | float | None:
        """The label of a row that has none (test splits), as the hub writes it: -1 or -1.0."""
        return None if self.label_type is None else self.label_type(UNLABELLED)


KINDS: dict[str, TaskKind] = {
    CLASSIFICATION: TaskKind(CLASSIFICATION, "sequence-classification", ("logits",), "single_label_classification",
                             "int64", 128, False, "kl", "cross_entropy", "label"),
    REGRESSION: TaskKind(REGRESSION, "sequence-classification", ("logits",), "regression",
                         "float32", 128, False, "mse", "mse", "score"),
    SPAN: TaskKind(SPAN, "question-answering", ("start_logits", "end_logits"), None,
                   None, 384, True, "span_kl", "span_cross_entropy", "answer"),
}


@dataclass(frozen=True)
class TsvSpec:
    """How one split is laid out in the GLUE download script's TSV files.

    Columns are header names (matched after stripping a BOM; ``a|b`` accepts either)
    or, for files without a header, 0-based positions. ``label`` is None for test
    files; on a split that is not ``labelled`` a missing label column is allowed.
    """

    files: tuple[str, ...]  # candidate file names inside the task folder, first found wins
    texts: tuple[str | int, ...]  # one column per text field, in Task.text_fields order
    label: str | int | None = None
    header: bool = True
    label_encoding: str = "index"  # "index": 0..K-1 as digits; "names": label names; "float"


@dataclass(frozen=True)
class Split:
    """One split of a task and its name in each layout."""

    name: str  # the toolkit's name: train, dev, test, dev_matched, ...
    hub: str  # split name in the hub dataset / parquet files
    tsv: TsvSpec | None = None
    squad_files: tuple[str, ...] = ()  # official SQuAD JSON file names
    labelled: bool = True
    submission_file: str | None = None  # GLUE server file written from this split


@dataclass(frozen=True)
class Task:
    """Facts about one benchmark task."""

    name: str  # canonical registry name, e.g. "sst2"
    display: str  # as papers write it, e.g. "SST-2"
    kind: str  # CLASSIFICATION, REGRESSION or SPAN
    text_fields: tuple[str, ...]  # dataset columns, in model-input order
    label_names: tuple[str, ...]  # official order; empty for regression and span tasks
    metrics: tuple[str, ...]  # metric names reported by compress.eval.metrics / compress.eval.squad
    primary_metric: str  # the one number a leaderboard shows
    splits: tuple[Split, ...]
    hub_path: str  # Hugging Face dataset repository
    hub_config: str | None  # its configuration name
    folders: tuple[str, ...]  # folder names in a local data directory
    label_range: tuple[float, float] | None = None  # valid targets of a regression task
    submission_labels: str = "index"  # GLUE server labels: "index" (0/1), "names", "float"
    prediction_source: str | None = None  # task whose model predicts this one (AX <- MNLI)
    unanswerable: bool = False  # some questions have no answer (SQuAD v2.0): null odds, HasAns/NoAns metrics
    aliases: tuple[str, ...] = field(default=())

    @property
    def behaviour(self) -> TaskKind:
        """Head, outputs, label type, losses and prediction format of this task's kind."""
        return KINDS[self.kind]

    @property
    def num_labels(self) -> int:
        """Output width of a classification head (1 for regression)."""
        return 1 if self.behaviour.problem_type == "regression" else len(self.label_names)

    @property
    def labels_description(self) -> str:
        """The labels as a listing shows them: names, a score range, or an answer span."""
        if self.label_names:
            return ", ".join(self.label_names)
        if self.label_range:
            return f"score {self.label_range[0]:g}-{self.label_range[1]:g}"
        return "answer span" + (" or no answer" if self.unanswerable else "")

    @property
    def id2label(self) -> dict[int, str] | None:
        """Label names by output index, for a classifier's config; None when outputs are not labels."""
        return dict(enumerate(self.label_names)) if self.label_names else None

    @property
    def is_pair(self) -> bool:
        return len(self.text_fields) == 2

    def split(self, name: str) -> Split:
        """The split called ``name``; ``dev``/``test`` also find MNLI's matched one."""
        for s in self.splits:
            if s.name == name:
                return s
        raise CompressError(
            f"task {self.name} has no split {name!r}; valid: {', '.join(s.name for s in self.splits)}"
        )

    def resolve_splits(self, name: str) -> tuple[Split, ...]:
        """Expand ``dev``/``test`` to every matching split (MNLI has matched and mismatched)."""
        exact = [s for s in self.splits if s.name == name]
        if exact:
            return tuple(exact)
        grouped = tuple(s for s in self.splits if s.name.startswith(name + "_"))
        if grouped:
            return grouped
        return (self.split(name),)  # raises with the valid names


def _glue(name, display, fields, labels, metrics, primary, splits, folders, **kw) -> Task:
    return Task(
        name=name,
        display=display,
        kind=kw.pop("kind", CLASSIFICATION),
        text_fields=fields,
        label_names=labels,
        metrics=metrics,
        primary_metric=primary,
        splits=splits,
        hub_path="nyu-mll/glue",
        hub_config=kw.pop("hub_config", name),
        folders=folders,
        **kw,
    )


def _tsv_split(name, hub, files, texts, label, sub=None, header=True, enc="index", labelled=True):
    return Split(
        name=name,
        hub=hub,
        tsv=TsvSpec(files=files, texts=texts, label=label, header=header, label_encoding=enc),
        labelled=labelled,
        submission_file=sub,
    )


ACC = ("accuracy",)
ACC_F1 = ("f1", "accuracy")


def _standard(task_file, texts, label, enc="index", test_texts=None):
    """train/dev/test for the many tasks whose TSVs share one header layout."""
    return (
        _tsv_split("train", "train", ("train.tsv",), texts, label, enc=enc),
        _tsv_split("dev", "validation", ("dev.tsv",), texts, label, enc=enc),
        _tsv_split(
            "test", "test", ("test.tsv",), test_texts or texts, None, sub=task_file, labelled=False
        ),
    )


_TASKS: tuple[Task, ...] = (
    _glue(
        "cola", "CoLA", ("sentence",), ("unacceptable", "acceptable"),
        ("matthews_correlation", "accuracy"), "matthews_correlation",
        (
            # The GLUE release of CoLA has no header: source, label, original label, sentence.
            _tsv_split("train", "train", ("train.tsv",), (3,), 1, header=False),
            _tsv_split("dev", "validation", ("dev.tsv",), (3,), 1, header=False),
            _tsv_split("test", "test", ("test.tsv",), ("sentence",), None, sub="CoLA.tsv", labelled=False),
        ),
        ("CoLA", "cola"),
    ),
    _glue(
        "sst2", "SST-2", ("sentence",), ("negative", "positive"), ACC, "accuracy",
        _standard("SST-2.tsv", ("sentence",), "label"),
        ("SST-2", "sst2", "SST2"), aliases=("sst",),
    ),
    _glue(
        "mrpc", "MRPC", ("sentence1", "sentence2"), ("not_equivalent", "equivalent"),
        ACC_F1, "f1",
        _standard("MRPC.tsv", ("#1 String", "#2 String"), "Quality"),
        ("MRPC", "mrpc"),
    ),
    _glue(
        "stsb", "STS-B", ("sentence1", "sentence2"), (), ("pearson", "spearmanr"), "pearson",
        _standard("STS-B.tsv", ("sentence1", "sentence2"), "score", enc="float"),
        ("STS-B", "stsb", "STSB", "STS"), kind=REGRESSION, label_range=(0.0, 5.0),
        submission_labels="float", aliases=("sts-b", "sts"),
    ),
    _glue(
        "qqp", "QQP", ("question1", "question2"), ("not_duplicate", "duplicate"),
        ACC_F1, "accuracy",
        _standard("QQP.tsv", ("question1", "question2"), "is_duplicate"),
        ("QQP", "qqp"),
    ),
    _glue(
        "mnli", "MNLI", ("premise", "hypothesis"), ("entailment", "neutral", "contradiction"),
        ACC, "accuracy",
        (
            _tsv_split("train", "train", ("train.tsv",), ("sentence1", "sentence2"), "gold_label", enc="names"),
            _tsv_split("dev_matched", "validation_matched", ("dev_matched.tsv",),
                       ("sentence1", "sentence2"), "gold_label", enc="names"),
            _tsv_split("dev_mismatched", "validation_mismatched", ("dev_mismatched.tsv",),
                       ("sentence1", "sentence2"), "gold_label", enc="names"),
            _tsv_split("test_matched", "test_matched", ("test_matched.tsv",),
                       ("sentence1", "sentence2"), None, sub="MNLI-m.tsv", labelled=False),
            _tsv_split("test_mismatched", "test_mismatched", ("test_mismatched.tsv",),
                       ("sentence1", "sentence2"), None, sub="MNLI-mm.tsv", labelled=False),
        ),
        ("MNLI", "mnli"), submission_labels="names", aliases=("mnli-m",),
    ),
    _glue(
        "qnli", "QNLI", ("question", "sentence"), ("entailment", "not_entailment"), ACC, "accuracy",
        _standard("QNLI.tsv", ("question", "sentence"), "label", enc="names"),
        ("QNLI", "qnli"), submission_labels="names",
    ),
    _glue(
        "rte", "RTE", ("sentence1", "sentence2"), ("entailment", "not_entailment"), ACC, "accuracy",
        _standard("RTE.tsv", ("sentence1", "sentence2"), "label", enc="names"),
        ("RTE", "rte"), submission_labels="names",
    ),
    _glue(
        "wnli", "WNLI", ("sentence1", "sentence2"), ("not_entailment", "entailment"), ACC, "accuracy",
        _standard("WNLI.tsv", ("sentence1", "sentence2"), "label"),
        ("WNLI", "wnli"),
    ),
    _glue(
        "ax", "AX", ("premise", "hypothesis"), ("entailment", "neutral", "contradiction"),
        ("matthews_correlation",), "matthews_correlation",
        (
            # diagnostic-full.tsv carries gold labels (and linguistic categories); the
            # GLUE server's diagnostic.tsv does not. Both are the "test" split, in one order.
            Split(
                name="test", hub="test", labelled=False, submission_file="AX.tsv",
                tsv=TsvSpec(files=("diagnostic-full.tsv", "diagnostic.tsv", "AX.tsv"),
                            texts=("sentence1|Premise", "sentence2|Hypothesis"),
                            label="Label", label_encoding="names"),
            ),
        ),
        ("AX", "diagnostic", "ax"), submission_labels="names", prediction_source="mnli",
        aliases=("diagnostic",),
    ),
    Task(
        name="squad", display="SQuAD v1.1", kind=SPAN,
        text_fields=("question", "context"), label_names=(),
        metrics=("exact_match", "f1"), primary_metric="f1",
        splits=(
            Split("train", "train", squad_files=("train-v1.1.json",)),
            Split("dev", "validation", squad_files=("dev-v1.1.json",)),
        ),
        hub_path="rajpurkar/squad", hub_config=None,
        folders=("squad", "SQuAD", "squad_v1", "squad-v1.1", "."),
        aliases=("squad1", "squad_v1", "squad-v1.1", "squad1.1"),
    ),
    Task(
        name="squad_v2", display="SQuAD v2.0", kind=SPAN,
        text_fields=("question", "context"), label_names=(), unanswerable=True,
        metrics=("exact_match", "f1", "HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1",
                 "best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh"),
        primary_metric="f1",
        splits=(
            Split("train", "train", squad_files=("train-v2.0.json",)),
            Split("dev", "validation", squad_files=("dev-v2.0.json",)),
        ),
        hub_path="rajpurkar/squad_v2", hub_config=None,
        folders=("squad_v2", "squad2", "SQuAD2", "squad-v2.0", "squad", "SQuAD", "."),
        aliases=("squad2", "squad-v2", "squad2.0", "squad-v2.0"),
    ),
)

GLUE_TASKS = tuple(t.name for t in _TASKS if t.hub_path == "nyu-mll/glue")
TASKS: dict[str, Task] = {}
_ALIASES: dict[str, str] = {}


def _key(name: str) -> str:
    # "SST-2", "sst_2" and "sst2" are one task; "squad_v2" keeps its version digits.
    return re.sub(r"[\s_\-.]", "", name.lower())


def register_task(task: Task) -> Task:
    """Add a task (e.g. a user's own classification data) to the registry."""
    if task.name in TASKS:
        raise ValueError(f"task {task.name!r} is registered twice")
    TASKS[task.name] = task
    for alias in (task.name, task.display, *task.aliases):
        _ALIASES.setdefault(_key(alias), task.name)
    return task


for _t in _TASKS:
    register_task(_t)


def task_choices() -> Choices:
    """The registered task names as a flag's choices; any alias get_task accepts is accepted too."""
    return Choices(TASKS, accept=lambda name: _key(name) in _ALIASES)


def get_task(name: str) -> Task:
    """Look a task up by name or alias (case and punctuation insensitive)."""
    key = _key(name)
    if key in _ALIASES:
        return TASKS[_ALIASES[key]]
    raise CompressError(f"unknown task {name!r}; valid: {', '.join(TASKS)}")
