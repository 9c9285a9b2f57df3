"""Parsing a task's gold labels: class names or indices, scores, multi-hot rows and BIO tags, one parser per form.

Every reader of task data (GLUE TSVs, parquet tables, a user's files) turns a raw cell into the
task's label here, so a label is refused with the same message wherever it comes from; and a
user's training file is read here for the label names a new task takes (:func:`label_names_in`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

from compress.core.errors import CompressError
from compress.core.data.files import is_conll, label_list, read_conll, read_table
from compress.core.data.tasks import BIO, LABEL, UNLABELLED, Task


def parse_label(task: Task, raw: Any, where: str, encoding: str = "auto") -> int | float:
    """Turn a raw label (index, name or number) into the task's label; errors name the valid ones."""
    return _PARSERS[task.behaviour.prediction](task, raw, where, encoding)


def parse_tag(task: Task, raw: Any, where: str) -> int:
    """A tag's index: a BIO tag the task has (``O``, ``B-TYPE``, ``I-TYPE``)."""
    text = str(raw).strip()
    if not BIO.match(text):
        raise CompressError(f"{where}: tag {text!r} is not in BIO form (O, B-TYPE, I-TYPE); convert the tags to IOB2")
    return _user_label(task, text, where)


def no_label(task: Task, raw: Any) -> bool:
    """A cell without a label: absent, blank (a multi-label row may have none: ``[]`` or an empty cell is read), or -1."""
    if raw is None:
        return True
    if task.behaviour.label_list:
        return False
    return (isinstance(raw, str) and raw.strip() == "") or raw == UNLABELLED


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
            names = label_list(raw, task.label_sep, record.where)
        elif kind.tagged_words:
            names = raw.split() if isinstance(raw, str) else [str(t) for t in (raw or [])]
        else:
            names = [] if raw is None or str(raw).strip() == "" else [str(raw).strip()]
        for i, name in enumerate(names):
            if kind.tagged_words and not BIO.match(name):
                raise CompressError(f"{record.token_where(i)}: tag {name!r} is not in BIO form (O, B-TYPE, I-TYPE); "
                                    "convert the tags to IOB2")
            seen.setdefault(name.strip(), None)
    return list(seen)


# ---------------------------------------------------------------------------- per form of label


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


def _tag_label(task: Task, raw: Any, where: str, encoding: str) -> int:
    return parse_tag(task, raw, where)


def _no_labels(task: Task, raw: Any, where: str, encoding: str):
    raise CompressError(f"{where}: {task.display} examples carry answers, not labels")


# A class label, a score, a multi-hot row and a tag parse differently; SQuAD's answers are no label. A gold label
# has the form of a prediction, so the parsers are keyed by the kind's ``TaskKind.prediction``.
# Each parser: (task, raw cell, where, encoding) -> one gold label.
_PARSERS: dict[str, Callable[[Task, Any, str, str], Any]] = {
    "label": _parse_class,
    "labels": _parse_multi,
    "score": _parse_score,
    "tags": _tag_label,
    "answer": _no_labels,
}
