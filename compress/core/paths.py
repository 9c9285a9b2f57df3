"""Paths as the user gives them, checked for what they are before any work: input files, ``--out``, and its lock.

Every input file (``--train-file``, ``--dev-file``, ``--data-file``, a corpus file) goes through
:func:`check_input_file`, which names what a path is when it is no regular file with something in it: missing, a
dangling symbolic link or a loop of them, a directory, a FIFO, a device, a socket, unreadable, empty. Every
``--out`` goes through :func:`output_path` (from :func:`compress.core.preflight.refuse_output`): a symbolic link to
a directory is followed, so the output lands in the directory it points to and the usual rules apply there; a
dangling link, a loop or a name that is not UTF-8 is refused before any work.

A run holds a lock on its ``--out`` (:func:`lock_output`): an ``fcntl.flock`` on a hidden ``.NAME.lock`` file beside
it, which holds the run's pid, so a second run into the same ``--out`` is refused at its start in one line naming the
first one's pid. Locks are taken inside :func:`output_locks` (the ``compress`` command's run: released, and their
files removed, when it ends) or :func:`output_lock` (one folder, e.g. a recipe's run directory); the kernel drops
the lock of a process that dies, so a stale file never blocks anyone. A process of rank above 0 in a distributed run
takes none: rank 0 writes the outputs. Where ``fcntl`` is missing (Windows) nothing is locked.

This module imports the standard library and :mod:`compress.core.errors` only: the command line's cheap checks
(:mod:`compress.core.preflight`) use it before any heavy import.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from typing import Iterator

from compress.core.errors import CompressError

try:
    import fcntl  # POSIX file locks
except ImportError:  # pragma: no cover - Windows
    fcntl = None


# ---------------------------------------------------------------------------- input files


def link_problem(path: Path) -> str | None:
    """What is wrong with ``path`` as a symbolic link: a loop, or dangling (naming where it points); else None."""
    if not path.is_symlink():
        return None
    try:
        os.stat(path)
    except OSError as err:
        if err.errno == errno.ELOOP:
            return "is a symbolic link loop"
        if err.errno == errno.ENOENT:
            return f"is a dangling symbolic link (to {os.readlink(path)}, which does not exist)"
        return None  # a permission problem: the caller's own check says it
    return None


def input_problem(path: Path) -> str | None:
    """Why ``path`` cannot be read as an input file (``"is a directory"``, ``"is a FIFO (named pipe)"``, ...), or None.

    The symbolic links in ``path`` are followed: what counts is what they lead to.
    """
    for place in (path, *path.parents):  # a broken link anywhere on the way: said as such, not as "missing"
        problem = link_problem(place)
        if problem:
            return problem if place == path else f"cannot be reached: {place} {problem}"
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "does not exist"
    except NotADirectoryError:
        return "does not exist (a part of the path is a file)"
    except PermissionError:
        return "cannot be reached (permission denied on a folder of its path)"
    except OSError as err:  # a name too long, an I/O error
        return f"cannot be read ({err.strerror or err})"
    if stat.S_ISDIR(mode):
        return "is a directory"
    if stat.S_ISFIFO(mode):
        return "is a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "is a device"
    if stat.S_ISSOCK(mode):
        return "is a socket"
    if not stat.S_ISREG(mode):
        return "is not a regular file"
    if not os.access(path, os.R_OK):
        return "cannot be read (permission denied)"
    if os.stat(path).st_size == 0:
        return "is empty"
    return None


# What to do about each problem, by its first words.
_ADVICE = {
    "does not exist": "check the path",
    "is a dangling": "fix the link or pass the file itself",
    "is a symbolic link loop": "fix the link or pass the file itself",
    "cannot be reached": "fix the path",
    "is a directory": "pass a file",
    "is a FIFO": "pass a regular file (a pipe can be read only once: save its contents to a file first)",
    "is a device": "pass a regular file",
    "is a socket": "pass a regular file",
    "is not a regular": "pass a regular file",
    "cannot be read": "fix its permissions or pass a copy you can read",
    "is empty": "pass a file that holds data",
}


def check_input_file(path: str | Path, what: str = "data file", *, folder: str | None = None) -> Path:
    """``path`` as an input file: a regular file with something in it, else one line naming what it is instead.

    ``what`` names the input in the message (``"data file"``, ``"corpus file"``); ``folder`` names the folders the
    caller reads besides files (``"a folder datasets' save_to_disk wrote"``), which the caller recognises before
    asking: a directory is then refused as not being one.
    """
    path = Path(path)
    problem = input_problem(path)
    if problem is None:
        return path
    advice = next(text for start, text in _ADVICE.items() if problem.startswith(start))
    if problem == "is a directory" and folder:
        problem, advice = f"is a directory, but not {folder}", f"pass a file or {folder}"
    raise CompressError(f"{what} {path} {problem}; {advice}")


# ---------------------------------------------------------------------------- --out


def output_path(out: str | Path, what: str = "--out") -> Path:
    """``out`` as a run will write it: a symbolic link to a directory followed to that directory; refused in one line
    when a link on its path dangles or loops, or when its name is not UTF-8 (text files name their folder)."""
    given = Path(out).expanduser()
    text = str(given)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # bytes the locale could not decode, kept as surrogates: fine when they are UTF-8
        raw = os.fsencode(text)
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise CompressError(f"{what} {text.encode('utf-8', 'backslashreplace').decode()}: the name is not valid "
                                f"UTF-8 (byte 0x{raw[err.start]:02x}); choose a name in UTF-8") from None
    for place in (given, *given.parents):
        problem = link_problem(place)
        if problem:
            where = "" if place == given else f"'s folder {place}"
            raise CompressError(f"{what} {given}{where} {problem}; fix or remove the link, or {_elsewhere(what)}")
    if given.is_symlink():
        return Path(os.path.realpath(given))  # the output lands where the link points: the link stays as it is
    return given


def work_dir_for(out: Path) -> Path:
    """Checkpoints of a run live next to its output, so --resume finds them."""
    out = Path(out).absolute()
    return out.parent / f".{out.name}.work"


# ---------------------------------------------------------------------------- the lock of an --out


_held: dict[Path, int] = {}  # resolved output -> the open file descriptor of its lock file
_made: dict[Path, list[Path]] = {}  # resolved output -> the folders made to hold its lock file, deepest first
_scopes = 0  # how many output_locks() blocks are open: locks are taken only inside one


def lock_file(out: Path) -> Path:
    """The lock file of ``out``: ``.NAME.lock`` beside it."""
    return out.parent / f".{out.name}.lock"


def _elsewhere(what: str) -> str:
    """What to do instead of writing there: another value of the flag ``what`` names, or another place."""
    return f"choose another {what}" if what.startswith("--") else "write somewhere else"


def _rank() -> int:
    """This process's rank in a distributed run (0 outside one), as torchrun and Accelerate set it."""
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def lock_output(out: str | Path, what: str = "--out") -> bool:
    """Hold the lock of ``out`` for this process, if a run scope is open; whether this process holds it now.

    Another process holding it is refused in one line naming its pid. Taking a lock this process holds is a no-op.
    """
    if fcntl is None or _scopes == 0 or _rank() != 0:
        return False
    out = Path(os.path.abspath(out))
    if out in _held:
        return True
    lock = lock_file(out)
    missing = [p for p in out.parents if not p.exists()]  # removed again with the lock, when still empty
    for _ in range(5):  # the holder may remove the file between our open and our lock: then lock the new one
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as err:
            raise CompressError(f"cannot create the lock file {lock} of {what} {out}: {err.strerror}; "
                                f"fix the permissions of {out.parent} or {_elsewhere(what)}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            by = f"another run (pid {holder})" if holder else "another run"
            raise CompressError(f"{what} {out} is being written by {by}; wait for it to finish or "
                                f"{_elsewhere(what)}") from None
        except OSError:  # a file system without locks (some network mounts): write unlocked, as before
            os.close(fd)
            return False
        try:
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except FileNotFoundError:
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            _held[out] = fd
            _made[out] = missing
            return True
        os.close(fd)
    return False


def _holder(fd: int) -> str:
    """The pid written in a lock file ("" when it cannot be read yet)."""
    with contextlib.suppress(OSError):
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        if text.isdigit():
            return text
    return ""


def release_output(out: str | Path) -> None:
    """Let go of the lock of ``out`` if this process holds it, and remove its file."""
    out = Path(os.path.abspath(out))
    fd = _held.pop(out, None)
    if fd is None:
        return
    with contextlib.suppress(OSError):  # unlinked while locked: a process that opened it before retries (see above)
        os.unlink(lock_file(out))
    with contextlib.suppress(OSError):
        os.close(fd)
    for folder in _made.pop(out, []):  # made for the lock alone (a run that failed before writing anything)
        with contextlib.suppress(OSError):
            folder.rmdir()


@contextlib.contextmanager
def output_locks() -> Iterator[None]:
    """A run: the outputs it checks (:func:`lock_output`) are locked until the block ends, then released."""
    global _scopes
    before = set(_held)
    _scopes += 1
    try:
        yield
    finally:
        _scopes -= 1
        for out in [o for o in _held if o not in before]:
            release_output(out)


@contextlib.contextmanager
def output_lock(out: str | Path, what: str = "--out") -> Iterator[None]:
    """Hold the lock of one folder while the block runs (a recipe's run directory), in a run scope or not."""
    with output_locks():
        lock_output(out, what)
        yield
