"""The cheap checks of a command, made before its stage's heavy imports and any hub or data look-up.

Importing a stage's module (torch, transformers, datasets) takes seconds, tens of them on a
busy machine, and a mistyped ``--model`` should not wait for it. :func:`check_command`
makes the checks the command line can make from what it reads without that module: the
stage's model inputs, ``--out`` and ``--overwrite``, and the options a stage lists in
``Stage.early`` (from ``--config`` and the flags). Each is a check the stage makes too,
with the same message: it only comes sooner. The stage functions keep every check of
their own, so the library refuses the same inputs.

This module also holds what those checks share with the stages: :func:`check_output`
(every command's ``--out``), :func:`require_model_dir` and the hub names a model argument
may take (:func:`model_repo`). It imports the standard library and light modules of
``compress.core`` only; tests/core/test_preflight.py makes sure it stays so.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import is_dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from compress.core.budgets import budget_option
from compress.core.config import load_file
from compress.core.errors import CompressError
from compress.core.data.tasks import get_task, is_kind
from compress.core.paths import check_input_file, lock_output, output_path

# How a model input is checked early (``Input.check`` in compress.stages).
DIRECTORY = "dir"  # a model directory: refused when it is missing, a file, or holds no config.json
HUB = "hub"  # a directory, an alias or a hub id: refused when it is none of them (a hub id is the stage's to fetch)

# The options check_command reads, when a stage has them; "resume" only words the --out message as the stage does.
EARLY_OPTIONS = ("task", "budget", "train_file", "dev_file", "data_file", "resume")
DATA_FILES = ("train_file", "dev_file", "data_file")

# Short names for released checkpoints on the Hugging Face hub.
HUB_ALIASES = {
    "bert-base": "google-bert/bert-base-uncased",
    "bert-base-uncased": "google-bert/bert-base-uncased",
    "bert-base-cased": "google-bert/bert-base-cased",
    "bert-large": "google-bert/bert-large-uncased",
    "bert-large-uncased": "google-bert/bert-large-uncased",
    "bert-large-cased": "google-bert/bert-large-cased",
}


def check_command(options: Mapping[str, Any], models: Sequence[tuple[str, Any]], out: str | None = None,
                  overwrite: bool = False) -> None:
    """Refuse now what the stage would refuse first: its options, then ``--out``, then its model inputs, then its data files.

    ``options`` has a key for each of :data:`EARLY_OPTIONS` the stage has, None when not
    given; ``models`` holds each model input's check (:data:`DIRECTORY`, :data:`HUB`) and value
    (a list for several directories); ``out`` is None for a command that writes no directory.
    """
    if options.get("task"):
        check_task(options["task"])
    if "budget" in options:
        budget_option(options["budget"] or "")  # not given is the config's default, "": no budget, which auto refuses
    files = [options[name] for name in DATA_FILES if options.get(name)]
    if out is not None:
        refuse_output(out, overwrite, inputs=[value for _, value in models] + files, resume=bool(options.get("resume")))
    for check, value in models:
        for item in value if isinstance(value, list) else [value]:
            check_model(check, item)
    for file in files:
        check_data_file(file)


def file_options(path: str | Path, names: Sequence[str]) -> dict[str, Any]:
    """The values ``--config FILE`` gives to the options ``names``, at its top or in a nested mapping (``data: {...}``).

    A value of the wrong type is left out: the full parse says what is wrong with it.
    """
    found: dict[str, Any] = {}
    for key, value in load_file(path).items():
        items = value.items() if isinstance(value, dict) else [(key, value)]  # nested options are flat on the command line
        found.update((str(k).replace("-", "_"), v) for k, v in items)
    kinds = {name: bool if name == "resume" else str for name in names}
    return {name: found[name] for name in names if isinstance(found.get(name), kinds[name])}


def check_task(name: str) -> None:
    """A task name from ``--config`` (the flag's own choices refuse an unknown one at once): a kind or a preset."""
    if not is_kind(name):
        get_task(name)


def check_data_file(path: str | Path) -> None:
    """A ``--train-file``, ``--dev-file`` or ``--data-file`` that is no regular file with something in it, said as what it
    is (:func:`compress.core.paths.check_input_file`); what one holds is the stage's to read."""
    if not Path(path).is_dir():  # a folder may be one datasets' save_to_disk wrote: the stage's reader knows
        check_input_file(path, "data file")


def check_model(check: str, value: str | Path) -> None:
    """One model input, as the stage first checks it, short of a download: a model directory, or for :data:`HUB` a
    directory, an alias or an ``org/name`` id (``compress.teacher.presets.resolve_model``)."""
    path = Path(value).expanduser()
    if check == HUB and path.exists():
        require_model_dir(path)
    elif check == HUB:
        model_repo(value)  # an alias or a hub id passes: downloading it is the stage's work
    elif check == DIRECTORY:
        require_model_dir(value)


def model_repo(name: str | Path) -> str:
    """The hub repository a model argument that is no directory names: an alias (``bert-base``) or an ``org/name`` id."""
    text = str(name)
    repo = HUB_ALIASES.get(text.lower())
    if repo is None and text.count("/") == 1 and not text.startswith((".", "/", "~")):
        repo = text  # looks like "org/name"
    if repo is None:
        raise CompressError(
            f"model {text!r} is neither a directory nor a known hub model; pass a model directory, "
            f"one of {', '.join(sorted(HUB_ALIASES))}, or a hub id such as google-bert/bert-base-uncased"
        )
    return repo


def require_model_dir(path: Path | str) -> Path:
    path = Path(path)
    if not path.exists():
        raise CompressError(f"model directory {path} does not exist")
    if not path.is_dir():
        raise CompressError(f"{path} is a file, not a model directory; pass the folder that holds config.json")
    if not (path / "config.json").is_file():
        raise CompressError(
            f"{path} is not a model directory (no config.json); pass a folder written by compress "
            "or a Hugging Face model folder"
        )
    return path


# ---------------------------------------------------------------------------- output directories


def check_output(out: Path | str, overwrite: bool = False, *, inputs: Any = (), resume: bool = False,
                 shared: bool = False) -> Path:
    """Whether ``out`` may be written: the one decision every command, recipe stage and benchmark goes through.

    Refused, before any work and whatever ``overwrite`` says: an ``out`` that is one of the
    ``inputs`` or contains one (paths, or configs whose string fields name existing paths;
    symlinks followed), an existing file, a place that cannot be written. Refused unless
    ``overwrite``: a non-empty directory (``--resume`` included: a run continues from its
    own work directory beside ``out``, never over a folder that already holds something).
    A symbolic link ``out`` is followed (:func:`compress.core.paths.output_path`: the folder it points to is returned
    and checked). Inside a run (``paths.output_locks``, the ``compress`` command) this process then holds the lock of
    ``out``, refused when another run holds it, unless ``shared`` (a search other workers join with the same ``out``).
    The temporary folders an earlier, killed run left beside ``out`` are removed.
    """
    out = refuse_output(out, overwrite, inputs=inputs, resume=resume)
    if not shared:  # workers of one shared search leave each other's folders alone
        lock_output(out)
        _remove_leftovers(out)
    return out


def refuse_output(out: Path | str, overwrite: bool = False, *, inputs: Any = (), resume: bool = False) -> Path:
    """:func:`check_output`'s checks alone, which change nothing on disk (the command line asks them before the stage)."""
    out = output_path(out)
    target = out.resolve()
    for source in input_paths(inputs):
        real = source.resolve()
        if real == target or target in real.parents:
            what = "is" if real == target else "contains"
            raise CompressError(f"--out {out} {what} the input {source}; writing there would destroy it. Choose another --out")
    if out.exists() and not out.is_dir():
        raise CompressError(f"output {out} exists and is not a directory; choose another --out")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        if resume:
            raise CompressError(f"output directory {out} is not empty, so there is no interrupted run of its own to resume "
                                f"(that lives in {out.absolute().parent / ('.' + out.name + '.work')} until the output is written); "
                                "pass --overwrite to replace it or choose another --out")
        raise CompressError(f"output directory {out} is not empty; pass --overwrite to replace it or choose another --out")
    place = _nearest_existing(out.absolute().parent)
    if not _writable(place):
        raise CompressError(f"cannot write --out {out}: {place} is not writable; choose another --out or fix its permissions")
    return out


def _nearest_existing(path: Path) -> Path:
    """``path`` itself or its nearest ancestor that exists: where a new folder would be created."""
    return next(p for p in (path, *path.parents) if p.exists())


def _writable(folder: Path) -> bool:
    """Whether a folder can be written, by trying (``os.access`` says yes to root on read-only mounts and sysfs)."""
    if not folder.is_dir():
        return False
    try:
        probe = tempfile.mkdtemp(prefix=".compress-probe-", dir=folder)
    except OSError:
        return False
    os.rmdir(probe)
    return True


def input_paths(inputs: Any) -> list[Path]:
    """The existing paths among ``inputs``: paths and strings, lists of them, and every string field of (nested) configs."""
    found: list[Path] = []

    def walk(value: Any, name: str = "") -> None:
        if name == "out":  # a config's own output field (latency's --out) is not an input
            return
        if isinstance(value, (str, Path)):
            text = str(value)
            if text and "\n" not in text and len(text) < 4096:
                path = Path(text).expanduser()
                try:
                    if path.exists():
                        found.append(path)
                except OSError:
                    pass
        elif isinstance(value, (list, tuple, set)):
            for item in value:
                walk(item)
        elif is_dataclass(value) and not isinstance(value, type):
            for key, item in vars(value).items():
                walk(item, key)

    walk(inputs)
    return found


def _remove_leftovers(out: Path) -> None:
    """Staging folders of an earlier run into ``out`` that was killed (``.OUT.tmp-*``, ``.OUT.old-*``): ours by name."""
    parent = out.absolute().parent
    if not parent.is_dir():
        return
    for pattern in (f".{out.name}.tmp-*", f".{out.name}.old-*"):
        for left in parent.glob(pattern):
            shutil.rmtree(left, ignore_errors=True) if left.is_dir() else left.unlink(missing_ok=True)
