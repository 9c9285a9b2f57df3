"""What a run tells a person: log lines, progress bars and the libraries' own chatter, decided in one place.

* **Progress bars** show on a terminal (stderr is a TTY, or a notebook) and nowhere else:
  a redirected log gets plain lines instead of bar fragments. Every bar of the package
  is made by :func:`progress`.
* **Messages** go through Python ``logging`` under the ``compress`` logger, one plain line
  each on stderr (``warning: ...`` / ``error: ...`` for those levels), written above any
  bar that is showing. As in transformers and datasets, the ``compress`` logger has its
  own stderr handler and does not propagate; to route its records into your own set-up,
  set ``logging.getLogger("compress").propagate = True`` and remove its handler.
* **Third-party libraries** (transformers, datasets, huggingface_hub, torch, accelerate,
  nncf, neural_compressor, ...) follow the level, but never below WARNING unless it is
  DEBUG, so their INFO noise stays out; their own bars ("Loading weights", "Writing model
  shards", map/filter bars) are off whenever ours are.

:func:`configure` sets all of it for a process (the command line's ``--quiet`` /
``--log-level``); :func:`configured` does the same and restores the previous state.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

from tqdm.auto import tqdm as _tqdm
from tqdm.autonotebook import tqdm as _chosen_tqdm  # tqdm.std's class unless running in a notebook
from tqdm.std import tqdm as _terminal_tqdm

from compress.core.errors import CompressError

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
LOGGER = logging.getLogger("compress")
# Loggers of the libraries the stages call; transformers, datasets and the hub client are
# also told through their own switches below (they reset their loggers when first imported).
LIBRARIES = ("transformers", "datasets", "huggingface_hub", "accelerate", "torch", "nncf", "neural_compressor",
             "onnxruntime", "optimum", "openvino", "sentence_transformers", "urllib3", "filelock")
# What transformers / datasets / huggingface_hub read when they are first imported.
VERBOSITY_ENV = ("TRANSFORMERS_VERBOSITY", "DATASETS_VERBOSITY", "HF_HUB_VERBOSITY")
NO_BARS_ENV = ("HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS")
# Modules with set_verbosity/get_verbosity, and the bar switches (is on, off, on) of each
# library: the same names in transformers 4.57 and 5.x, datasets 5.x, huggingface_hub 0.36 and 2.x.
VERBOSITY_MODULES = ("transformers.utils.logging", "datasets.utils.logging", "huggingface_hub.utils.logging")
BAR_SWITCHES = {
    "transformers.utils.logging": ("is_progress_bar_enabled", "disable_progress_bar", "enable_progress_bar"),
    "datasets.utils.logging": ("is_progress_bar_enabled", "disable_progress_bar", "enable_progress_bar"),
    "huggingface_hub.utils": ("are_progress_bars_disabled", "disable_progress_bars", "enable_progress_bars"),
}


@dataclass(frozen=True)
class _Settings:
    level: int = logging.INFO  # the compress logger's level
    bars: bool | None = None  # None: on a terminal only


_settings = _Settings()


# ---------------------------------------------------------------------------- progress bars


def interactive() -> bool:
    """True when a person watches stderr live: a terminal, or a notebook (where tqdm.auto draws widgets)."""
    try:
        tty = sys.stderr.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stream
        tty = False
    return tty or _chosen_tqdm is not _terminal_tqdm


def show_bars() -> bool:
    """Whether progress bars are drawn: as configured, else only when someone watches (see :func:`interactive`)."""
    return _settings.bars if _settings.bars is not None else interactive()


def progress(iterable: Iterable | None = None, *, desc: str | None = None, total: int | None = None,
             disable: bool = False, **options: Any):
    """A tqdm bar over ``iterable`` (or of ``total`` steps) that is hidden unless :func:`show_bars`.

    ``options`` go to tqdm (``unit``, ``leave``, ``initial``, ...). A hidden bar still
    iterates and still accepts ``update``/``set_postfix``/``close``.
    """
    return _tqdm(iterable, desc=desc, total=total, disable=disable or not show_bars(), dynamic_ncols=True, **options)


# ---------------------------------------------------------------------------- log lines


class _Formatter(logging.Formatter):
    """The message alone; warnings and errors (and debug lines) say their level first."""

    def format(self, record: logging.LogRecord) -> str:
        message = super().format(record)
        return message if record.levelno == logging.INFO else f"{record.levelname.lower()}: {message}"


class _Handler(logging.Handler):
    """One line per record on the current ``sys.stderr`` (looked up per record), written above a showing bar."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
            if show_bars():
                _tqdm.write(line, file=sys.stderr)  # clears the bar, writes the line, redraws the bar
            else:
                sys.stderr.write(line + "\n")
                sys.stderr.flush()
        except Exception:  # a logging failure must never stop a run
            self.handleError(record)


