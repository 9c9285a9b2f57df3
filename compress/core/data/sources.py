"""Loading task data from the hub, local GLUE/SQuAD folders or plain files, and tokenising it.

Every source returns a ``datasets.Dataset`` with the hub's schema, so the rest of the
toolkit never cares where the data came from:

* GLUE tasks: the task's text fields (e.g. ``sentence1``, ``sentence2``), ``label``
  (class index in the task's official label order, a float for STS-B, -1 when the
  split has no labels) and ``idx`` (the source's own ``index``/``idx`` column, as GLUE
  files and the hub carry it; else the 0-based row in the source split).
* SQuAD: ``id``, ``title``, ``context``, ``question``,
  ``answers = {"text": [...], "answer_start": [...]}``.

Sources (:class:`DataSource`): the hub through ``datasets`` (the default), a local
directory in the GLUE download script's layout or the hub's parquet layout (with
official SQuAD JSON files), or one csv/tsv/json/jsonl/parquet/SQuAD-JSON file with an
optional column mapping.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq
from transformers import DataCollatorForTokenClassification, DataCollatorWithPadding

from compress.core.config import flat_keywords, loads_json, option
from compress.core.errors import CompressError
from compress.core.data.files import (  # noqa: F401  (read_text_file, read_tsv_rows re-exported)
    Record,
    is_conll,
    is_saved_dataset,
    label_list,
    read_conll,
    read_table,
    read_text_file,
    read_tsv_rows,
)
from compress.core.hub import hub_offline_mode, hub_reachable, offline_as_set_now
from compress.core.data.tasks import (
    CLASSIFICATION,
    LABEL,
    MULTI_LABEL,
    REGRESSION,
    BIO,
    SPAN,
    TOKEN,
    UNLABELLED,
    Split,
    Task,
    TsvSpec,
)
from compress.core.data.token_data import check_fast, token_features

log = logging.getLogger(__name__)


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


def load_task_data(task: Task, tokenizer, data: TaskData, max_length: int, seed: int = 0):
    """Tokenised training features, one raw dev dataset per dev split, and the training-set size.

    Classification/regression features hold input ids, segments, mask and ``labels``;
    SQuAD features are windows with start/end positions. ``max_train_examples``
    subsamples with ``seed`` (reports must say so).
    """
    train_ds = load_train_split(task, data, seed)
    return train_features(train_ds, task, tokenizer, data, max_length), load_dev_splits(task, data), len(train_ds)


def load_train_split(task: Task, data: TaskData, seed: int = 0):
    """The raw training examples (hub schema), subsampled to ``max_train_examples`` with ``seed``."""
    train_ds = load_split(task, "train", data.sources()[0])
    if data.max_train_examples and data.max_train_examples < len(train_ds):
        train_ds = train_ds.shuffle(seed=seed).select(range(data.max_train_examples))
    return train_ds


def load_dev_splits(task: Task, data: TaskData) -> dict:
    """Split name -> raw dev examples (every dev split of the task; one with --dev-file)."""
    dev_splits = [s.name for s in task.resolve_splits("dev")]
    if data.dev_file:
        dev_splits = dev_splits[:1]
    return {name: load_split(task, name, data.sources()[1], data.max_eval_examples) for name in dev_splits}


def load_test_split(task: Task, data: TaskData):
    """The raw ``--test-file`` examples (None without one): read before training, so bad test data fails early."""
    source = data.test_source()
    return load_split(task, "test", source) if source is not None else None


def train_features(ds, task: Task, tokenizer, data: TaskData, max_length: int):
    """Tokenised training features of raw examples ``ds``, as the task's kind makes them (no padding)."""
    return _BY_KIND[task.kind].train_features(ds, task, tokenizer, data, max_length)


# ---------------------------------------------------------------------------- entry point


def load_split(
    task: Task,
    split: str,
    source: DataSource | None = None,
    max_examples: int | None = None,
):
    """Load one split of ``task`` as a ``datasets.Dataset`` in the hub schema."""
    source = source or DataSource()
    spec = task.split(split)
    if task.user and not source.data_file:
        given = "--data-dir reads benchmark folders (GLUE, SQuAD), and " if source.data_dir else ""
        raise CompressError(f"{given}{task.display} is your own {task.kind} task: its {split} data comes from a file; pass "
                            f"--{split}-file FILE (in compress eval: --data-file FILE)")
    if source.data_file:
        ds = _from_file(task, spec, Path(source.data_file), dict(source.columns))
    elif source.data_dir:
        ds = _from_dir(task, spec, Path(source.data_dir))
    else:
        ds = _from_hub(task, spec)
    if len(ds) == 0:
        raise CompressError(
            f"{task.display} {split}: the data from {source.description} has no examples; "
            "check the file or pass a different --data-dir/--data-file"
        )
    if max_examples is not None and max_examples < len(ds):
        if max_examples < 1:
            raise CompressError(f"--max-examples must be at least 1, got {max_examples}")
        ds = ds.select(range(max_examples))
    return ds


