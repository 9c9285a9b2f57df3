"""A task's split read from one data file (``--train-file``/``--dev-file``/``--test-file``/``--data-file``).

The file's rows come from :mod:`compress.core.data.files` (csv/tsv/json/jsonl/parquet, a ``datasets``
folder, CoNLL); here their columns are mapped onto the task's fields (``--columns``, the own-task
``--*-column`` flags), their labels parsed, and the result made a dataset in the hub's schema. A
preset's GLUE TSV and SQuAD's JSON or parquet files are read as ``--data-dir`` reads them.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

from compress.core.errors import CompressError
from compress.core.data.files import SAVED_DATASET, Record, is_conll, is_saved_dataset, read_conll, read_table, read_tsv_rows
from compress.core.paths import check_input_file
from compress.core.data.glue_squad import (
    INDEX_COLUMNS,
    check_squad_columns,
    glue_dataset,
    in_glue_layout,
    make_dataset,
    parse_index,
    read_parquet,
    read_squad_json,
)
from compress.core.data.labels import no_label, parse_label, parse_tags, unlabelled
from compress.core.data.tasks import LABEL, UNLABELLED, Split, Task

log = logging.getLogger(__name__)


def load_file(task: Task, split: Split, path: Path, columns: dict[str, str]):
    """One file: csv/tsv/json/jsonl/parquet, a ``datasets`` save_to_disk folder, CoNLL (token tasks) or SQuAD JSON."""
    if not is_saved_dataset(path):
        check_input_file(path, "data file", folder=SAVED_DATASET)  # a FIFO, a device, an empty file: said as such
    return _READERS[task.behaviour.layout](task, split, path, columns)


def _squad_file(task: Task, split: Split, path: Path, columns: dict[str, str]):
    """SQuAD from one file: the hub's parquet rows or official JSON (``columns`` is not used)."""
    if path.suffix.lower() == ".parquet":
        return check_squad_columns(read_parquet([path]), str(path))
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
        if rows and in_glue_layout(task, split, rows[0]):
            return glue_dataset(rows, path, task, split)
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
            index.append(parse_index(values.get(index_key), where))
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
        if no_label(task, raw):
            if split.labelled and split.name != "test":
                raise CompressError(f"{where}: no label (column {mapping[LABEL]!r}); fill it in or remove the row")
            labels.append(unlabelled(task))
        else:
            labels.append(parse_label(task, raw, where, column=mapping[LABEL]))
    return make_dataset(task, out, labels, index)


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
    iob1: list[str] = []  # where each sentence whose tags were IOB1 first had an entity start with I-
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
            ids, first = parse_tags(task, raw, record.token_where)  # a bad tag: its own line
            if first is not None:
                iob1.append(record.token_where(first))
            tags.append(ids)
        words.append(sentence)
    if iob1:
        log.warning("%s: %d sentence(s) start an entity with I- (first at %s), as IOB1 tags do: read as IOB1 and "
                    "converted to BIO, where every entity starts with B-", path, len(iob1), iob1[0])
    return make_dataset(task, {"tokens": words}, tags, None)


# One reader per way a kind's rows are laid out (``TaskKind.layout``): (task, split, path, columns) -> the split's dataset.
_READERS: dict[str, Callable[[Task, Split, Path, dict[str, str]], Any]] = {
    "sentences": _sentence_file,
    "words": _token_file,
    "squad": _squad_file,
}
