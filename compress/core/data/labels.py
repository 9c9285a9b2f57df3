"""Parsing a task's gold labels: class names or indices, scores, multi-hot rows and BIO tags, one parser per form.

Every reader of task data (GLUE TSVs, parquet tables, a user's files) turns a raw cell into the
task's label here, so a label is refused with the same message wherever it comes from; and a
user's training file is read here for the label names a new task takes (:func:`label_names_in`).

What a label may not be, wherever it comes from: a score that is not a finite number (``inf``
trains to NaN), a name holding a control character (a NUL makes a class of its own), a list in
a task of one label per row (a multi-label row given to text-classification). IOB1 tags (an
entity may start with ``I-``) are read as the BIO tags they stand for (:func:`bio_tags`).
"""

from __future__ import annotations

import math
import struct
import unicodedata
from pathlib import Path
from typing import Any, Callable

from compress.core.errors import CompressError
from compress.core.data.files import Record, is_conll, json_list, label_list, read_conll, read_table
from compress.core.data.tasks import BIO, LABEL, UNLABELLED, Task


def parse_label(task: Task, raw: Any, where: str, encoding: str = "auto", column: str | None = None) -> int | float:
    """Turn a raw label (index, name or number) into the task's label; errors name the valid ones (and ``column``,
    the file's column the label is in, where the caller knows it)."""
    return _PARSERS[task.behaviour.prediction](task, raw, where, encoding, column)


def checked_name(name: str, where: str, what: str = "label") -> str:
    """``name`` when it holds no control character (Unicode category Cc: C0, DEL, C1); else refused naming the first,
    the name shown escaped. ``what`` is "label" or "tag"."""
    bad = next((c for c in name if unicodedata.category(c) == "Cc"), None)
    if bad is not None:
        raise CompressError(f"{where}: the {what} {name!r} holds a control character (U+{ord(bad):04X}); a {what} is "
                            "plain text: remove the character (it would make a class of its own)")
    return name


def one_name(task: Task, raw: Any, where: str) -> str:
    """The label name in a cell of a task of one label per row: its text, stripped and checked.

    A list (a JSON list in text, or a list value) is refused: it would become one class named after
    the whole list. A multi-label task reads it (:func:`compress.core.data.files.label_list`).
    """
    if isinstance(raw, dict):
        raise CompressError(f"{where}: the label {raw!r} is a JSON object, not a label name")
    text = str(raw).strip()
    if isinstance(raw, (list, tuple)) or json_list(text) is not None:
        shown = text if isinstance(raw, str) else repr(list(raw))
        raise CompressError(f"{where}: the label {shown!r} is a list, but a {task.kind} task takes one label per "
                            "row; for several labels per row use --task multi-label, each row's labels a JSON list "
                            "([\"a\", \"b\"]) or names split at --label-sep")
    return checked_name(text, where)


def bio_tags(tags: list[str]) -> tuple[list[str], int | None]:
    """A sentence's tags in BIO (IOB2), and the position of the first tag changed (None: none was).

    IOB1 (Ramshaw and Marcus 1995, as CoNLL-2003's original files use it) starts an entity with
    ``I-`` and keeps ``B-`` for an entity directly after one of its own type; BIO starts every
    entity with ``B-``. So an ``I-`` tag that continues nothing (at the start, after ``O``, after
    another type) becomes ``B-``; every other tag is kept, and BIO tags come back unchanged.
    """
    out: list[str] = []
    first = None
    for i, tag in enumerate(tags):
        previous = out[-1] if out else "O"
        continues = previous.startswith(("B-", "I-")) and previous[2:] == tag[2:]
        if tag.startswith("I-") and not continues:
            tag = "B-" + tag[2:]
            first = i if first is None else first
        out.append(tag)
    return out, first


def parse_tags(task: Task, raw: list | tuple, where: Callable[[int], str]) -> tuple[list[int], int | None]:
    """A sentence's tag indices, IOB1 read as BIO (:func:`bio_tags`), and the first position converted (None: none).

    ``where(i)`` places tag ``i`` (its own line in a CoNLL file). A tag refused after conversion is
    named as the file has it when that is what is wrong (a control character, a type not in the task).
    """
    tags = [str(t).strip() for t in raw]
    bio, first = bio_tags(tags)
    ids = []
    for i, (tag, read) in enumerate(zip(tags, bio)):
        try:
            ids.append(parse_tag(task, read, where(i)))
        except CompressError:
            if read != tag:
                parse_tag(task, tag, where(i))  # raises in the file's own terms when the tag itself is bad
            raise
    return ids, first


def parse_tag(task: Task, raw: Any, where: str) -> int:
    """A tag's index: a BIO tag the task has (``O``, ``B-TYPE``, ``I-TYPE``)."""
    text = checked_name(str(raw).strip(), where, "tag")
    if not BIO.match(text):
        raise CompressError(f"{where}: tag {text!r} is not in BIO form (O, B-TYPE, I-TYPE); convert the tags to IOB2")
    return _user_label(task, text, where)


def no_label(task: Task, raw: Any) -> bool:
    """A cell without a label: absent, blank (empty text or a NaN; a multi-label row may have none: ``[]`` or an empty
    cell is read), or -1."""
    if raw is None:
        return True
    if task.behaviour.label_list:
        return False
    return _blank(raw) or raw == UNLABELLED


def _blank(raw: Any) -> bool:
    """An empty cell: blank text, or a float NaN (a missing value in a parquet or JSON column, as pandas writes it)."""
    return (isinstance(raw, str) and raw.strip() == "") or (isinstance(raw, float) and math.isnan(raw))