def _install_handler() -> None:
    if not any(isinstance(h, _Handler) for h in LOGGER.handlers):
        handler = _Handler()
        handler.setFormatter(_Formatter("%(message)s"))
        LOGGER.addHandler(handler)
    LOGGER.setLevel(_settings.level)
    LOGGER.propagate = False


_install_handler()  # library use prints the same lines as the command line, until configured otherwise


# ---------------------------------------------------------------------------- configuration


def level_of(name: str | int) -> int:
    """A level from its name (debug, info, warning, error) or number; a wrong name lists the valid ones."""
    if isinstance(name, int):
        return name
    try:
        return LEVELS[name.lower()]
    except KeyError:
        raise CompressError(f"unknown log level {name!r}; valid: {', '.join(LEVELS)}") from None


def configure(level: str | int = "info", *, quiet: bool = False, bars: bool | None = None) -> None:
    """Set the toolkit's log level, whether bars show, and the third-party libraries' levels and bars.

    ``quiet`` means errors only and no bars (what a command prints as its result is not
    logging and still appears). ``bars`` None: on a terminal only; bars never show above
    INFO. Libraries follow ``level`` but stay at WARNING or above unless it is DEBUG.
    """
    lvl = logging.ERROR if quiet else level_of(level)
    library = lvl if lvl <= logging.DEBUG else max(lvl, logging.WARNING)
    global _settings
    _settings = _Settings(level=lvl, bars=False if quiet or lvl > logging.INFO else bars)
    _install_handler()
    _tell_libraries(library, show_bars())


def _tell_libraries(level: int, bars: bool) -> None:
    """Loggers and bars of the third-party libraries: their switches if imported, else the variables they read on import."""
    for name in LIBRARIES:
        logging.getLogger(name).setLevel(level)
    for var in VERBOSITY_ENV:
        os.environ[var] = logging.getLevelName(level).lower()
    if not bars:
        for var in NO_BARS_ENV:
            os.environ[var] = "1"
    for module in VERBOSITY_MODULES:
        if module in sys.modules:
            sys.modules[module].set_verbosity(level)
    if not bars:
        for module, (_, off, _) in BAR_SWITCHES.items():
            if module in sys.modules:
                getattr(sys.modules[module], off)()


def _library_bars_on() -> dict[str, bool]:
    """Which imported libraries have their bars on now."""
    state = {}
    for module, (query, _, _) in BAR_SWITCHES.items():
        if module in sys.modules:
            answer = bool(getattr(sys.modules[module], query)())
            state[module] = not answer if query.endswith("disabled") else answer
    return state


@contextlib.contextmanager
def configured(level: str | int = "info", *, quiet: bool = False, bars: bool | None = None) -> Iterator[None]:
    """:func:`configure` for the duration of a block; the previous levels, variables and bars come back after it."""
    global _settings
    settings = _settings
    levels = {name: logging.getLogger(name).level for name in ("compress", *LIBRARIES)}
    env = {var: os.environ.get(var) for var in (*VERBOSITY_ENV, *NO_BARS_ENV)}
    verbosity = {m: sys.modules[m].get_verbosity() for m in VERBOSITY_MODULES if m in sys.modules}
    bars_on = _library_bars_on()
    configure(level, quiet=quiet, bars=bars)
    try:
        yield
    finally:
        _settings = settings
        for name, value in levels.items():
            logging.getLogger(name).setLevel(value)
        for var, value in env.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value
        for module, value in verbosity.items():
            sys.modules[module].set_verbosity(value)
        after = _library_bars_on()
        for module, was_on in bars_on.items():  # turn back on what this block turned off
            if was_on and not after[module]:
                getattr(sys.modules[module], BAR_SWITCHES[module][2])()


@contextlib.contextmanager
def errors_only(logger: logging.Logger) -> Iterator[None]:
    """Errors only from ``logger`` for a block; its own level comes back afterwards."""
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def quiet_root_logger():
    """Errors only on the root logger for a block: ONNX Runtime's quantization and transformer-optimizer tools
    warn per node on it or on loggers of their own top-level module names ("fusion_attention"), which inherit it."""
    return errors_only(logging.getLogger())
