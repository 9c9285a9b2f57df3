"""How a command stops when told to from outside: SIGTERM raised where the process is, a file-size limit an error.

``kill PID``, a scheduler's time limit and ``docker stop`` send SIGTERM, whose default ends the process at once:
no ``finally`` runs, so a temporary output folder stays behind. Inside :func:`stop_cleanly` SIGTERM raises
:class:`Terminated` instead (a KeyboardInterrupt, so every cleanup written for Ctrl-C runs for it too), once: a
second SIGTERM during the cleanup is ignored (SIGKILL still ends it). SIGXFSZ, whose default kills a process that
writes past its file-size limit (``ulimit -f``), is ignored, so the write fails with EFBIG and is reported as such
(:func:`compress.core.formats.writes.writing`). Both handlers are put back when the block ends.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

TERMINATED_EXIT = 128 + signal.SIGTERM  # what a shell reports for a process ended by SIGTERM (143)


class Terminated(KeyboardInterrupt):
    """The process was sent SIGTERM: raised in the main thread wherever it was."""


def _terminate(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the cleanup this starts is not interrupted by a second one
    raise Terminated()


@contextlib.contextmanager
def stop_cleanly() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` and SIGXFSZ is ignored while the block runs (in the main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    wanted = {signal.SIGTERM: _terminate}
    if hasattr(signal, "SIGXFSZ"):  # POSIX
        wanted[signal.SIGXFSZ] = signal.SIG_IGN
    before = {number: signal.signal(number, handler) for number, handler in wanted.items()}
    try:
        yield
    finally:
        for number, handler in before.items():
            signal.signal(number, signal.SIG_DFL if handler is None else handler)  # None: one set outside Python