# ---------------------------------------------------------------------------- hub


def _from_hub(task: Task, split: Split):
    # deferred: a heavy import, paid only where it is used
    import datasets

    what = f"{task.display} ({task.hub_path}" + (f", {task.hub_config})" if task.hub_config else ")")
    local_hint = "pass --data-dir DIR pointing at local files " + _BY_KIND[task.kind].local_files(task)
    if not hub_offline_mode() and not hub_reachable():
        raise CompressError(
            f"cannot download task {what}: the Hugging Face hub is unreachable; {local_hint}"
        )
    try:
        with offline_as_set_now():
            ds = datasets.load_dataset(task.hub_path, task.hub_config, split=split.hub)
    except Exception as err:  # datasets raises many types; the user needs one line
        if hub_offline_mode():
            reason = "offline mode (HF_HUB_OFFLINE) is on and the data is not in the local cache"
        else:
            reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise CompressError(
            f"cannot load task {what} split {split.hub} from the Hugging Face hub: {reason}; {local_hint}"
        ) from None
    return ds


# ---------------------------------------------------------------------------- local directory


def _task_folder(task: Task, root: Path) -> Path:
    """The task's folder under ``root``, or ``root`` itself when it already is one."""
    if not root.is_dir():
        raise CompressError(f"data directory {root} does not exist or is not a directory")
    for name in task.folders:
        candidate = root / name
        if name != "." and candidate.is_dir():
            return candidate
    return root


def _find_parquet(folder: Path, hub_split: str) -> list[Path]:
    """Parquet files of one split: ``validation.parquet``, ``validation_0000.parquet``,
    ``validation-00000-of-00001.parquet``, also inside ``hf_parquet/`` or the hub config folder."""
    found: list[Path] = []
    for where in (folder, folder / "hf_parquet", *[p for p in folder.iterdir() if p.is_dir()]):
        if not where.is_dir():
            continue
        for path in sorted(where.glob("*.parquet")):
            stem = path.name[: -len(".parquet")]
            if stem == hub_split or stem.startswith((hub_split + "-", hub_split + "_0", hub_split + "_1")):
                found.append(path)
        if found:
            return found
    return found


def _from_dir(task: Task, split: Split, root: Path):
    folder = _task_folder(task, root)
    # The split names its own files: official SQuAD JSON (none for GLUE), GLUE TSVs (none for SQuAD).
    for name in split.squad_files:
        for where in (folder, root):
            if (where / name).is_file():
                return read_squad_json(where / name)
    if split.tsv is not None:
        for name in split.tsv.files:
            if (folder / name).is_file():
                return read_glue_tsv(folder / name, task, split)
    parquet = _find_parquet(folder, split.hub)
    if parquet:
        return _read_parquet(parquet, task, split)
    expected = list(split.squad_files) or list(split.tsv.files if split.tsv else [])
    raise CompressError(
        f"no {task.display} {split.name} data in {folder}: expected "
        f"{' or '.join(expected + [split.hub + '*.parquet'])}; "
        f"point --data-dir at the GLUE root (with {task.folders[0]}/) or at the task's folder"
    )


def _column_index(header: list[str], want: str | int) -> int | None:
    if isinstance(want, int):
        return want
    names = [h.strip().lstrip("\ufeff") for h in header]
    for choice in want.split("|"):
        for i, name in enumerate(names):
            if name == choice or name.lower() == choice.lower():
                return i
    return None


def read_glue_tsv(path: Path, task: Task, split: Split):
    """Parse one GLUE TSV exactly as the GLUE download script wrote it.

    Fields are tab-separated with no quoting (MRPC and SST-2 contain bare quotes);
    line endings may be CRLF (AX); CoLA train/dev have no header.
    """
    return _glue_dataset(read_tsv_rows(path), path, task, split)


def _glue_dataset(rows: list[list[str]], path: Path, task: Task, split: Split):
    """The hub schema from the rows of a file in the split's GLUE layout (:class:`TsvSpec`)."""
    spec: TsvSpec = split.tsv
    first_line = 1
    if spec.header:
        if not rows:
            raise CompressError(f"{path}: the file is empty; expected a header line")
        header = rows[0]
        rows = rows[1:]
        first_line = 2
        text_cols = []
        for want in spec.texts:
            idx = _column_index(header, want)
            if idx is None:
                raise CompressError(
                    f"{path}: no column {want!r} in the header ({', '.join(header)}); "
                    f"is this the {task.display} {split.name} file?"
                )
            text_cols.append(idx)
        label_col = _column_index(header, spec.label) if spec.label is not None else None
        if spec.label is not None and label_col is None and split.labelled:
            raise CompressError(f"{path}: no label column {spec.label!r} in the header ({', '.join(header)})")
        index_col = _column_index(header, INDEX_COLUMNS)
    else:
        text_cols = list(spec.texts)
        label_col = spec.label
        index_col = None

    needed = _fields_needed(text_cols, label_col)
    columns: dict[str, list[Any]] = {f: [] for f in task.text_fields}
    labels: list[Any] = []
    index: list[int] | None = [] if index_col is not None else None
    for offset, row in enumerate(rows):
        line_no = first_line + offset
        if len(row) < needed:
            raise CompressError(
                f"{path}:{line_no}: malformed row: expected at least {needed} tab-separated fields, "
                f"found {len(row)}; fix or remove the line"
            )
        for name, col in zip(task.text_fields, text_cols):
            columns[name].append(row[col])
        if label_col is None:
            labels.append(task.behaviour.unlabelled)
        else:
            labels.append(parse_label(task, row[label_col], f"{path}:{line_no}", spec.label_encoding))
        if index is not None and index_col is not None:
            index.append(_parse_index(row[index_col] if index_col < len(row) else None, f"{path}:{line_no}"))
    return _make_dataset(task, columns, labels, index)


