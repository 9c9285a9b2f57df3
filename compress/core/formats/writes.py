"""The one atomic writer and the rules every output follows: whole files, whole folders, the user's umask, named failures.

Every file is written to a temporary sibling and renamed into place (:func:`atomic_path`), and every output
folder is built in a temporary sibling directory and renamed into place (:func:`staged_dir`, :func:`publish`), so an
interrupted run never leaves half a file or a half-written model. Both run their block inside :func:`writing`: a
write that fails (a full disk, the file-size limit of ``ulimit -f``, a read-only file system, a permission) is one
:class:`CompressError` naming the file, the cause and what to do, whatever library wrote it (Python's own files,
safetensors, ``torch.save``); the temporary file or folder is removed, on such a failure as on any other exception
or a signal the command turns into one (:mod:`compress.core.signals`), and the previous output stays as it was.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any, Iterator

from compress.core.errors import CompressError, reason
from compress.core.paths import output_path
from compress.core.preflight import _nearest_existing, _writable

try:
    import fcntl  # POSIX file locks, for build_lock
except ImportError:  # pragma: no cover - Windows
    fcntl = None

try:
    import resource  # the file-size limit, to name the cause of a write that failed without saying why
except ImportError:  # pragma: no cover - Windows
    resource = None

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------- files


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON (indented) atomically: see :func:`atomic_path`."""
    text = json.dumps(data, indent=2, sort_keys=False, default=_json_default)
    write_text_atomic(path, _decoded_names(text) + "\n")


# A run of escaped lone surrogates (the bytes of a path the locale could not decode, LC_ALL=C, one per escape), after
# an even number of backslashes: an escape, not the text "\\udc80".
_SURROGATES = re.compile(r"(?<!\\)((?:\\\\)*)((?:\\udc[89a-f][0-9a-f])+)")


def _decoded_names(text: str) -> str:
    """JSON ``text`` with each run of escaped surrogates (a file name's undecoded bytes) written as the UTF-8 it is."""
    def decode(match: re.Match) -> str:
        raw = bytes(int(escape, 16) - 0xDC00 for escape in match.group(2).split("\\u")[1:])
        try:
            return match.group(1) + json.dumps(raw.decode("utf-8"))[1:-1]
        except UnicodeDecodeError:
            return match.group(0)  # not UTF-8: kept as escaped

    return _SURROGATES.sub(decode, text) if "\\udc" in text else text


def write_text_atomic(path: Path, text: str) -> None:
    """Write UTF-8 text with ``\\n`` line ends atomically: see :func:`atomic_path`.

    A path the locale could not decode (a UTF-8 name under ``LC_ALL=C``) holds its bytes as surrogates; they are
    written back as those bytes, so the text names the folder as the file system does.
    """
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", errors="surrogateescape", newline="\n") as fh:
        fh.write(text)


