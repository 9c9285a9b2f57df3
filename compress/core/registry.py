"""A plain named registry: one place to choose a method by name, with helpful errors."""

from __future__ import annotations

import difflib
from typing import Callable, Generic, Iterator, TypeVar

from compress.core.errors import CompressError

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to objects; rejects duplicates; unknown names list the valid ones.

    >>> backends = Registry("latency backend")
    >>> @backends.register("torch")
    ... def run_torch(): ...
    """

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str, obj: T | None = None) -> Callable[[T], T] | T:
        def add(item: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._items[name] = item
            return item

        return add(obj) if obj is not None else add

    def get(self, name: str) -> T:
        if name not in self._items:
            hint = difflib.get_close_matches(name, list(self._items), n=1)
            maybe = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise CompressError(
                f"unknown {self.kind} {name!r}{maybe}; valid: {', '.join(self.names())}"
            )
        return self._items[name]

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def items(self):
        return self._items.items()