def _fields_needed(text_cols: list[int], label_col: int | None) -> int:
    """How many tab-separated fields a row needs to hold the text and label columns."""
    return max([*text_cols, label_col if label_col is not None else -1]) + 1


def _in_glue_layout(task: Task, split: Split, first: list[str]) -> bool:
    """Whether a ``.tsv`` data file given without ``--columns`` is the split's GLUE file (MRPC's
    ``#1 String``, STS-B's ``score``, CoLA without a header), not a table named by the task's fields."""
    spec = split.tsv
    if spec is None:
        return False
    if all(f in first for f in task.text_fields) and ("label" in first or not split.labelled):
        return False  # the task's own field names: read as any table
    if spec.header:
        wanted = [*spec.texts, *([spec.label] if spec.label is not None else [])]
        return all(_column_index(first, c) is not None for c in wanted)
    # No header (CoLA): the first row is an example, so its label must read as one.
    if len(first) < _fields_needed(list(spec.texts), spec.label):
        return False
    if spec.label is None:
        return True
    try:
        parse_label(task, first[spec.label], "", spec.label_encoding)
    except CompressError:
        return False
    return True


def parse_label(task: Task, raw: Any, where: str, encoding: str = "auto") -> int | float:
    """Turn a raw label (index, name or number) into the task's label; errors name the valid ones."""
    return _BY_KIND[task.kind].parse_label(task, raw, where, encoding)


def _parse_score(task: Task, raw: Any, where: str, encoding: str) -> float:
    """A regression target: any number inside the task's ``label_range`` (``encoding`` is moot)."""
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise CompressError(f"{where}: label {raw!r} is not a number; {task.display} needs a score") from None
    lo, hi = task.label_range or (-math.inf, math.inf)
    if not (lo <= value <= hi) or math.isnan(value):
        raise CompressError(f"{where}: score {value} is outside {task.display}'s range [{lo}, {hi}]")
    return value


def _parse_class(task: Task, raw: Any, where: str, encoding: str) -> int:
    """A class index from a label name or (a preset's) 0-based index, as ``encoding`` allows."""
    names = task.label_names
    text = str(raw).strip()
    if task.user:  # a user's labels are names only: "7" is a name, never the 8th label
        return _user_label(task, text, where)
    valid = ", ".join(f"{i} ({n})" for i, n in enumerate(names))
    if encoding in ("names", "auto") and text in names:
        return names.index(text)
    if encoding in ("index", "auto"):
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if value.is_integer() and 0 <= value < len(names):
            return int(value)
    raise CompressError(f"{where}: unknown label {text!r} for {task.display}; valid: {valid}")


def label_names_in(kind: str, path: Path, mapping: dict[str, str], label_sep: str | None = None) -> list[str]:
    """The label names a user's training file holds (tags for token classification), in first-seen order.

    ``mapping``: field -> column, as :attr:`Task.column_map` gives it. A missing label column
    names the columns the file has.
    """
    label = mapping[LABEL]
    if kind == TOKEN and is_conll(path) and path.is_file():
        records = read_conll(path, mapping["tokens"], label)
    else:
        records = read_table(path, "train")
    if records and label not in records[0].values:
        flag = "--label-column COLUMN"
        raise CompressError(f"{path}: no label column {label!r} (columns here: {', '.join(map(str, records[0].values))}); "
                            f"name it with {flag}")
    seen: dict[str, None] = {}
    for record in records:
        raw = record.values.get(label)
        if kind == MULTI_LABEL:
            names = label_list(raw, label_sep, record.where)
        elif kind == TOKEN:
            names = raw.split() if isinstance(raw, str) else [str(t) for t in (raw or [])]
        else:
            names = [] if raw is None or str(raw).strip() == "" else [str(raw).strip()]
        for i, name in enumerate(names):
            if kind == TOKEN and not BIO.match(name):
                raise CompressError(f"{record.token_where(i)}: tag {name!r} is not in BIO form (O, B-TYPE, I-TYPE); "
                                    "convert the tags to IOB2")
            seen.setdefault(name.strip(), None)
    return list(seen)


