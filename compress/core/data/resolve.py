"""The task of a run: a benchmark preset, a user's own task made from its files, or a model folder's.

Every stage asks :func:`resolve_task` once, with what it was given:

* a preset name (``sst2``, ``squad``): the registry's task, as always;
* a kind (``--task text-classification``, ``multi-label``, ``regression``,
  ``token-classification``) and a training file: a new task whose label names are read from
  that file (sorted; tags with ``O`` first; or ``--labels`` in the order given);
* nothing, and a model folder: the task the folder was made for — what its compression.json
  (or a parent's) records, else what its config.json says (``id2label``, ``problem_type``, the
  architecture), which also recognises a fine-tuned model made by other tools.

A folder's task wins over a kind (a distilled student keeps its teacher's label order);
``--text-column`` and the other :class:`TaskOptions` then only say where a new file keeps
its columns. Training data whose labels are not the folder's label set is refused in one
line that lists the differences.

A model folder here is anything with a folder's ``path``, ``record``, ``head`` and ``config``: the stages pass the
:class:`~compress.core.formats.folder.ModelFolder` they opened, the command line's data check
(:mod:`compress.core.data.check`) a view of its JSON files; this module imports no model library.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compress.core.formats.records import lineage
from compress.core.data.labels import label_names_in
from compress.core.data.sources import TaskOptions, read_once
from compress.core.errors import CompressError
from compress.core.lazy import load
from compress.core.data.tasks import (
    LABEL,
    TASKS,
    USER_KINDS,
    Task,
    TaskKind,
    get_task,
    is_kind,
    kind_for_head,
    task_from_record,
    user_kind,
    user_task,
)

if TYPE_CHECKING:
    from compress.core.formats.folder import ModelFolder

# File names that say which split a file is, not what the task is: the folder names the task then.
_SPLIT_WORDS = re.compile(r"^(train|training|dev|valid|validation|val|test|data|dataset|all)([-_.]?\w*)?$", re.IGNORECASE)


def resolve_task(name: str | None, options: TaskOptions | None = None, *, train_file: str | Path | None = None,
                 model: ModelFolder | str | Path | None = None) -> Task:
    """The task ``name`` (a preset or a kind) means here, or ``model``'s own (a folder's record, or a path or hub
    id) when ``name`` is empty."""
    options = options or TaskOptions()
    if name and not is_kind(name):
        task = get_task(name)
        if options.given:
            raise CompressError(f"{task.display} is a benchmark task with its own columns and labels; --text-column, "
                                "--label-column, --labels and the like describe your own task (--task KIND): map a "
                                "file's columns onto a benchmark task with --columns FIELD=COLUMN")
        return task
    recorded = None if not model else task_of_model(model) if isinstance(model, (str, Path)) else task_of_folder(model)
    if recorded is not None:
        if name and recorded.kind != name:
            raise CompressError(f"{model} was made for {recorded.display}, a {recorded.kind} task; --task {name} does not "
                                f"fit it (leave --task out to use the model's own task)")
        if not recorded.user:
            return resolve_task(recorded.name, options)  # a preset: its columns are fixed
        task = with_options(recorded, options)
        if train_file:
            check_label_set(task, Path(train_file), model)
        return task
    if not name:
        where = f"{model} records no task and its config.json has no task head" if model else "no model records one"
        raise CompressError(f"no --task given and {where}; pass --task with a kind of your own data "
                            f"({', '.join(USER_KINDS)}) or a benchmark task ({', '.join(list(TASKS)[:4])}, ...)")
    if not train_file:
        raise CompressError(f"--task {name} makes your own task from its training file: pass --train-file FILE "
                            "(and --dev-file), or a model folder already fine-tuned on the task")
    return task_from_file(name, Path(train_file), options)


def task_from_file(kind: str, train_file: Path, options: TaskOptions) -> Task:
    """A user's task of ``kind``: labels from ``train_file`` (or ``--labels``), columns and name from ``options``."""
    behaviour = user_kind(kind)
    draft = user_task(kind, "draft", behaviour.sample_labels, pair=bool(options.text_pair_column),
                      columns=_columns(behaviour, options), label_sep=options.label_sep)
    found = _labels_in(draft, train_file) if behaviour.named_labels else []
    if options.labels:
        unknown = sorted(set(found) - set(options.labels))
        if unknown:
            raise CompressError(f"{train_file} holds label(s) {', '.join(unknown[:10])} that --labels does not list; "
                                "add them to --labels or fix the data")
        labels = list(options.labels)
    else:
        labels = ordered_labels(behaviour, found)
    return user_task(kind, options.task_name or default_name(train_file), tuple(labels),
                     pair=bool(options.text_pair_column), columns=_columns(behaviour, options),
                     label_sep=options.label_sep, threshold=options.threshold)


def _labels_in(task: Task, train_file: Path) -> list[str]:
    """The labels ``train_file`` holds, read once per command (the data check and the stage resolve the same task)."""
    return read_once(("labels", task, Path(train_file)), lambda: label_names_in(task, Path(train_file)))


def ordered_labels(kind: TaskKind, found: list[str]) -> list[str]:
    """Labels in output order: sorted (numerically when every name is an integer); BIO tags O first, then per type B, I."""
    if kind.tagged_words:
        return sorted(found, key=lambda t: (t != "O", t[2:], t[:1]))
    if found and all(re.fullmatch(r"-?\d+", f) for f in found):
        return sorted(found, key=int)
    return sorted(found)


