"""Where a task's data comes from, and loading its splits: the hub, a local GLUE/SQuAD folder, or one data file.

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
official SQuAD JSON files; read by :mod:`compress.core.data.glue_squad`), or one
csv/tsv/json/jsonl/parquet/SQuAD-JSON file with an optional column mapping
(:mod:`compress.core.data.data_files`). The training features come from
:mod:`compress.core.data.features`; labels are parsed by :mod:`compress.core.data.labels`.
The options (:class:`TaskData`, :class:`TaskOptions`, :class:`DataSource`) live in
:mod:`compress.core.data.config`, apart from the readers. A training stage reads every split
with :func:`read_task_data` before it opens its model's weights or tokenizer.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from compress.core.errors import CompressError, reason
from compress.core.hub import hub_offline_mode, hub_reachable, offline_as_set_now
# The options live apart, so that a command's flags cost no reader's import; every stage reads them from here too.
from compress.core.data.config import EVAL_BATCH_SIZE, DataSource, TaskData, TaskOptions  # noqa: F401
from compress.core.data.data_files import load_file
from compress.core.data.features import train_features
from compress.core.data.glue_squad import check_squad_columns, read_glue_tsv, read_parquet, read_squad_json, sentence_table
from compress.core.data.tasks import Split, Task


@dataclass(frozen=True)
class TaskSplits:
    """Every split a training stage reads, raw (hub schema), each read and checked: made before any model file."""

    train: Any  # the training examples (datasets.Dataset), subsampled to max_train_examples
    dev: dict[str, Any]  # dev split name -> raw examples
    test: Any = None  # the --test-file examples, or None without one

    @property
    def n_train(self) -> int:
        return len(self.train)


def read_task_data(task: Task, data: TaskData, seed: int = 0) -> TaskSplits:
    """Read the train, dev and test splits of ``task``, raw: every column, label, delimiter and kind is checked here.

    A stage calls it before it opens its model's weights or tokenizer, so that a wrong ``--text-column``, a dev label
    the training data lacks or a TSV named .csv is said at once, whatever the model's size.
    """
    return TaskSplits(load_train_split(task, data, seed), load_dev_splits(task, data), load_test_split(task, data))


def load_task_data(task: Task, tokenizer, data: TaskData, max_length: int, seed: int = 0):
    """Tokenised training features, one raw dev dataset per dev split, and the training-set size.

    Classification/regression features hold input ids, segments, mask and ``labels``;
    SQuAD features are windows with start/end positions. ``max_train_examples``
    subsamples with ``seed`` (reports must say so). The dev splits are read before the
    training set is tokenised: a bad dev file fails before that work.
    """
    train_ds = load_train_split(task, data, seed)
    dev = load_dev_splits(task, data)
    return train_features(train_ds, task, tokenizer, max_length, doc_stride=data.doc_stride), dev, len(train_ds)


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
    ds = read_once((task, split, source), lambda: _read(task, spec, source))
    if max_examples is not None and max_examples < len(ds):
        if max_examples < 1:
            raise CompressError(f"--max-examples must be at least 1, got {max_examples}")
        ds = ds.select(range(max_examples))
    return ds


def _read(task: Task, spec: Split, source: DataSource):
    """One split from its source, refused when it holds no example."""
    if source.data_file:
        ds = load_file(task, spec, Path(source.data_file), dict(source.columns))
    elif source.data_dir:
        ds = _from_dir(task, spec, Path(source.data_dir))
    else:
        ds = _from_hub(task, spec)
    if len(ds) == 0:
        raise CompressError(
            f"{task.display} {spec.name}: the data from {source.description} has no examples; "
            "check the file or pass a different --data-dir/--data-file"
        )
    return ds


# ---------------------------------------------------------------------------- read once per command

_kept: dict | None = None  # what was read, by what it was read from (a split: (task, split, source)), while reading_once() holds


@contextlib.contextmanager
def reading_once() -> Iterator[None]:
    """Within it, a split of a task is read from its source once: a later :func:`load_split` of the same split gets the
    examples the first one read (cut again to its own ``max_examples``); so are the labels a task is made from
    (:mod:`compress.core.data.resolve`).

    The command line holds it around its data check and the stage (:mod:`compress.core.data.check`), so a big file the
    check read is not read again by the stage. What reads a dataset makes new ones (map, select, shuffle), so sharing
    one is safe; what was kept goes at the end. Nested, the outermost one keeps.
    """
    global _kept
    if _kept is not None:
        yield
        return
    _kept = {}
    try:
        yield
    finally:
        _kept = None


def read_once(key: tuple, read: Callable[[], Any]):
    """``read()``, or what it returned for ``key`` before inside :func:`reading_once` (outside it: ``read()``)."""
    if _kept is None:
        return read()
    try:
        hash(key)
    except TypeError:  # a task built with a list in it: read again rather than fail
        return read()
    if key not in _kept:
        _kept[key] = read()
    return _kept[key]


# ---------------------------------------------------------------------------- hub


def _from_hub(task: Task, split: Split):
    # deferred: a heavy import, paid only where it is used
    import datasets

    what = f"{task.display} ({task.hub_path}" + (f", {task.hub_config})" if task.hub_config else ")")
    local_hint = "pass --data-dir DIR pointing at local files " + _folder_data(task).local_files(task)
    if not hub_offline_mode() and not hub_reachable():
        raise CompressError(
            f"cannot download task {what}: the Hugging Face hub is unreachable; {local_hint}"
        )
    try:
        with offline_as_set_now():
            ds = datasets.load_dataset(task.hub_path, task.hub_config, split=split.hub)
    except Exception as err:  # datasets raises many types; the user needs one line
        if hub_offline_mode():
            why = "offline mode (HF_HUB_OFFLINE) is on and the data is not in the local cache"
        else:
            why = reason(err)
        raise CompressError(
            f"cannot load task {what} split {split.hub} from the Hugging Face hub: {why}; {local_hint}"
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
    """One split from a data folder: SQuAD's JSON file, the split's GLUE TSV, or the hub's parquet files, first found."""
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
        return _folder_data(task).from_table(read_parquet(parquet), task, str(parquet[0]))
    expected = list(split.squad_files) or list(split.tsv.files if split.tsv else [])
    raise CompressError(
        f"no {task.display} {split.name} data in {folder}: expected "
        f"{' or '.join(expected + [split.hub + '*.parquet'])}; "
        f"point --data-dir at the GLUE root (with {task.folders[0]}/) or at the task's folder"
    )