def _user_label(task: Task, text: str, where: str) -> int:
    """The index of one of a user's label names; a name the task does not have is refused with a few it has."""
    names = task.label_names
    if text in names:
        return names.index(text)
    shown = ", ".join(names[:8]) + (f", ... ({len(names)} in all)" if len(names) > 8 else "")
    raise CompressError(f"{where}: label {text!r} is not one of {task.display}'s labels ({shown}); the labels come from "
                        "the training data, so a dev or test label must occur there (or fix the label)")


def _parse_multi(task: Task, raw: Any, where: str, encoding: str) -> list[float]:
    """A multi-hot row (K floats) from a cell holding a list of label names."""
    row = [0.0] * task.num_labels
    for name in label_list(raw, task.label_sep, where):
        row[_user_label(task, name, where)] = 1.0
    return row


def _parse_tag(task: Task, raw: Any, where: str) -> int:
    """A tag's index: a BIO tag the task has (``O``, ``B-TYPE``, ``I-TYPE``)."""
    text = str(raw).strip()
    if not BIO.match(text):
        raise CompressError(f"{where}: tag {text!r} is not in BIO form (O, B-TYPE, I-TYPE); convert the tags to IOB2")
    return _user_label(task, text, where)


INDEX_COLUMNS = "index|idx"  # the column that numbers a split's examples (GLUE TSVs: index; the hub: idx)


def _parse_index(raw: Any, where: str) -> int:
    """An example's own index (an integer), as its source file numbers it."""
    try:
        value = float(str(raw).strip())
    except ValueError:
        value = math.nan
    if not value.is_integer():
        raise CompressError(f"{where}: index {raw!r} is not an integer; the index column numbers the examples")
    return int(value)


def _make_dataset(task: Task, columns: dict[str, list[Any]], labels: list[Any], index: list[int] | None = None):
    """The hub schema from columns; ``idx`` is the source's own index when it has one, else the row number."""
    # deferred: a heavy import, paid only where it is used
    import datasets

    data = dict(columns)
    data[LABEL] = labels
    data["idx"] = list(range(len(labels))) if index is None else index
    return datasets.Dataset.from_dict(data, features=dataset_features(task))


def dataset_features(task: Task):
    """The hub schema of a sentence or token task: text fields (a word list for tokens), ``label``, ``idx``."""
    # deferred: a heavy import, paid only where it is used
    import datasets

    kind = task.behaviour
    text = datasets.Sequence(datasets.Value("string")) if task.kind == TOKEN else datasets.Value("string")
    label = datasets.Value(kind.label_dtype)
    return datasets.Features({
        **{f: text for f in task.text_fields},
        LABEL: datasets.Sequence(label) if kind.label_list else label,
        "idx": datasets.Value("int64"),
    })


def _read_parquet(paths: list[Path], task: Task, split: Split):
    # deferred: a heavy import, paid only where it is used
    import datasets

    try:
        # Straight through pyarrow: no cache files, no "generating split" noise.
        table = pa.concat_tables([pq.read_table(p) for p in paths], promote_options="default")
    except Exception as err:
        raise CompressError(f"cannot read parquet file(s) {', '.join(map(str, paths))}: {err}") from None
    return _BY_KIND[task.kind].from_table(datasets.Dataset(table), task, str(paths[0]))


def _sentence_table(ds, task: Task, where: str):
    """A parquet table of a sentence task: its text fields and checked labels, renumbered."""
    missing = [c for c in (*task.text_fields, "label") if c not in ds.column_names]
    if missing:
        raise CompressError(
            f"{where}: missing column(s) {', '.join(missing)} for {task.display} "
            f"(found {', '.join(ds.column_names)})"
        )
    labels = ds["label"]
    checked = [
        lab if lab == UNLABELLED else parse_label(task, lab, f"{where} row {i}", "index")
        for i, lab in enumerate(labels)
    ]
    columns = {f: ds[f] for f in task.text_fields}
    index = [_parse_index(v, f"{where} row {i}") for i, v in enumerate(ds["idx"])] if "idx" in ds.column_names else None
    return _make_dataset(task, columns, checked, index)


# ---------------------------------------------------------------------------- SQuAD JSON


def read_squad_json(path: Path):
    """Flatten an official SQuAD v1.1/v2.0 JSON file into one row per question."""
    # deferred: a heavy import, paid only where it is used
    import datasets

    try:
        doc = loads_json(read_text_file(path), path)
    except json.JSONDecodeError as err:
        raise CompressError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise CompressError(f"{path}: not a SQuAD file (expected a top-level 'data' list of articles)")
    rows: dict[str, list[Any]] = {k: [] for k in ("id", "title", "context", "question", "answers")}
    for a, article in enumerate(doc["data"]):
        try:
            for paragraph in article["paragraphs"]:
                context = paragraph["context"]
                for qa in paragraph["qas"]:
                    answers = qa.get("answers", [])
                    rows["id"].append(str(qa["id"]))
                    rows["title"].append(article.get("title", ""))
                    rows["context"].append(context)
                    rows["question"].append(qa["question"])
                    rows["answers"].append(
                        {
                            "text": [x["text"] for x in answers],
                            "answer_start": [int(x["answer_start"]) for x in answers],
                        }
                    )
        except (KeyError, TypeError, ValueError) as err:
            raise CompressError(
                f"{path}: article {a} ({article.get('title', '?') if isinstance(article, dict) else '?'}) "
                f"is malformed: missing or bad field {err}"
            ) from None
    return datasets.Dataset.from_dict(rows, features=squad_features())