def unlabelled(task: Task) -> Any:
    """The label of a row without one (a test split): -1, or a row of -1 for a multi-hot label."""
    kind = task.behaviour
    return [kind.unlabelled] * task.num_labels if kind.multi_hot else kind.unlabelled


def label_names_in(task: Task, path: Path) -> list[str]:
    """The label names a user's training file holds (tags for token classification), in first-seen order.

    The file's columns are ``task``'s (:attr:`Task.column_map`), a multi-label cell is split at its ``label_sep``.
    A missing label column names the columns the file has.
    """
    kind, mapping = task.behaviour, task.column_map
    label = mapping[LABEL]
    if kind.tagged_words and is_conll(path) and path.is_file():
        records = read_conll(path, mapping[task.text_fields[0]], label)
    else:
        records = read_table(path, "train")
    if records and label not in records[0].values:
        flag = "--label-column COLUMN"
        raise CompressError(f"{path}: no label column {label!r} (columns here: {', '.join(map(str, records[0].values))}); "
                            f"name it with {flag}")
    seen: dict[str, None] = {}
    for record in records:
        raw = record.values.get(label)
        if kind.multi_hot:
            names = [checked_name(n, record.where) for n in label_list(raw, task.label_sep, record.where)]
        elif kind.tagged_words:
            names = _tag_names(raw, label, record)
        else:
            names = [] if raw is None or _blank(raw) else [one_name(task, raw, record.where)]
        for name in names:
            seen.setdefault(name, None)
    return list(seen)


def _tag_names(raw: Any, column: str, record: Record) -> list[str]:
    """A training sentence's tags as names: checked, in BIO form, IOB1 read as BIO (:func:`bio_tags`)."""
    if raw is None:
        return []
    if not isinstance(raw, (str, list, tuple)):
        raise CompressError(f"{record.where}: column {column!r} must hold the sentence's tags, one per word, as a list "
                            f"or as text; found {raw!r}")
    tags = raw.split() if isinstance(raw, str) else [str(t).strip() for t in raw]
    for i, tag in enumerate(tags):
        checked_name(tag, record.token_where(i), "tag")
        if not BIO.match(tag):
            raise CompressError(f"{record.token_where(i)}: tag {tag!r} is not in BIO form (O, B-TYPE, I-TYPE); "
                                "convert the tags to IOB2")
    return bio_tags(tags)[0]


# ---------------------------------------------------------------------------- per form of label


def _parse_score(task: Task, raw: Any, where: str, encoding: str, column: str | None) -> float:
    """A regression target: a finite number inside the task's ``label_range`` (``encoding`` is moot).

    ``inf`` and ``nan`` are refused, and a number a float32 cannot hold (1e39 is stored as ``inf``):
    any of them makes the MSE loss NaN at its first batch.
    """
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise CompressError(f"{where}: label {raw!r} is not a number; {task.display} needs a score") from None
    shown = raw.strip() if isinstance(raw, str) else raw
    in_column = f" in column {column!r}" if column else ""
    if not math.isfinite(value):  # "inf", "nan", "1e999", JSON's Infinity and NaN
        raise CompressError(f"{where}: the score {shown!r}{in_column} is not a finite number; a {task.kind} target "
                            "is a real number: fix or remove the row")
    if math.isinf(struct.unpack("f", struct.pack("f", value))[0]):  # finite here, inf in the dataset's float32
        raise CompressError(f"{where}: the score {shown!r}{in_column} is beyond a 32-bit float (about 3.4e38), the "
                            f"type {task.kind} targets are stored in: fix or remove the row")
    lo, hi = task.label_range or (-math.inf, math.inf)
    if not lo <= value <= hi:
        raise CompressError(f"{where}: score {value} is outside {task.display}'s range [{lo}, {hi}]")
    return value


def _parse_class(task: Task, raw: Any, where: str, encoding: str, column: str | None) -> int:
    """A class index from a label name or (a preset's) 0-based index, as ``encoding`` allows."""
    names = task.label_names
    if task.user:  # a user's labels are names only: "7" is a name, never the 8th label
        return _user_label(task, one_name(task, raw, where), where)
    text = str(raw).strip()
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


def _user_label(task: Task, text: str, where: str) -> int:
    """The index of one of a user's label names; a name the task does not have is refused with a few it has."""
    names = task.label_names
    if text in names:
        return names.index(text)
    shown = ", ".join(names[:8]) + (f", ... ({len(names)} in all)" if len(names) > 8 else "")
    raise CompressError(f"{where}: label {text!r} is not one of {task.display}'s labels ({shown}); the labels come from "
                        "the training data, so a dev or test label must occur there (or fix the label)")


def _parse_multi(task: Task, raw: Any, where: str, encoding: str, column: str | None) -> list[float]:
    """A multi-hot row (K floats) from a cell holding a list of label names."""
    row = [0.0] * task.num_labels
    for name in label_list(raw, task.label_sep, where):
        row[_user_label(task, checked_name(name, where), where)] = 1.0
    return row


def _tag_label(task: Task, raw: Any, where: str, encoding: str, column: str | None) -> int:
    return parse_tag(task, raw, where)


def _no_labels(task: Task, raw: Any, where: str, encoding: str, column: str | None):
    raise CompressError(f"{where}: {task.display} examples carry answers, not labels")


# A class label, a score, a multi-hot row and a tag parse differently; SQuAD's answers are no label. A gold label
# has the form of a prediction, so the parsers are keyed by the kind's ``TaskKind.prediction``.
# Each parser: (task, raw cell, where, encoding, its column or None) -> one gold label.
_PARSERS: dict[str, Callable[[Task, Any, str, str, str | None], Any]] = {
    "label": _parse_class,
    "labels": _parse_multi,
    "score": _parse_score,
    "tags": _tag_label,
    "answer": _no_labels,
}
