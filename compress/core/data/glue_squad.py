"""Reading GLUE and SQuAD data as published: GLUE TSVs, the hub's parquet tables, official SQuAD JSON.

Each reader returns a ``datasets.Dataset`` in the hub's schema (:func:`dataset_features`,
:func:`squad_features`), the one every source of task data produces: a sentence task's text
fields, ``label`` and ``idx``; SQuAD's ``id``, ``title``, ``context``, ``question`` and ``answers``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from compress.core.config import loads_json
from compress.core.errors import CompressError
from compress.core.data.files import read_text_file, read_tsv_rows
from compress.core.data.labels import parse_label
from compress.core.data.tasks import LABEL, UNLABELLED, Split, Task, TsvSpec

INDEX_COLUMNS = "index|idx"  # the column that numbers a split's examples (GLUE TSVs: index; the hub: idx)


def parse_index(raw: Any, where: str) -> int:
    """An example's own index (an integer), as its source file numbers it."""
    try:
        value = float(str(raw).strip())
    except ValueError:
        value = math.nan
    if not value.is_integer():
        raise CompressError(f"{where}: index {raw!r} is not an integer; the index column numbers the examples")
    if not -(2**63) <= value < 2**63:  # the dataset stores it as int64
        raise CompressError(f"{where}: index {raw!r} is too large; the index column numbers the examples")
    return int(value)


def make_dataset(task: Task, columns: dict[str, list[Any]], labels: list[Any], index: list[int] | None = None):
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
    text = datasets.Sequence(datasets.Value("string")) if kind.tagged_words else datasets.Value("string")
    label = datasets.Value(kind.label_dtype)
    return datasets.Features({
        **{f: text for f in task.text_fields},
        LABEL: datasets.Sequence(label) if kind.label_list else label,
        "idx": datasets.Value("int64"),
    })


# ---------------------------------------------------------------------------- GLUE TSV


def _column_index(header: list[str], want: str | int) -> int | None:
    """The position of column ``want`` (a name, ``a|b`` for either, or already a position) in ``header``."""
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
    return glue_dataset(read_tsv_rows(path), path, task, split)


def glue_dataset(rows: list[list[str]], path: Path, task: Task, split: Split):
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
            index.append(parse_index(row[index_col] if index_col < len(row) else None, f"{path}:{line_no}"))
    return make_dataset(task, columns, labels, index)


def _fields_needed(text_cols: list[int], label_col: int | None) -> int:
    """How many tab-separated fields a row needs to hold the text and label columns."""
    return max([*text_cols, label_col if label_col is not None else -1]) + 1


def in_glue_layout(task: Task, split: Split, first: list[str]) -> bool:
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


# ---------------------------------------------------------------------------- parquet


def read_parquet(paths: list[Path]):
    """The rows of one split's parquet files as one dataset, columns as stored (the caller checks them by task)."""
    # deferred: a heavy import, paid only where it is used
    import datasets

    try:
        # Straight through pyarrow: no cache files, no "generating split" noise.
        table = pa.concat_tables([pq.read_table(p) for p in paths], promote_options="default")
    except Exception as err:
        raise CompressError(f"cannot read parquet file(s) {', '.join(map(str, paths))}: {err}") from None
    return datasets.Dataset(table)


def sentence_table(ds, task: Task, where: str):
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
    index = [parse_index(v, f"{where} row {i}") for i, v in enumerate(ds["idx"])] if "idx" in ds.column_names else None
    return make_dataset(task, columns, checked, index)


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
    """The hub schema of SQuAD: ``id``, ``title``, ``context``, ``question``, ``answers`` (texts and start offsets)."""
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


def check_squad_columns(ds, where: str):
    """``ds`` (a SQuAD table read from ``where``), refused when it lacks a column the model inputs or scores need."""
    missing = [c for c in ("id", "context", "question", "answers") if c not in ds.column_names]
    if missing:
        raise CompressError(f"{where}: missing SQuAD column(s) {', '.join(missing)}")
    return ds