def squad_features():
    # deferred: a heavy import, paid only where it is used
    import datasets

    return datasets.Features(
        {
            "id": datasets.Value("string"),
            "title": datasets.Value("string"),
            "context": datasets.Value("string"),
            "question": datasets.Value("string"),
            "answers": {
                "text": datasets.Sequence(datasets.Value("string")),
                "answer_start": datasets.Sequence(datasets.Value("int32")),
            },
        }
    )


def _check_squad_columns(ds, where: str):
    missing = [c for c in ("id", "context", "question", "answers") if c not in ds.column_names]
    if missing:
        raise CompressError(f"{where}: missing SQuAD column(s) {', '.join(missing)}")
    return ds


# ---------------------------------------------------------------------------- plain files


def _from_file(task: Task, split: Split, path: Path, columns: dict[str, str]):
    """One file: csv/tsv/json/jsonl/parquet, a ``datasets`` save_to_disk folder, CoNLL (token tasks) or SQuAD JSON."""
    if not (path.is_file() or is_saved_dataset(path)):
        where = " (a folder, but not one datasets' save_to_disk wrote)" if path.is_dir() else ""
        raise CompressError(f"data file {path} does not exist{where}")
    return _BY_KIND[task.kind].from_file(task, split, path, columns)


def _squad_file(task: Task, split: Split, path: Path, columns: dict[str, str]):
    """SQuAD from one file: the hub's parquet rows or official JSON (``columns`` is not used)."""
    if path.suffix.lower() == ".parquet":
        return _read_parquet([path], task, split)
    return read_squad_json(path)


def _mapping(task: Task, columns: dict[str, str]) -> dict[str, str]:
    """Field (and ``label``) -> file column: the task's own columns, then ``--columns`` / ``--*-column``."""
    fields = [*task.text_fields, LABEL]
    unknown = set(columns) - set(fields)
    if unknown:
        raise CompressError(
            f"--columns names unknown field(s) {', '.join(sorted(unknown))} for {task.display}; "
            f"fields: {', '.join(fields)}"
        )
    return {**task.column_map, **columns}


def _column_flag(task: Task, field: str) -> str:
    """How the user names the column of ``field``: the own-task flags, or --columns for a preset."""
    if not task.user:
        return f"--columns {field}=COLUMN"
    return {LABEL: "--label-column", "text_pair": "--text-pair-column"}.get(field, "--text-column") + " COLUMN"


def _check_columns(task: Task, split: Split, records: list[Record], mapping: dict[str, str], path: Path) -> bool:
    """Refuse a file without a text column (naming the columns it has); whether it has the label column.

    A test file may lack the label column (predictions only); train and dev files may not.
    """
    have = list(records[0].values) if records else []
    for f in task.text_fields:
        if records and mapping[f] not in records[0].values:
            raise CompressError(
                f"{path}: no column {mapping[f]!r} for {task.display}'s {f} (columns here: {', '.join(map(str, have))}); "
                f"name it with {_column_flag(task, f)}"
            )
    labelled = not records or mapping[LABEL] in records[0].values
    if not labelled and split.labelled and split.name != "test":
        raise CompressError(
            f"{path}: no label column {mapping[LABEL]!r} (columns here: {', '.join(map(str, have))}); "
            f"name it with {_column_flag(task, LABEL)}"
        )
    return labelled


def _sentence_file(task: Task, split: Split, path: Path, columns: dict[str, str]):
    """A sentence task from one csv/tsv/json/jsonl/parquet file or datasets folder, its columns mapped.

    A ``.tsv`` file in a preset split's GLUE layout (the download script's ``dev.tsv``) needs no
    ``columns``: it is read as ``--data-dir`` reads it, to the same rows.
    """
    if path.suffix.lower() == ".tsv" and path.is_file() and not columns and not task.user:
        rows = read_tsv_rows(path)  # GLUE's convention: quotes are text
        if rows and _in_glue_layout(task, split, rows[0]):
            return _glue_dataset(rows, path, task, split)
    records = read_table(path, split.name)
    mapping = _mapping(task, columns)
    labelled = _check_columns(task, split, records, mapping, path)
    out: dict[str, list[Any]] = {f: [] for f in task.text_fields}
    labels: list[Any] = []
    # The file's own index column (not one mapped to a task field) numbers the predictions.
    index_key = next((k for k in INDEX_COLUMNS.split("|") if records and k in records[0].values
                      and k not in mapping.values()), None)
    index: list[int] | None = [] if index_key else None
    for record in records:
        values, where = record.values, record.where
        if index is not None:
            index.append(_parse_index(values.get(index_key), where))
        for f in task.text_fields:
            value = values.get(mapping[f])
            if value is None:
                raise CompressError(f"{where}: no value in column {mapping[f]!r} ({task.display}'s {f}); fill it in or "
                                    "remove the row")
            if task.user and not str(value).strip():
                raise CompressError(f"{where}: the text in column {mapping[f]!r} is empty; fill it in or remove the row "
                                    "(a text broken over lines leaves an empty one beside its label)")
            out[f].append(str(value))
        raw = values.get(mapping[LABEL]) if labelled else None
        if _no_label(task, raw):
            if split.labelled and split.name != "test":
                raise CompressError(f"{where}: no label (column {mapping[LABEL]!r}); fill it in or remove the row")
            labels.append(_unlabelled(task))
        else:
            labels.append(parse_label(task, raw, where))
    return _make_dataset(task, out, labels, index)


