"""Names imported on first use: a package's public entry points, and objects named ``"module:attr"``.

``import compress.core.data.tasks`` must stay as light as that module (the command line checks a task before any
heavy import), so a package's ``__init__`` does not import its modules; it names its entry points and where they
live, and :func:`exports` resolves each on first access (PEP 562 module ``__getattr__``)::

    __getattr__, __all__ = exports(__name__, {"distill": "task", "DistillConfig": "task"})
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from importlib.util import find_spec
from typing import Any


def exports(package: str, where: Mapping[str, str]) -> tuple[Callable[[str], Any], list[str]]:
    """A module ``__getattr__`` that finds each public name in its module (relative to ``package``), and ``__all__``.

    A public name may not be a submodule's name too: ``from package import name`` would then give the object or the
    module depending on what was imported before."""
    shadowing = sorted(name for name in where if find_spec(f"{package}.{name}") is not None)
    if shadowing:
        raise ImportError(f"{package} exports {', '.join(shadowing)}, which its modules are named too")

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(import_module(f"{package}.{where[name]}"), name)

    return __getattr__, sorted(where)


def load(path: str) -> Any:
    """The object a ``"module:attr"`` string names, imported now (a table names it without importing it)."""
    module, _, attr = path.partition(":")
    return getattr(import_module(module), attr)
