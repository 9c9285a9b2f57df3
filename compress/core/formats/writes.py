"""The one atomic writer and the rules every output follows: whole files, whole folders, the user's umask.

Every file is written to a temporary sibling and renamed into place (:func:`atomic_path`), and every output
folder is built in a temporary sibling directory and renamed into place (:func:`publish`), so an interrupted run
never leaves half a file or a half-written model.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any, Iterator

from compress.core.errors import CompressError
from compress.core.preflight import _nearest_existing, _writable

try:
    import fcntl  # POSIX file locks, for build_lock
except ImportError:  # pragma: no cover - Windows
    fcntl = None

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------- files


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON (indented) atomically: see :func:`atomic_path`."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False, default=_json_default) + "\n")


def write_text_atomic(path: Path, text: str) -> None:
    """Write UTF-8 text with ``\\n`` line ends atomically: see :func:`atomic_path`."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as fh:
        fh.write(text)


@contextlib.contextmanager
def atomic_path(path: Path | str) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` to write; on success it replaces ``path`` in one rename.

    Every file the toolkit writes goes through here: readers never see half a file, a
    crash leaves the old file (and no temporary one), and the file gets the mode the
    user's umask gives a new file (``mkstemp`` alone would leave it 0600).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, new_file_mode())
        with open(tmp, "rb") as fh:  # on disk before the rename makes it visible
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def build_lock(entry: Path | str, what: str) -> Iterator[None]:
    """Hold an exclusive lock for building the cache ``entry`` (a file or folder path) while the block runs.

    Processes that miss the same cache entry at once (student shapes distilled side by side
    from one teacher) queue here: the first builds it, the others wait and look for the
    entry again inside the block, where they find it made. The lock is a hidden
    ``.NAME.lock`` file beside the entry, removed when a block ends without an error (a
    process still waiting on the removed file then finds the entry: the check inside the
    block keeps it correct); after an error it stays, so the next builder queues on the same
    file. Where ``fcntl`` is missing (Windows) nothing is locked: each process builds the
    entry, and the atomic rename keeps it whole. ``what`` names the entry in the one log
    line a waiting process writes.
    """
    if fcntl is None:  # pragma: no cover - not POSIX
        yield
        return
    entry = Path(entry)
    entry.parent.mkdir(parents=True, exist_ok=True)
    lock = entry.parent / f".{entry.name}.lock"
    with open(lock, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info(f"waiting for another process building {what} in {entry}")
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
            with contextlib.suppress(FileNotFoundError):
                lock.unlink()
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _umask() -> int:
    mask = os.umask(0)  # the only way to read it is to set it
    os.umask(mask)
    return mask


def new_file_mode() -> int:
    """The mode ``open()`` gives a new file under the user's umask (0o644 under umask 022)."""
    return 0o666 & ~_umask()


def apply_umask(directory: Path) -> None:
    """Give a finished output tree the modes the user's umask asks for.

    ``mkdtemp`` makes its directory 0700 and some writers (safetensors among them) make
    their files 0600; a published output must not be private by accident.
    """
    directory.chmod(new_dir_mode())
    for path in directory.rglob("*"):
        if not path.is_symlink():
            path.chmod(new_dir_mode() if path.is_dir() else new_file_mode())


def new_dir_mode() -> int:
    """The mode ``mkdir`` gives a new directory under the user's umask (0o755 under umask 022)."""
    return 0o777 & ~_umask()


def _json_default(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    if hasattr(obj, "item"):  # numpy / torch scalars
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")

# ---------------------------------------------------------------------------- output directories


def check_writable(folder: Path | str, what: str, hint: str) -> Path:
    """Before long work: ``folder`` (which may not exist yet) can receive files; else one line naming it and ``hint``."""
    folder = Path(folder).expanduser()
    if folder.exists() and not folder.is_dir():
        raise CompressError(f"{what} {folder} is a file, not a directory; {hint}")
    place = _nearest_existing(folder.absolute())
    if not _writable(place):
        raise CompressError(f"cannot write {what} into {folder}: {place} is not writable; {hint}")
    return folder


def publish(tmp: Path, out: Path, overwrite: bool) -> None:
    """Atomically replace ``out`` by ``tmp`` (the old output is removed only afterwards)."""
    apply_umask(tmp)
    if out.exists():
        if out.is_dir() and any(out.iterdir()) and not overwrite:  # filled meanwhile by someone else
            raise CompressError(f"output directory {out} is not empty; pass --overwrite to replace it or choose another --out")
        old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
        os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out)
