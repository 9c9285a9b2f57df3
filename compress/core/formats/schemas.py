"""What a record the toolkit reads must hold, checked when it is read: one line naming the file, the field, what it
should be and what was found.

A schema is data built from a few frozen pieces::

    Record({"heads": ListOf(Whole(0)), "format": optional(STR)}, required=("heads",))

- leaves: :data:`STR`, :data:`BOOL`, :data:`NULL`, :data:`NUMBER` (an int or a float, never true/false),
  :class:`Whole` (an int, optionally at least some minimum), :data:`ANY`, :class:`Inside` (a path inside the
  record's folder);
- containers: :class:`ListOf` (a JSON array), :class:`MapOf` (a JSON object, its keys free or checked),
  :class:`Record` (a JSON object whose named fields are checked; other fields pass unchecked, so a record a newer
  toolkit wrote still reads);
- :class:`OneOf` of several (``optional(x)`` is ``x`` or null).

:meth:`Schema.check` walks a parsed document and raises :class:`CompressError` at the first field that does not
fit, e.g. ``/m/compression.json: structure.heads[1] should be a whole number of at least 0, found the string "4";
...``. Each schema sits beside the code that writes its file (``records.COMPRESSION``, ``sentence.MODULES``, ...);
reading one is ``records.read_record(file, SCHEMA)``.

:func:`inside` is the one containment check for a path a record inside a folder names (``..`` past its top, an
absolute path elsewhere or a drive leaves it; links inside the folder are its own).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from compress.core.errors import CompressError

SHOWN_CHARS = 40  # a found string is shown up to this many characters
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")  # a key shown as .key; any other as ["key"]


# ---------------------------------------------------------------------------- where a value sits


@dataclass(frozen=True)
class At:
    """A field being checked: the record's file, the field's path in it (``structure.heads[3]``; "" at the top),
    and what to do about a wrong one."""

    file: Path
    path: str = ""
    fix: str = ""

    def key(self, name: str) -> "At":
        shown = name if _NAME.fullmatch(name) else f"[{json.dumps(name[:SHOWN_CHARS])}]"
        joined = f"{self.path}.{shown}" if self.path and not shown.startswith("[") else f"{self.path}{shown}"
        return At(self.file, joined, self.fix)

    def item(self, index: int) -> "At":
        return At(self.file, f"{self.path}[{index}]", self.fix)

    def where(self) -> str:
        return f"{self.file}: {self.path}" if self.path else f"{self.file}"

    def refuse(self, expected: str, value: Any) -> None:
        verb = "should be" if self.path else "should hold"
        raise CompressError(f"{self.where()} {verb} {expected}, found {shown(value)}; {self.fix}")


def shown(value: Any) -> str:
    """A found value in words: ``the string "4"``, ``the number 1.5``, ``a list of 3 items``, ``null``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        text = repr(value)
        return f"the number {text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + '...'}"
    if isinstance(value, str):
        cut = json.dumps(value[:SHOWN_CHARS]) + ("..." if len(value) > SHOWN_CHARS else "")
        return f"the string {cut}"
    if isinstance(value, list):
        return f"a list of {len(value)} item{'' if len(value) == 1 else 's'}"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


# ---------------------------------------------------------------------------- the pieces


class Spec:
    """What a value must be. ``words``/``plural``: that in words ("a whole number" / "whole numbers");
    ``matches``: whether the value is of the spec's JSON type (how :class:`OneOf` picks the alternative to follow)."""

    words: str
    plural: str

    def matches(self, value: Any) -> bool:
        raise NotImplementedError

    def check(self, value: Any, at: At) -> None:
        if not self.matches(value):
            at.refuse(self.words, value)


@dataclass(frozen=True)
class Kind(Spec):
    """A value of one JSON type: a string, true/false, null."""

    types: tuple[type, ...]
    words: str
    plural: str

    def matches(self, value: Any) -> bool:
        # true/false is an int to Python, never to a record
        return isinstance(value, self.types) and (bool in self.types or not isinstance(value, bool))