@contextlib.contextmanager
def atomic_path(path: Path | str) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` to write; on success it replaces ``path`` in one rename.

    Every file the toolkit writes goes through here: readers never see half a file, a
    crash leaves the old file (and no temporary one), and the file gets the mode the
    user's umask gives a new file (``mkstemp`` alone would leave it 0600).
    """
    path = Path(path)
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        try:
            with writing(path, staging=Path(tmp)):
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

# ---------------------------------------------------------------------------- failed writes


# Why a write failed, by errno: the cause as said, and what to do ({place}: the folder written into).
CAUSES = {
    errno.ENOSPC: ("no space left on the device", "free space there (df -h {place}) or write to another disk"),
    errno.EDQUOT: ("the disk quota is exceeded", "free space in your quota or write somewhere else"),
    errno.EFBIG: ("file too large for this process's file-size limit{limit}", "raise the limit (ulimit -f unlimited) "
                  "and run again"),
    errno.EROFS: ("read-only file system", "write to a writable file system"),
    errno.EACCES: ("permission denied", "fix the permissions of {place} or write somewhere else"),
    errno.EPERM: ("operation not permitted", "fix the permissions of {place} or write somewhere else"),
    errno.EIO: ("input/output error", "check the disk (dmesg) and try again"),
}
# Causes only a write has: said whichever file the error names (or none). The others (a permission, EIO) only when
# the file is one being written, so that a file that cannot be read is not reported as a failed write.
WRITE_ONLY = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}
# Libraries that lose the errno: safetensors says "(os error N)" (or "code: N"); torch.save's zip writer says
# "enforce fail at inline_container.cc" and no cause, which :func:`_likely_cause` then looks for.
_OS_ERROR = re.compile(r"os error (\d+)|code: (\d+)")
_TORCH_WRITER = re.compile(r"PytorchStreamWriter|inline_container.*(unexpected pos|write failed)")  # not its reader's
LOW_SPACE = 64 * 2**20  # free bytes below which a write that failed without a cause is taken for a full disk


@contextlib.contextmanager
def writing(target: Path | str, staging: Path | None = None) -> Iterator[None]:
    """Run a block that writes ``target``; a write in it that fails is one line naming the file, the cause and what to do.

    ``staging`` is the temporary file or folder the block writes in place of ``target``: a file the error names there is
    said by its place in ``target``. Any other exception passes unchanged.
    """
    try:
        yield
    except CompressError as err:
        if staging is not None and str(staging) in str(err):
            # Said inside (a file's own writer): named by its place in the output, as the staging is gone by now.
            err.args = (str(err).replace(str(staging), str(target)),)
        raise
    except Exception as err:
        failure = write_error(err, Path(target), staging)
        if failure is None:
            raise
        raise failure from err


def write_error(err: BaseException, target: Path, staging: Path | None = None) -> CompressError | None:
    """The one line for ``err`` raised while writing ``target``, or None when ``err`` is no failed write."""
    code, named = None, None
    if isinstance(err, OSError) and err.errno in CAUSES:
        code, named = err.errno, err.filename
        if code not in WRITE_ONLY and not _inside(named, [target, staging]):
            return None
    elif type(err).__name__ == "SafetensorError" and re.search(r"\bserializ", str(err)):  # a save, not a load
        found = _OS_ERROR.search(str(err))
        code = int(next(g for g in found.groups() if g)) if found else _likely_cause(target)
        if code is None and not found:
            return _unnamed(err, target)
    elif isinstance(err, RuntimeError) and _TORCH_WRITER.search(str(err)):
        code = _likely_cause(target)
        if code is None:
            return _unnamed(err, target)
    else:
        return None
    if code not in CAUSES:
        return _unnamed(err, target)
    safetensors = type(err).__name__ == "SafetensorError"  # it removes the file it failed to write: none to find
    file = _shown(named, target, staging, grown=not safetensors and code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG))
    what = f"the safetensors weights in {file}" if safetensors and staging is not None and staging.is_dir() else file
    place = _nearest_existing(Path(os.path.abspath(target)).parent)  # the folder written into (the staging's too)
    if place.name.startswith(".") and ".tmp-" in place.name:  # a staging folder (.NAME.tmp-*): where it goes
        place = place.parent
    cause, advice = CAUSES[code]
    limit = _size_limit()
    cause = cause.format(limit=f" ({limit} bytes, ulimit -f)" if limit is not None else "")
    return CompressError(f"cannot write {what}: {cause}; {advice.format(place=place)}")


def _unnamed(err: BaseException, target: Path) -> CompressError:
    """A failed write whose cause nothing tells."""
    first = reason(err)
    return CompressError(f"cannot write {target}: the write failed ({first}); check the disk's free space "
                         f"(df -h {_nearest_existing(Path(os.path.abspath(target)).parent)}) and the file-size limit "
                         "(ulimit -f), then try again")


def _likely_cause(target: Path) -> int | None:
    """The errno a write into ``target``'s file system most likely met when the library did not say: a disk nearly
    full (ENOSPC), else a file-size limit (EFBIG); None when neither holds."""
    with contextlib.suppress(OSError):
        if shutil.disk_usage(_nearest_existing(Path(os.path.abspath(target)).parent)).free < LOW_SPACE:
            return errno.ENOSPC
    return errno.EFBIG if _size_limit() is not None else None


def _size_limit() -> int | None:
    """This process's file-size limit in bytes (``ulimit -f``), None when there is none."""
    if resource is None:  # pragma: no cover - Windows
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    return None if soft == resource.RLIM_INFINITY else soft


def _inside(name: Any, places: list[Path | None]) -> bool:
    """Whether the file ``name`` (an error's filename) is one of ``places`` or lies inside one."""
    if not isinstance(name, (str, bytes, os.PathLike)):
        return False
    path = Path(os.path.abspath(os.fsdecode(name)))
    return any(p is not None and (path == Path(os.path.abspath(p)) or Path(os.path.abspath(p)) in path.parents)
               for p in places)


def _shown(name: Any, target: Path, staging: Path | None, grown: bool = False) -> Path:
    """The file to name: the error's own, said by its place in ``target`` when it lies in ``staging``; else ``target``.

    A library that names no file (safetensors, torch) and ran out of room (``grown``) was writing the newest file of a
    staging folder: that one is named.
    """
    if not isinstance(name, (str, bytes, os.PathLike)):
        if not (grown and staging is not None and staging.is_dir()):
            return target
        files = [p for p in staging.rglob("*") if p.is_file()]
        if not files:
            return target
        name = max(files, key=lambda p: p.stat().st_mtime_ns)
    path = Path(os.path.abspath(os.fsdecode(name)))
    if staging is not None:
        stage = Path(os.path.abspath(staging))
        if path == stage:
            return target
        if stage in path.parents:
            return target / path.relative_to(stage)
    return path


# ---------------------------------------------------------------------------- output directories


def check_writable(folder: Path | str, what: str, hint: str) -> Path:
    """Before long work: ``folder`` (which may not exist yet) can receive files; else one line naming it and ``hint``.

    A symbolic link to a directory is followed (the folder it points to is returned); a dangling one is refused.
    """
    folder = output_path(folder, what)
    if folder.exists() and not folder.is_dir():
        raise CompressError(f"{what} {folder} is a file, not a directory; {hint}")
    place = _nearest_existing(folder.absolute())
    if not _writable(place):
        raise CompressError(f"cannot write {what} into {folder}: {place} is not writable; {hint}")
    return folder


@contextlib.contextmanager
def staged_dir(out: Path | str, overwrite: bool) -> Iterator[Path]:
    """Yield a temporary directory beside ``out`` to fill; when the block ends, it replaces ``out`` (:func:`publish`).

    ``out`` is the folder :func:`compress.core.preflight.check_output` allowed (a symbolic link followed). A write
    that fails in the block is one line (:func:`writing`); on it, on any other exception and on a signal turned into
    one, the temporary directory is removed and an existing ``out`` is left as it was.
    """
    out = Path(os.path.abspath(out))
    with writing(out):
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        with writing(out, staging=tmp):
            yield tmp
            publish(tmp, out, overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def publish(tmp: Path, out: Path, overwrite: bool) -> None:
    """Atomically replace ``out`` by ``tmp`` (the old output is removed only afterwards).

    A symbolic link ``out`` to a directory is followed: the link stays, the directory it points to is replaced. An
    exception (a signal) between the two renames puts the old output back.
    """
    out = output_path(Path(out).absolute())
    apply_umask(tmp)
    tmp = _beside(tmp, out)
    if not out.exists():
        os.replace(tmp, out)
        return
    if out.is_dir() and any(out.iterdir()) and not overwrite:  # filled meanwhile by someone else
        raise CompressError(f"output directory {out} is not empty; pass --overwrite to replace it or choose another --out")
    old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
    moved = False
    try:
        os.replace(out, old)
        moved = True
        os.replace(tmp, out)
    except BaseException:
        if moved and not out.exists():
            os.replace(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _beside(tmp: Path, out: Path) -> Path:
    """``tmp`` moved into ``out``'s folder when it is elsewhere (an ``out`` reached through a link to another disk)."""
    if Path(os.path.abspath(tmp)).parent == out.parent:
        return tmp
    moved = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    os.rmdir(moved)
    shutil.move(str(tmp), moved)  # a rename on one file system, a copy across two
    return moved
