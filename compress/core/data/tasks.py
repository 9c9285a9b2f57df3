"""Tasks as data: the benchmark presets (every GLUE task, AX, SQuAD v1.1 / v2.0) and a user's own.

A :class:`Task` holds facts (text fields, label names in their order, metrics, splits and,
for a preset, where each split lives in every supported layout); reading files is
``compress.core.data.sources``'s job. Everything that depends on the *kind* of task (which
model head and outputs, which label type, which losses, how long a default input is,
how a prediction is written, how an example is laid out, what a user's task of the kind
reads and reports) lives on its :class:`TaskKind`, ``task.behaviour``, so no other module
compares kinds: it asks the record (``behaviour.tagged_words``, ``behaviour.named_labels``,
...) or keys its own table by one of the record's fields (``prediction``, ``layout``).

A user's own task (:func:`user_task`) is one of the kinds in ``USER_KINDS``
(``text-classification``, ``multi-label``, ``regression``, ``token-classification``) with
label names read from the user's training file; it is not registered, it travels with
the models made for it (:meth:`Task.to_record` in compression.json, ``id2label`` and
``problem_type`` in config.json; ``compress.core.data.resolve`` reads it back).

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
from compress.core.model.heads import HEADS

CLASSIFICATION = "text-classification"  # one label of K per text or pair (softmax)
MULTI_LABEL = "multi-label"  # any subset of K labels per text (sigmoid per label)
REGRESSION = "regression"  # one number per text or pair
TOKEN = "token-classification"  # one BIO tag per word (named entities)
SPAN = "span"  # extractive question answering (SQuAD)
USER_KINDS = (CLASSIFICATION, MULTI_LABEL, REGRESSION, TOKEN)  # the kinds a user's own files can make
UNLABELLED = -1  # the label of an unlabelled row (the hub's GLUE test splits)
IGNORED = -100  # a token position without a target (word pieces after a word's first, special tokens)


@dataclass(frozen=True)
class TaskKind:
    """What depends on the kind of task; one record per kind (``KINDS``), so no other module compares kinds."""

    name: str  # one of KINDS
    head: str  # the model head (compress.core.model.heads): "sequence-classification", "token-classification", ...
    problem_type: str | None  # transformers' config.problem_type for the head (None: not a sequence classifier)
    label_dtype: str | None  # dtype of one label value ("int64", "float32"); None: answers, not labels
    label_list: bool  # a label is a list: a multi-hot row of K floats (multi-label), one tag id per word (tokens)
    max_length: int  # default input length in tokens (SQuAD windows are longer)
    soft_loss: str  # loss on the teacher's outputs: "kl" (T²-scaled), "sigmoid_kl", "token_kl", "span_kl" or "mse"
    hard_loss: str  # loss on gold labels: "cross_entropy", "bce", "token_cross_entropy", "mse" or "span_cross_entropy"
    prediction: str  # what one prediction (and one gold label) is: "label" (a name), "labels" (names), "tags" (one
    #                  per word), "score" (a float) or "answer" (a text span); what evaluation and label parsing key on
    layout: str  # how an example is laid out in a file and tokenised: "sentences" (a text or a pair, a label),
    #              "words" (a word list, an IOB2 tag per word) or "squad" (question, context, answers)
    fields: tuple[str, ...] = ()  # a user's task's text fields: a text, then a pair's second; () : no user task
    columns: tuple[tuple[str, str], ...] = ()  # (field or "label", file column) a user's task reads by default
    metrics: tuple[str, ...] = ()  # a user's task's metrics (token tasks add f1 per entity type)
    primary_metric: str = ""  # the one of them a user's task reports first
    min_labels: int = 0  # label names a user's task needs at least; 0: its labels are not names (a score, an answer)
    sample_labels: tuple[str, ...] = ()  # label names that make a sample task of the kind (its columns, a draft)
    label_help: str = ""  # the label in a row of a user's file, as ``compress tasks`` lists it
    not_augmentable: str = ""  # why augmented and transfer-text rows cannot be made for it ("": they can)

    @property
    def outputs(self) -> tuple[str, ...]:
        """The head's output names, in order: ("logits",) or ("start_logits", "end_logits")."""
        return HEADS[self.head].outputs

    @property
    def per_token(self) -> bool:
        """The head's outputs score token positions ((batch, seq) or (batch, seq, K)), so padding must leave them."""
        return HEADS[self.head].per_token

    @property
    def label_type(self) -> type | None:
        """The Python type of one gold label value (int, float); None when examples carry answers, not labels."""
        return {"int64": int, "float32": float}.get(self.label_dtype)

    @property
    def unlabelled(self) -> int | float | None:
        """The label of a row that has none (test splits), as the hub writes it: -1 or -1.0 (lists: every value -1)."""
        return None if self.label_type is None else self.label_type(UNLABELLED)

    @property
    def ignored_label(self) -> int | float:
        """The label of a row without a gold target: NaN for a float label (it poisons any MSE that would read it),
        else IGNORED (-100, skipped by cross-entropy)."""
        return float("nan") if self.label_type is float else IGNORED

    @property
    def multi_hot(self) -> bool:
        """A label is a row of K floats, one per label name (multi-label); its unlabelled and ignored labels are rows."""
        return self.label_list and self.label_type is float

    @property
    def tagged_words(self) -> bool:
        """An example is a word list with an IOB2 tag per word: CoNLL files, tags with O first, entity metrics."""
        return self.layout == "words"

    @property
    def named_labels(self) -> bool:
        """A user's task of this kind has label names, read from its training file (and checked against a model's)."""
        return self.min_labels > 0