@dataclass(frozen=True)
class Whole(Spec):
    """An integer (not true/false), at least ``minimum`` when one is given."""

    minimum: int | None = None

    @property
    def words(self) -> str:
        return "a whole number" + (f" of at least {self.minimum}" if self.minimum is not None else "")

    @property
    def plural(self) -> str:
        return "whole numbers" + (f" of at least {self.minimum}" if self.minimum is not None else "")

    def matches(self, value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    def check(self, value: Any, at: At) -> None:
        if not self.matches(value) or (self.minimum is not None and value < self.minimum):
            at.refuse(self.words, value)


@dataclass(frozen=True)
class Anything(Spec):
    """Any value (a field kept for people, or one whose reader checks it itself)."""

    words: str = "any value"
    plural: str = "any values"

    def matches(self, value: Any) -> bool:
        return True


@dataclass(frozen=True)
class ListOf(Spec):
    """A JSON array whose every item is ``item``."""

    item: Spec

    @property
    def words(self) -> str:
        return f"a list of {self.item.plural}"

    @property
    def plural(self) -> str:
        return f"lists of {self.item.plural}"

    def matches(self, value: Any) -> bool:
        return isinstance(value, list)

    def check(self, value: Any, at: At) -> None:
        super().check(value, at)
        for i, item in enumerate(value):
            self.item.check(item, at.item(i))


@dataclass(frozen=True)
class MapOf(Spec):
    """A JSON object whose every value is ``value`` (and every key ``keys``, when given: e.g. :class:`Inside` for
    keys that name folders)."""

    value: Spec
    keys: Spec | None = None

    @property
    def words(self) -> str:
        return f"an object of {self.value.plural}"

    @property
    def plural(self) -> str:
        return f"objects of {self.value.plural}"

    def matches(self, value: Any) -> bool:
        return isinstance(value, dict)

    def check(self, value: Any, at: At) -> None:
        super().check(value, at)
        for key, item in value.items():
            if self.keys is not None:
                self.keys.check(key, at.key(key))
            self.value.check(item, at.key(key))


@dataclass(frozen=True)
class Record(Spec):
    """A JSON object whose ``fields`` are checked where present (``required`` ones must be); others pass, unless
    ``closed`` (an object its reader spreads into a constructor's keywords)."""

    fields: Mapping[str, Spec] = field(default_factory=dict)
    required: tuple[str, ...] = ()
    closed: bool = False
    words: str = "an object"
    plural: str = "objects"

    def matches(self, value: Any) -> bool:
        return isinstance(value, dict)

    def check(self, value: Any, at: At) -> None:
        super().check(value, at)
        for name in self.required:
            if name not in value:
                expected = self.fields[name].words
                raise CompressError(f"{at.key(name).where()} is missing (it should be {expected}); {at.fix}")
        for name, spec in self.fields.items():
            if name in value:
                spec.check(value[name], at.key(name))
        other = [name for name in value if name not in self.fields] if self.closed else []
        if other:
            raise CompressError(f"{at.key(other[0]).where()} is not a field of this record (valid: "
                                f"{', '.join(self.fields)}); {at.fix}")


@dataclass(frozen=True)
class OneOf(Spec):
    """One of ``options``: the first whose JSON type the value has is followed (so a wrong field inside an object
    is named, not the object); a value of none of their types is refused with all of them."""

    options: tuple[Spec, ...]

    @property
    def words(self) -> str:
        return " or ".join(o.words for o in self.options)

    @property
    def plural(self) -> str:
        return " or ".join(o.plural for o in self.options)

    def matches(self, value: Any) -> bool:
        return any(o.matches(value) for o in self.options)

    def check(self, value: Any, at: At) -> None:
        chosen = next((o for o in self.options if o.matches(value)), None)
        if chosen is None:
            at.refuse(self.words, value)
        chosen.check(value, at)


@dataclass(frozen=True)
class Inside(Spec):
    """A relative path that stays inside the folder holding the record (:func:`inside`)."""

    words: str = "a path inside the folder"
    plural: str = "paths inside the folder"

    def matches(self, value: Any) -> bool:
        return isinstance(value, str)

    def check(self, value: Any, at: At) -> None:
        super().check(value, at)
        inside(at.file.parent, value, at)


STR = Kind((str,), "a string", "strings")
BOOL = Kind((bool,), "true or false", "true or false values")
NULL = Kind((type(None),), "null", "nulls")
NUMBER = Kind((int, float), "a number", "numbers")  # NaN and infinities included: json writes them for a failed score
ANY = Anything()


def optional(spec: Spec) -> OneOf:
    """``spec`` or null."""
    return OneOf((spec, NULL))


@dataclass(frozen=True)
class Schema:
    """A file's schema: its ``root`` and what to do when the file does not fit (``fix``, after the semicolon)."""

    root: Spec
    fix: str

    def check(self, data: Any, file: Path | str, fix: str | None = None) -> Any:
        """``data`` (parsed from ``file``) when it fits; else one line naming the file and the first field at fault."""
        self.root.check(data, At(Path(file), "", fix or self.fix))
        return data


# ---------------------------------------------------------------------------- paths a record names


def inside(folder: Path | str, entry: str, at: At) -> Path:
    """``entry`` (a path a record in ``folder`` names, relative to it or absolute; ``at``: where) as a path inside
    ``folder``; one line naming the record and the field when it leads outside.

    Lexical first: ``..`` past the folder's top, an absolute path elsewhere or a drive (``C:``) leaves it, and ``\\``
    counts as ``/`` (a folder written on Windows). Links inside the folder are its own (a Hugging Face cache snapshot
    links every file to ``blobs/`` beside it), so they are not followed; an absolute path that reaches the folder
    through another spelling of it (a linked parent) is inside too.
    """
    folder, text = Path(folder), str(entry).replace("\\", "/")
    if "\0" not in text and not re.match(r"[A-Za-z]:", text):
        base = os.path.abspath(folder)
        for top, path in ((base, os.path.normpath(os.path.join(base, text))),
                          (os.path.realpath(base), os.path.realpath(os.path.join(base, text)))):
            if path == top or path.startswith(top.rstrip("/") + "/"):
                rel = os.path.relpath(path, top)
                return folder if rel == "." else folder / rel
    raise CompressError(f"{at.where()} names {json.dumps(str(entry)[:200])}, which is not a path inside {folder}: "
                        f"a folder's records may only name files inside it; {at.fix}")