def _no_label(task: Task, raw: Any) -> bool:
    """A cell without a label: absent, blank (a multi-label row may have none: ``[]`` or an empty cell is read), or -1."""
    if raw is None:
        return True
    if task.behaviour.label_list:
        return False
    return (isinstance(raw, str) and raw.strip() == "") or raw == UNLABELLED


def _unlabelled(task: Task) -> Any:
    """The label of a row without one (a test split): -1, or a row of -1 for a multi-hot label."""
    if task.kind == MULTI_LABEL:
        return [float(UNLABELLED)] * task.num_labels
    return task.behaviour.unlabelled


def _token_file(task: Task, split: Split, path: Path, columns: dict[str, str]):
    """A token-classification split: CoNLL, or a table whose rows hold a word list and a tag list."""
    mapping = _mapping(task, columns)
    words_col, tags_col = mapping["tokens"], mapping[LABEL]
    conll = is_conll(path) and path.is_file()
    records = read_conll(path, words_col, tags_col) if conll else read_table(path, split.name)
    if conll and records and tags_col not in records[0].values and split.name != "test":
        raise CompressError(f"{path}: no line has a tag; a CoNLL {split.name} file holds token<TAB>tag on each line "
                            "(only a test file may hold tokens alone)")
    labelled = _check_columns(task, split, records, mapping, path)
    words: list[list[str]] = []
    tags: list[list[int]] = []
    for record in records:
        values, where = record.values, record.where
        sentence = values.get(words_col)
        if isinstance(sentence, str):
            sentence = sentence.split()  # a sentence given as text: its words are split at whitespace
        if not isinstance(sentence, (list, tuple)) or not sentence:
            raise CompressError(f"{where}: column {words_col!r} must hold the sentence's words as a non-empty list")
        sentence = [str(w) for w in sentence]
        raw = values.get(tags_col) if labelled else None
        if raw is None:
            if split.labelled and split.name != "test":
                raise CompressError(f"{where}: no tags (column {tags_col!r}); fill them in or remove the sentence")
            tags.append([UNLABELLED] * len(sentence))
        else:
            raw = raw.split() if isinstance(raw, str) else raw
            if not isinstance(raw, (list, tuple)) or len(raw) != len(sentence):
                n = len(raw) if isinstance(raw, (list, tuple)) else "no list of"
                raise CompressError(f"{where}: {len(sentence)} words but {n} tags; give each word one tag")
            tags.append([_parse_tag(task, t, record.token_where(i)) for i, t in enumerate(raw)])  # a bad tag: its own line
        words.append(sentence)
    return _make_dataset(task, {"tokens": words}, tags, None)


# ---------------------------------------------------------------------------- tokenisation


def check_max_length(max_length: int, model_max: int | None) -> None:
    if max_length < 8:
        raise CompressError(f"--max-length {max_length} is too short; use at least 8 tokens")
    if model_max is not None and max_length > model_max:
        raise CompressError(
            f"--max-length {max_length} is above the model's maximum of {model_max} positions; "
            f"use --max-length {model_max} or less"
        )


def tokenize_classification(ds, task: Task, tokenizer, max_length: int = 128):
    """Tokenise single sentences or pairs (no padding: :func:`collate` pads each batch).

    Adds ``input_ids``, ``token_type_ids``, ``attention_mask`` and ``labels``; keeps ``idx``.
    """
    fields = task.text_fields
    truncated = [0]

    def encode(batch):
        texts = [batch[f] for f in fields]
        enc = tokenizer(*texts, truncation=True, max_length=max_length)
        # A fast tokenizer keeps what it cut in each encoding's ``overflowing``: counted, never silent.
        truncated[0] += sum(1 for e in (getattr(enc, "encodings", None) or []) if e.overflowing)
        enc["labels"] = batch["label"]
        return enc

    drop = [c for c in ds.column_names if c != "idx"]
    features = ds.map(encode, batched=True, remove_columns=drop, desc=f"tokenising {task.display}")
    if truncated[0]:
        log.info("%s: %d of %d examples are longer than --max-length %d tokens and were truncated",
                 task.display, truncated[0], len(ds), max_length)
    return features