def default_name(train_file: Path) -> str:
    """A task's name from its training file: ``banking77/train.csv`` -> banking77, ``reviews.csv`` -> reviews."""
    path = Path(train_file).absolute()
    stem = path.name if path.is_dir() else path.stem
    if _SPLIT_WORDS.match(stem) and path.parent.name:
        return path.parent.name
    return stem


def _columns(kind: TaskKind, options: TaskOptions) -> tuple[tuple[str, str], ...]:
    """(field, column) pairs: the kind's defaults, then what the options name."""
    columns = dict(kind.columns)
    if options.text_column:
        columns[kind.fields[0]] = options.text_column
    if options.text_pair_column:
        columns["text_pair"] = options.text_pair_column
    if options.label_column:
        columns[LABEL] = options.label_column
    return tuple(columns.items())


def with_options(task: Task, options: TaskOptions) -> Task:
    """A folder's task with the columns, separator and threshold the options give (labels renamed by --labels)."""
    if options.text_pair_column and not task.is_pair:
        raise CompressError(f"{task.display} reads one text per example; --text-pair-column does not apply")
    columns = {**dict(task.columns), **dict(_columns(task.behaviour, options))}
    labels = task.label_names
    if options.labels:
        if len(options.labels) != len(labels):
            raise CompressError(f"--labels names {len(options.labels)} labels but the model has {len(labels)} outputs "
                                f"({', '.join(labels[:8])}{', ...' if len(labels) > 8 else ''})")
        labels = tuple(options.labels)
    return user_task(task.kind, options.task_name or task.name, labels, pair=task.is_pair, columns=tuple(columns.items()),
                     label_sep=options.label_sep if options.label_sep is not None else task.label_sep,
                     threshold=options.threshold if options.threshold is not None else task.threshold)


def check_label_set(task: Task, train_file: Path, model: str | Path | None) -> None:
    """Refuse training data whose labels are not the model's: one line listing what differs both ways."""
    if not task.behaviour.named_labels:
        return
    found = set(_labels_in(task, train_file))
    have = set(task.label_names)
    if found == have:
        return
    extra, missing = sorted(found - have), sorted(have - found)
    parts = []
    if extra:
        parts.append(f"in the data but not the model: {', '.join(extra[:10])}" + (f" (+{len(extra) - 10})" if len(extra) > 10 else ""))
    if missing:
        parts.append(f"in the model but not the data: {', '.join(missing[:10])}" + (f" (+{len(missing) - 10})" if len(missing) > 10 else ""))
    raise CompressError(f"{train_file} does not have the label set of {model} ({len(have)} labels): {'; '.join(parts)}; "
                        "train on data with the model's labels, or fine-tune a new model from its base encoder")


# ---------------------------------------------------------------------------- a model folder's task


def task_of_model(model: str | Path) -> Task | None:
    """:func:`task_of_folder` of the model folder at ``model``; a folder without config.json has only its records.

    None for a folder that has no task head (a bare encoder), or a hub id that is not a folder.
    """
    path = Path(model)
    if not path.is_dir():
        return None
    if not (path / "config.json").is_file():
        return recorded_task(lineage(path))
    return task_of_folder(load("compress.core.formats.folder:open_folder")(path))  # transformers: loaded here


def task_of_folder(folder: ModelFolder) -> Task | None:
    """The task ``folder`` was made for: recorded in its (or a parent's) compression.json, else read off its config.

    None for a folder that has no task head (a bare encoder).
    """
    recorded = recorded_task(lineage(folder.path, record=folder.record))
    return recorded if recorded is not None else task_from_config(folder)


def recorded_task(records) -> Task | None:
    """The first task a lineage's records (``(folder, compression.json)`` pairs) name; None when none does, or when
    the first name is one this toolkit does not know (the config is read then)."""
    for _, record in records:
        spec = record.get("task_spec")
        if isinstance(spec, dict):
            return task_from_record(spec)
        named = record.get("task") or (record.get("config") or {}).get("task")
        if isinstance(named, str) and named and not is_kind(named):
            try:
                return get_task(named)
            except CompressError:
                break  # a name this toolkit does not know: read the config
    return None


def task_from_config(folder: ModelFolder) -> Task | None:
    """A task from config.json alone: the head (architecture), ``problem_type`` and ``id2label``."""
    head, config, path = folder.head, folder.config, folder.path
    labels = _id2label(config)
    kind = kind_for_head(head, getattr(config, "problem_type", None), len(labels))
    return None if kind is None else user_task(kind, path.name, labels)


def _id2label(config: Any) -> tuple[str, ...]:
    """Label names in output order from ``id2label`` (keys may be strings in a JSON config).

    transformers' generic names (``LABEL_0``, ...) say only the index: they become ``0``, ``1``, ...,
    which is what a file of integer labels holds (string labels are refused with the difference).
    """
    mapping = {int(k): str(v) for k, v in (getattr(config, "id2label", None) or {}).items()}
    n = getattr(config, "num_labels", len(mapping)) or len(mapping)
    names = tuple(mapping.get(i, f"LABEL_{i}") for i in range(n))
    if all(name == f"LABEL_{i}" for i, name in enumerate(names)):
        return tuple(str(i) for i in range(n))
    return names


def task_fields(task: Task) -> dict[str, Any]:
    """What a stage writes into compression.json about its task: the name, and a user's task's full record."""
    return {"task": task.name, **({"task_spec": task.to_record()} if task.user else {})}