KINDS: dict[str, TaskKind] = {
    CLASSIFICATION: TaskKind(
        CLASSIFICATION, "sequence-classification", "single_label_classification", "int64", False, 128,
        "kl", "cross_entropy", "label", "sentences", fields=("text", "text_pair"),
        metrics=("accuracy", "macro_f1"), primary_metric="accuracy", min_labels=2, sample_labels=("a", "b"),
        label_help="a label name"),
    MULTI_LABEL: TaskKind(
        MULTI_LABEL, "sequence-classification", "multi_label_classification", "float32", True, 128,
        "sigmoid_kl", "bce", "labels", "sentences", fields=("text", "text_pair"),
        metrics=("micro_f1", "macro_f1", "subset_accuracy"), primary_metric="micro_f1", min_labels=1,
        sample_labels=("a", "b"), label_help="label names: a JSON list, or --label-sep"),
    REGRESSION: TaskKind(
        REGRESSION, "sequence-classification", "regression", "float32", False, 128,
        "mse", "mse", "score", "sentences", fields=("text", "text_pair"),
        metrics=("pearson", "spearmanr", "mse"), primary_metric="pearson", label_help="a number"),
    TOKEN: TaskKind(
        TOKEN, "token-classification", None, "int64", True, 128,
        "token_kl", "token_cross_entropy", "tags", "words", fields=("tokens",), columns=(("tokens", "tokens"), ("label", "tags")),
        metrics=("entity_f1", "entity_precision", "entity_recall"), primary_metric="entity_f1", min_labels=2,
        sample_labels=("O", "B-x"), label_help="a tag per word: O, B-TYPE, I-TYPE",
        not_augmentable="tags belong to words that word replacement would change"),
    SPAN: TaskKind(
        SPAN, "question-answering", None, None, False, 384,
        "span_kl", "span_cross_entropy", "answer", "squad", not_augmentable="answers are spans"),
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
    """Facts about one task: a benchmark preset, or a user's own (``user``)."""

    name: str  # canonical registry name, e.g. "sst2"; a user's task: its --task-name or its files' name
    display: str  # as papers write it, e.g. "SST-2"
    kind: str  # one of KINDS
    text_fields: tuple[str, ...]  # dataset columns, in model-input order
    label_names: tuple[str, ...]  # official order (a user's task: sorted or --labels); empty for regression and span tasks
    metrics: tuple[str, ...]  # metric names reported by compress.eval.metrics / compress.eval.squad
    primary_metric: str  # the one number a leaderboard shows
    splits: tuple[Split, ...]
    hub_path: str  # Hugging Face dataset repository ("" for a user's task: files only)
    hub_config: str | None  # its configuration name
    folders: tuple[str, ...]  # folder names in a local data directory
    label_range: tuple[float, float] | None = None  # valid targets of a regression task
    submission_labels: str = "index"  # GLUE server labels: "index" (0/1), "names", "float"
    prediction_source: str | None = None  # task whose model predicts this one (AX <- MNLI)
    unanswerable: bool = False  # some questions have no answer (SQuAD v2.0): null odds, HasAns/NoAns metrics
    aliases: tuple[str, ...] = field(default=())
    user: bool = False  # a user's own task, made from files (travels in compression.json), not a registry entry
    columns: tuple[tuple[str, str], ...] = ()  # (field or "label", file column) the files are read with; () = the field names
    label_sep: str | None = None  # multi-label: separator between labels in one cell (None: a JSON list or a list column)
    threshold: float | None = None  # multi-label: a label is predicted when its sigmoid is at least this

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

    @property
    def column_map(self) -> dict[str, str]:
        """Field (and ``label``) -> the file column holding it; a field not mapped is its own column name."""
        mapped = {**(dict(self.behaviour.columns) if self.user else {}), **dict(self.columns)}
        return {f: mapped.get(f, f) for f in (*self.text_fields, LABEL)}

    def to_record(self) -> dict:
        """What compression.json keeps of a user's task ("task_spec"), enough for :func:`task_from_record`."""
        return {"name": self.name, "kind": self.kind, "text_fields": list(self.text_fields),
                "labels": list(self.label_names), "columns": {f: c for f, c in self.columns},
                "metric": self.primary_metric, "metrics": list(self.metrics),
                "label_sep": self.label_sep, "threshold": self.threshold}

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


LABEL = "label"  # the dataset column of the gold label (a class index, a score, a multi-hot row, a tag id per word)


def _glue(name, display, fields, labels, metrics, primary, *, splits, folders, **kw) -> Task:
    """A GLUE preset: its facts, then (by keyword) its splits, its folder names and any other :class:`Task` field."""
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


def _tsv_split(name, hub, files, texts, label, *, sub=None, header=True, enc="index", labelled=True):
    """A split in the GLUE TSV layout: its names, files, text and label columns; the rest by keyword (``sub``: the
    GLUE server file it is submitted as)."""
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
        splits=(
            # The GLUE release of CoLA has no header: source, label, original label, sentence.
            _tsv_split("train", "train", ("train.tsv",), (3,), 1, header=False),
            _tsv_split("dev", "validation", ("dev.tsv",), (3,), 1, header=False),
            _tsv_split("test", "test", ("test.tsv",), ("sentence",), None, sub="CoLA.tsv", labelled=False),
        ),
        folders=("CoLA", "cola"),
    ),
    _glue(
        "sst2", "SST-2", ("sentence",), ("negative", "positive"), ACC, "accuracy",
        splits=_standard("SST-2.tsv", ("sentence",), "label"),
        folders=("SST-2", "sst2", "SST2"), aliases=("sst",),
    ),
    _glue(
        "mrpc", "MRPC", ("sentence1", "sentence2"), ("not_equivalent", "equivalent"),
        ACC_F1, "f1",
        splits=_standard("MRPC.tsv", ("#1 String", "#2 String"), "Quality"),
        folders=("MRPC", "mrpc"),
    ),
    _glue(
        "stsb", "STS-B", ("sentence1", "sentence2"), (), ("pearson", "spearmanr"), "pearson",
        splits=_standard("STS-B.tsv", ("sentence1", "sentence2"), "score", enc="float"),
        folders=("STS-B", "stsb", "STSB", "STS"), kind=REGRESSION, label_range=(0.0, 5.0),
        submission_labels="float", aliases=("sts-b", "sts"),
    ),
    _glue(
        "qqp", "QQP", ("question1", "question2"), ("not_duplicate", "duplicate"),
        ACC_F1, "accuracy",
        splits=_standard("QQP.tsv", ("question1", "question2"), "is_duplicate"),
        folders=("QQP", "qqp"),
    ),
    _glue(
        "mnli", "MNLI", ("premise", "hypothesis"), ("entailment", "neutral", "contradiction"),
        ACC, "accuracy",
        splits=(
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
        folders=("MNLI", "mnli"), submission_labels="names", aliases=("mnli-m",),
    ),
    _glue(
        "qnli", "QNLI", ("question", "sentence"), ("entailment", "not_entailment"), ACC, "accuracy",
        splits=_standard("QNLI.tsv", ("question", "sentence"), "label", enc="names"),
        folders=("QNLI", "qnli"), submission_labels="names",
    ),
    _glue(
        "rte", "RTE", ("sentence1", "sentence2"), ("entailment", "not_entailment"), ACC, "accuracy",
        splits=_standard("RTE.tsv", ("sentence1", "sentence2"), "label", enc="names"),
        folders=("RTE", "rte"), submission_labels="names",
    ),
    _glue(
        "wnli", "WNLI", ("sentence1", "sentence2"), ("not_entailment", "entailment"), ACC, "accuracy",
        splits=_standard("WNLI.tsv", ("sentence1", "sentence2"), "label"),
        folders=("WNLI", "wnli"),
    ),
    _glue(
        "ax", "AX", ("premise", "hypothesis"), ("entailment", "neutral", "contradiction"),
        ("matthews_correlation",), "matthews_correlation",
        splits=(
            # diagnostic-full.tsv carries gold labels (and linguistic categories); the
            # GLUE server's diagnostic.tsv does not. Both are the "test" split, in one order.
            Split(
                name="test", hub="test", labelled=False, submission_file="AX.tsv",
                tsv=TsvSpec(files=("diagnostic-full.tsv", "diagnostic.tsv", "AX.tsv"),
                            texts=("sentence1|Premise", "sentence2|Hypothesis"),
                            label="Label", label_encoding="names"),
            ),
        ),
        folders=("AX", "diagnostic", "ax"), submission_labels="names", prediction_source="mnli",
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


# ---------------------------------------------------------------------------- a user's own task

# A user's task takes its fields, default columns, metrics and label count from its kind (TaskKind).
MULTI_LABEL_THRESHOLD = 0.5
BIO = re.compile(r"^(O|[BI]-\S.*)$")  # IOB2 tags: O, B-TYPE, I-TYPE


def user_task(kind: str, name: str, labels: tuple[str, ...] = (), *, pair: bool = False,
              columns: tuple[tuple[str, str], ...] = (), label_sep: str | None = None,
              threshold: float | None = None) -> Task:
    """A user's own task of ``kind`` (one of USER_KINDS) with ``labels`` in output order.

    Its fields are canonical (``text``, ``text_pair``; ``tokens`` for token classification);
    ``columns`` maps them (and ``label``) to the file's columns. Splits are train / dev / test,
    each read from one file; a test file may hold no labels (predictions only).
    """
    behaviour = user_kind(kind)
    if not behaviour.named_labels:
        labels = ()
    elif len(labels) < behaviour.min_labels:
        found = f"only {labels[0]!r}" if labels else "none"
        raise CompressError(f"a {kind} task needs at least {behaviour.min_labels} labels; the training data has {found}")
    if len(set(labels)) != len(labels):
        twice = sorted({x for x in labels if labels.count(x) > 1})
        raise CompressError(f"label(s) {', '.join(twice)} given twice; each label names one output")
    metrics = behaviour.metrics
    if behaviour.tagged_words:
        bad = [t for t in labels if not BIO.match(t)]
        if bad:
            raise CompressError(f"tag(s) {', '.join(map(repr, bad[:5]))} are not in BIO form (O, B-TYPE, I-TYPE); "
                                "convert the tags to IOB2")
        metrics = (*metrics, *(f"f1_{t}" for t in entity_types(labels)))  # f1 of each entity type after the overall scores
    return Task(
        name=name, display=name, kind=kind, text_fields=behaviour.fields[: 2 if pair else 1], label_names=tuple(labels),
        metrics=metrics, primary_metric=behaviour.primary_metric,
        splits=(Split("train", "train"), Split("dev", "validation"), Split("test", "test", labelled=False)),
        hub_path="", hub_config=None, folders=(), submission_labels="names", user=True, columns=tuple(columns),
        label_sep=label_sep,
        threshold=(threshold if threshold is not None else MULTI_LABEL_THRESHOLD) if behaviour.multi_hot else None,
    )


def user_kind(kind: str) -> TaskKind:
    """The record of ``kind``, a kind of user task (one of USER_KINDS); any other name is refused with the valid ones."""
    if kind not in USER_KINDS:
        raise CompressError(f"unknown task kind {kind!r}; valid: {', '.join(USER_KINDS)}")
    return KINDS[kind]


def kind_for_head(head: str, problem_type: str | None, num_labels: int) -> str | None:
    """The kind of user task a fine-tuned model is for, from its config.json: the head (its architecture),
    ``problem_type`` and the number of outputs; None for a head no user kind has (a bare encoder, question answering).

    A sequence classifier without a ``problem_type`` is a regressor when it has one output (as transformers reads it).
    """
    kinds = [KINDS[k] for k in USER_KINDS if KINDS[k].head == head]
    if len(kinds) <= 1:
        return kinds[0].name if kinds else None
    if problem_type is None and num_labels == 1:
        problem_type = KINDS[REGRESSION].problem_type
    return next((k.name for k in kinds if k.problem_type == problem_type), CLASSIFICATION)


def entity_types(tags: tuple[str, ...]) -> list[str]:
    """The entity types of BIO tags, in first-seen order (``B-person``, ``I-person`` -> ``person``)."""
    return list(dict.fromkeys(t[2:] for t in tags if t != "O"))


def task_from_record(record: dict) -> Task:
    """The user's task that :meth:`Task.to_record` wrote (compression.json's "task_spec")."""
    try:
        kind, fields = record["kind"], tuple(record["text_fields"])
        task = user_task(kind, str(record["name"]), tuple(record.get("labels") or ()), pair=len(fields) == 2,
                         columns=tuple((record.get("columns") or {}).items()), label_sep=record.get("label_sep"),
                         threshold=record.get("threshold"))
    except (KeyError, TypeError, AttributeError) as err:
        raise CompressError(f"a recorded task is malformed (missing or bad {err}); re-run the stage that made the model") from None
    if task.text_fields != fields:
        raise CompressError(f"a recorded {kind} task has fields {list(fields)}; expected {list(task.text_fields)}")
    return task
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
    """A user's task kinds and the registered task names as a flag's choices; any alias get_task accepts too."""
    return Choices([*USER_KINDS, *TASKS], accept=lambda name: _key(name) in _ALIASES)


def is_kind(name: str) -> bool:
    """Whether ``name`` names a kind of user task (``text-classification``, ...) rather than a preset."""
    return name in USER_KINDS


def get_task(name: str) -> Task:
    """Look a preset task up by name or alias (case and punctuation insensitive)."""
    key = _key(name)
    if key in _ALIASES:
        return TASKS[_ALIASES[key]]
    if is_kind(name):
        raise CompressError(f"--task {name} is a kind of task, made from your files: pass --train-file (and --dev-file), "
                            "or a model folder fine-tuned on the task")
    raise CompressError(f"unknown task {name!r}; valid: {', '.join(USER_KINDS)} (your own data) or {', '.join(TASKS)}")