def collate(tokenizer, task: Task | None = None, pad_to_multiple_of: int | None = None):
    """A collator that pads each batch to its longest sequence (dynamic padding); per-token labels pad with -100."""
    if task is not None and task.kind == TOKEN:
        return DataCollatorForTokenClassification(tokenizer, pad_to_multiple_of=pad_to_multiple_of)
    return DataCollatorWithPadding(tokenizer, pad_to_multiple_of=pad_to_multiple_of)


def squad_train_features(ds, tokenizer, max_length: int = 384, doc_stride: int = 128):
    """SQuAD training features: windows over long contexts with start/end token positions.

    A window that does not contain the answer (and every v2.0 no-answer question)
    points both positions at [CLS] (index 0), as in the BERT paper's SQuAD 2.0 setup.
    An example whose answer text is not at its ``answer_start`` is dropped (with a warning):
    it would teach "no answer"; when no example's answer is found the data is refused.
    """
    _check_stride(max_length, doc_stride)
    ds = _drop_lost_answers(ds)

    def encode(batch):
        enc = _squad_windows(batch, tokenizer, max_length, doc_stride)
        sample_map = enc.pop("overflow_to_sample_mapping")
        starts, ends = [], []
        for i, offsets in enumerate(enc.pop("offset_mapping")):
            seq_ids = enc.sequence_ids(i)
            answers = batch["answers"][sample_map[i]]
            if not answers["answer_start"]:
                starts.append(0)
                ends.append(0)
                continue
            start_char = answers["answer_start"][0]
            end_char = start_char + len(answers["text"][0])
            ctx_start = seq_ids.index(1)
            ctx_end = len(seq_ids) - 1 - seq_ids[::-1].index(1)
            if offsets[ctx_start][0] > start_char or offsets[ctx_end][1] < end_char:
                starts.append(0)
                ends.append(0)
                continue
            s = ctx_start
            while s <= ctx_end and offsets[s][0] <= start_char:
                s += 1
            e = ctx_end
            while e >= ctx_start and offsets[e][1] >= end_char:
                e -= 1
            starts.append(s - 1)
            ends.append(e + 1)
        enc["start_positions"] = starts
        enc["end_positions"] = ends
        return enc

    return ds.map(encode, batched=True, remove_columns=ds.column_names, desc="SQuAD train features")


def _answer_found(context: str, answers) -> bool:
    """Whether the first answer's text is in ``context`` at its ``answer_start`` (whitespace may differ)."""
    if not answers["text"]:
        return False
    start, text = answers["answer_start"][0], answers["text"][0]
    span = context[start : start + len(text)] if 0 <= start < len(context) else ""
    return bool(text.strip()) and " ".join(span.split()) == " ".join(text.split())


def _drop_lost_answers(ds):
    """``ds`` without the examples whose answer is not where it says it is; none may be left with one.

    Training reads only the first answer (its character offset into the context); v2.0
    questions without an answer are kept.
    """
    answers = list(ds["answers"])  # datasets 5 columns are not lists
    answered = [i for i, a in enumerate(answers) if a["answer_start"]]
    if not answered:
        return ds
    contexts = list(ds["context"])
    lost = {i for i in answered if not _answer_found(contexts[i], answers[i])}
    if not lost:
        return ds
    if len(lost) == len(answered):
        raise CompressError(
            f"no SQuAD training example has its answer in its context: in all {len(lost)} answered examples the "
            "answer text is not at answer_start; answer_start must be the 0-based character offset of the text in context"
        )
    log.warning(
        "dropped %d of %d SQuAD training examples whose answer text is not at answer_start in their context; "
        "check those examples' answer_start offsets",
        len(lost), len(ds),
    )
    return ds.select([i for i in range(len(ds)) if i not in lost])


def squad_eval_features(ds, tokenizer, max_length: int = 384, doc_stride: int = 128):
    """SQuAD evaluation features: windows keep ``example_id`` and an ``offset_mapping``
    whose non-context entries are None, so spans can only come from the context."""
    _check_stride(max_length, doc_stride)

    def encode(batch):
        enc = _squad_windows(batch, tokenizer, max_length, doc_stride)
        sample_map = enc.pop("overflow_to_sample_mapping")
        enc["example_id"] = []
        for i in range(len(enc["input_ids"])):
            seq_ids = enc.sequence_ids(i)
            enc["example_id"].append(batch["id"][sample_map[i]])
            enc["offset_mapping"][i] = [
                off if seq_ids[k] == 1 else None for k, off in enumerate(enc["offset_mapping"][i])
            ]
        return enc

    return ds.map(encode, batched=True, remove_columns=ds.column_names, desc="SQuAD eval features")