# ---------------------------------------------------------------------------- per layout of examples


@dataclass(frozen=True)
class _FolderData:
    """Where the examples of one layout (``TaskKind.layout``) are found in a data folder."""

    local_files: Callable[[Task], str]  # what --data-dir should hold, for error messages
    from_table: Callable  # (dataset, task, where) -> the dataset of a parquet table, columns and labels checked


def _glue_hint(task: Task) -> str:
    return f"(e.g. DIR/{task.folders[0]}/dev.tsv from the GLUE download script, or the hub's parquet files)"


def _squad_hint(task: Task) -> str:
    return f"(a folder with {', '.join(s for sp in task.splits for s in sp.squad_files)})"


def _user_hint(task: Task) -> str:
    return "(your own task reads --train-file / --dev-file / --test-file, or --data-file)"


def _squad_table(ds, task: Task, where: str):
    return check_squad_columns(ds, where)


def _no_table(ds, task: Task, where: str):
    raise CompressError(f"{task.display} is your own task: its data comes from --train-file/--dev-file, not --data-dir")


# Benchmark sentence tasks (GLUE folders, parquet tables with text fields and a label) and SQuAD
# (its JSON files, question/context/answers tables) are found differently; a user's own task has
# no folder at all. Reading a file, parsing a label and tokenising each have their own table.
_OWN_TASK = _FolderData(_user_hint, _no_table)
_BY_LAYOUT: dict[str, _FolderData] = {
    "sentences": _FolderData(_glue_hint, sentence_table),
    "words": _OWN_TASK,  # word lists with tags: only a user's own files hold them
    "squad": _FolderData(_squad_hint, _squad_table),
}


def _folder_data(task: Task) -> _FolderData:
    """How ``task``'s examples are found in a data folder: a user's own task has none; a benchmark's, by its layout."""
    return _OWN_TASK if task.user else _BY_LAYOUT[task.behaviour.layout]