def _squad_windows(batch, tokenizer, max_length: int, doc_stride: int):
    """Question + context windows of at most ``max_length`` tokens overlapping by ``doc_stride``."""
    questions, contexts = _question_context(batch)
    return tokenizer(
        questions,
        contexts,
        truncation="only_second",
        max_length=max_length,
        stride=doc_stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
    )


def _check_stride(max_length: int, doc_stride: int) -> None:
    if not 0 < doc_stride < max_length:
        raise CompressError(
            f"--doc-stride {doc_stride} must be positive and below --max-length {max_length}"
        )


def _question_context(rows) -> tuple[list[str], list[str]]:
    """SQuAD model inputs: (questions, contexts) of a dataset or a batch."""
    questions = [q.lstrip() for q in rows["question"]]  # leading spaces waste tokens in some vocabularies
    return questions, list(rows["context"])


def encode_examples(task: Task, tokenizer, rows, max_length: int, **kwargs):
    """Tokenise ``rows`` (a dataset or a batch) as one sequence per example, as the task's model reads them.

    Sentence tasks cut the longest text; SQuAD keeps the question and cuts the context
    (its first window only: :func:`squad_train_features` / :func:`squad_eval_features` make every window).
    ``kwargs`` go to the tokenizer (``padding``, ``return_tensors``).
    """
    texts, options = _BY_KIND[task.kind].texts(task, rows)
    if task.kind == TOKEN:
        check_fast(tokenizer)
    return tokenizer(*texts, max_length=max_length, **options, **kwargs)


# ---------------------------------------------------------------------------- per kind of task


@dataclass(frozen=True)
class _KindData:
    """How the examples of one kind of task are found, read, checked and tokenised."""

    local_files: Callable[[Task], str]  # what --data-dir should hold, for error messages
    from_table: Callable  # (dataset, task, where) -> the dataset of a parquet table, columns and labels checked
    from_file: Callable  # (task, split, path, columns) -> the dataset of one user file
    parse_label: Callable  # (task, raw, where, encoding) -> one gold label
    texts: Callable  # (task, rows) -> (model input texts, tokenizer options): one sequence per example
    train_features: Callable  # (dataset, task, tokenizer, TaskData, max_length) -> tokenised training features


def _glue_hint(task: Task) -> str:
    return f"(e.g. DIR/{task.folders[0]}/dev.tsv from the GLUE download script, or the hub's parquet files)"


def _squad_hint(task: Task) -> str:
    return f"(a folder with {', '.join(s for sp in task.splits for s in sp.squad_files)})"


def _no_labels(task: Task, raw: Any, where: str, encoding: str):
    raise CompressError(f"{where}: {task.display} examples carry answers, not labels")


def _squad_table(ds, task: Task, where: str):
    return _check_squad_columns(ds, where)


def _sentence_texts(task: Task, rows):
    return tuple(list(rows[f]) for f in task.text_fields), {"truncation": True}  # datasets 5 columns are not lists


def _squad_texts(task: Task, rows):
    return _question_context(rows), {"truncation": "only_second"}  # keep the question, cut the context


def _word_texts(task: Task, rows):
    return ([list(w) for w in rows["tokens"]],), {"truncation": True, "is_split_into_words": True}


def _user_hint(task: Task) -> str:
    return "(your own task reads --train-file / --dev-file / --test-file, or --data-file)"


def _no_table(ds, task: Task, where: str):
    raise CompressError(f"{task.display} is your own task: its data comes from --train-file/--dev-file, not --data-dir")


def _tag_label(task: Task, raw: Any, where: str, encoding: str) -> int:
    return _parse_tag(task, raw, where)


def _token_train_features(ds, task: Task, tokenizer, data: TaskData, max_length: int):
    return token_features(ds, tokenizer, max_length, what=f"{task.display} training")


def _sentence_features(ds, task: Task, tokenizer, data: TaskData, max_length: int):
    return tokenize_classification(ds, task, tokenizer, max_length).remove_columns(["idx"])


def _squad_features(ds, task: Task, tokenizer, data: TaskData, max_length: int):
    return squad_train_features(ds, tokenizer, max_length, data.doc_stride)


# Sentence tasks and SQuAD are two different algorithms (text fields + a label, one encoding
# per example; question/context/answers, windows over long contexts), and a score parses
# differently from a class label. This table is the module's one dispatch on the kind of task.
_SENTENCES = _KindData(_glue_hint, _sentence_table, _sentence_file, _parse_class, _sentence_texts, _sentence_features)
_BY_KIND: dict[str, _KindData] = {
    CLASSIFICATION: _SENTENCES,
    MULTI_LABEL: replace(_SENTENCES, local_files=_user_hint, from_table=_no_table, parse_label=_parse_multi),
    REGRESSION: replace(_SENTENCES, parse_label=_parse_score),
    TOKEN: _KindData(_user_hint, _no_table, _token_file, _tag_label, _word_texts, _token_train_features),
    SPAN: _KindData(_squad_hint, _squad_table, _squad_file, _no_labels, _squad_texts, _squad_features),
}
