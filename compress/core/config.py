"""Frozen dataclass configs: one per stage, loaded from YAML/JSON or flags, validated.

A config field is declared with :func:`option`, which keeps the one-line help next to
the default; the CLI turns every field into a ``--flag`` from that help, so a config and
its command line never drift apart::

    @dataclass(frozen=True)
    class EvalConfig:
        batch_size: int = option(32, "sequences per forward pass")

Values from a file or from flags are type-checked against the annotations (``int``,
``float``, ``str``, ``bool``, ``X | None``, ``tuple[int, ...]``, ``Literal[...]``) and
unknown keys are rejected with the list of valid ones. A field whose values are a fixed
set names them with ``choices=`` (usually a registry's names, read when the flag is
built), and ``--help`` shows them. A number with a range names it with ``bounds=`` (:data:`SEEDS`,
:data:`THREADS`): a value outside it is refused where the value is read, before any work.

A config that nests others (``data: TaskData``, ``train: TrainConfig``) is decorated with
:func:`flat_keywords`, so that it is built with the same flat names as its flags and
recipe keys: ``DistillConfig(task="sst2", data_dir="glue/", epochs=2)``.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Sequence, TypeVar, get_args, get_origin

import yaml

from compress.core.errors import CompressError, reason
from compress.core.registry import Registry

C = TypeVar("C")

# The range of every seed a config holds: what each generator the stages seed accepts (numpy's legacy RandomState, the
# narrowest, takes 0 .. 2**32 - 1; torch.manual_seed overflows past 2**64 - 1, and a step seed is derived by arithmetic).
SEEDS = (0, 2**32 - 1)
# The range of a thread count: a pool of hundreds of thousands of threads crashes the runtime (a worker killed by a
# signal) before any library refuses it; 1024 is above the cores of any machine this runs on.
THREADS = (1, 1024)


class Choices(list):
    """The valid values of a flag as ``--help`` lists them; ``accept`` also admits unlisted spellings (aliases)."""

    def __init__(self, names: Iterable[str], accept: Callable[[str], bool] | None = None):
        super().__init__(names)
        self.accept = accept

    def __contains__(self, value: object) -> bool:
        return super().__contains__(value) or (self.accept is not None and self.accept(str(value)))


def option(default: Any, help: str, *, flag: str | None = None, metavar: str | None = None,
           choices: Sequence[str] | Callable[[], Sequence[str]] | None = None, other: str | None = None,
           bounds: tuple[float, float] | None = None) -> Any:
    """A dataclass field with its help text (and optional flag name / metavar / choices / bounds) attached.

    ``choices`` are the valid values (or a function returning them, called when the flag is
    built, so that a registry filled after the class is defined is its source); the command
    line refuses any other. With ``other`` (e.g. ``"LAYERSL-HIDDEN[-FFN]"``) the set is open:
    the choices are shown next to that description and not enforced. ``bounds`` is the
    inclusive (low, high) range of a number (None passes: it means the default).
    """
    meta = {"help": help, "flag": flag, "metavar": metavar, "choices": choices, "other": other, "bounds": bounds}
    if isinstance(default, (list, dict, set)):
        raise TypeError("use tuples for sequence defaults: configs are frozen")
    return dataclasses.field(default=default, metadata=meta)


def choices_of(f: dataclasses.Field) -> list[str] | None:
    """The listed choices of a field (a registry's names, resolved now), or None."""
    choices = f.metadata.get("choices")
    if choices is None:
        return None
    return choices() if callable(choices) else list(choices)


def check_bounds(f: dataclasses.Field, value: Any, where: str) -> None:
    """Refuse a number outside its field's ``bounds``, naming its flag and the range (a seed of 2**70, 100000 threads)."""
    bounds = f.metadata.get("bounds")
    for item in (value if isinstance(value, tuple) else (value,)) if bounds is not None else ():
        if item is not None and not bounds[0] <= item <= bounds[1]:
            raise CompressError(f"{where}: {flag_name(f)} must be from {bounds[0]} to {bounds[1]}, got {item}")


def in_bounds(bounds: tuple[int, int]) -> Callable[[str], int]:
    """An argparse ``type`` for a plain flag (not a config field): a whole number within ``bounds``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if not bounds[0] <= value <= bounds[1]:
            raise argparse.ArgumentTypeError(f"must be from {bounds[0]} to {bounds[1]}, got {value}")
        return value

    return parse


def check_name(kind: str, name: str, valid: Sequence[str]) -> None:
    """Refuse a ``kind`` name (a loss term, a format) that is none of ``valid`` as a registry of them would: the valid
    names listed, a close one suggested. A light config checks a registry's names so, without importing its entries."""
    names: Registry[str] = Registry(kind)
    for known in valid:
        names.register(known, known)
    names.get(name)


def loads_json(text: str, where: Path | str) -> Any:
    """``json.loads`` whose nesting is bounded: a document nested past Python's recursion limit (a few thousand
    levels; no data or config file needs ten) is refused naming ``where``. Syntax errors raise as json's own."""
    try:
        return json.loads(text)
    except RecursionError:
        raise CompressError(f"{where} nests its JSON deeper than Python can read (over {sys.getrecursionlimit()} "
                            "levels); it cannot be a data or config file, restore or re-create it") from None


def load_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML (``yaml.safe_load``: no arbitrary objects) or JSON mapping."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CompressError(f"config file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as err:
        raise CompressError(f"cannot read config file {path}: {err}") from None
    try:
        data = loads_json(text, path) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise CompressError(f"{path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {reason(err)}") from None
    except RecursionError:  # YAML's composer recurses once per level, as json's parser does
        raise CompressError(f"{path} nests deeper than Python can read (over {sys.getrecursionlimit()} levels); "
                            "an options file needs a few levels, fix the file") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise CompressError(f"{path} must contain a mapping of option names to values")
    return data


def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp))
    if origin is tuple:
        return f"list of {_type_name(get_args(tp)[0])}"
    return getattr(tp, "__name__", str(tp))


def coerce(value: Any, tp: Any, where: str) -> Any:
    """Check (and for strings from the command line, convert) ``value`` to type ``tp``."""
    origin = get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = get_args(tp)
        if value is None or (isinstance(value, str) and value.lower() in {"none", "null"} and type(None) in args):
            if type(None) in args:
                return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return coerce(value, arg, where)
            except CompressError as err:
                errors.append(err)
        raise CompressError(f"{where}: expected {_type_name(tp)}, got {value!r}")
    if origin is Literal:
        choices = get_args(tp)
        if value in choices:
            return value
        raise CompressError(f"{where}: {value!r} is not one of {', '.join(map(repr, choices))}")
    if origin is tuple:
        item = get_args(tp)[0]
        if isinstance(value, str):
            value = [v for v in (p.strip() for p in value.split(",")) if v]
        elif not isinstance(value, (list, tuple)):
            value = [value]
        return tuple(coerce(v, item, where) for v in value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in {"true", "yes", "1", "on", "false", "no", "0", "off"}:
            return value.lower() in {"true", "yes", "1", "on"}
        raise CompressError(f"{where}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise CompressError(f"{where}: expected an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        raise CompressError(f"{where}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, bool):
            raise CompressError(f"{where}: expected a number, got {value!r}")
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise CompressError(f"{where}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, (str, Path)):
            return str(value)
        raise CompressError(f"{where}: expected a string, got {value!r}")
    if tp is Any:
        return value
    raise TypeError(f"unsupported config type {tp!r}")


def _nested(cls) -> dict[str, type]:
    """Fields of ``cls`` that are themselves configs (e.g. ``train: TrainConfig``)."""
    hints = _hints(cls)
    return {
        f.name: hints[f.name]
        for f in dataclasses.fields(cls)
        if isinstance(hints[f.name], type) and dataclasses.is_dataclass(hints[f.name])
    }


def field_names(cls) -> list[str]:
    """Every option name of ``cls``, nested configs' options included (they are flat on the CLI)."""
    names = []
    for f in dataclasses.fields(cls):
        nested = _nested(cls).get(f.name)
        names.extend(field_names(nested) if nested else [f.name])
    return names


def flat_keywords(cls: type[C]) -> type[C]:
    """Let a config that nests others be built with flat keywords, as on the command line.

    ``PruneConfig(task="sst2", data_dir="glue/", lr=1e-4)`` routes ``data_dir`` into its
    ``data: TaskData`` and ``lr`` into its ``train: TrainConfig`` (each starting from the
    field's own default, or from the nested config passed alongside); an unknown name is a
    TypeError that lists the valid ones. ``dataclasses.replace`` goes through the same path.
    """
    init = cls.__init__
    nested = _nested(cls)
    own = {f.name for f in dataclasses.fields(cls)}
    owners = {name: field for field, sub in nested.items() for name in field_names(sub)}
    defaults = {f.name: f.default_factory for f in dataclasses.fields(cls)
                if f.name in nested and f.default_factory is not dataclasses.MISSING}

    @functools.wraps(init)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        routed: dict[str, dict[str, Any]] = {}
        for key in [k for k in kwargs if k not in own]:
            if key not in owners:
                valid = [n for n in own if n not in nested] + list(owners)
                raise TypeError(f"{cls.__name__}: unknown option {key!r}; valid: {', '.join(valid)}")
            routed.setdefault(owners[key], {})[key] = kwargs.pop(key)
        for field, values in routed.items():
            base = kwargs.get(field)
            if base is None:
                base = defaults[field]() if field in defaults else nested[field]()
            kwargs[field] = dataclasses.replace(base, **values)
        init(self, *args, **kwargs)

    cls.__init__ = __init__
    return cls


def from_dict(cls: type[C], data: dict[str, Any], where: str = "config", validate: bool = True) -> C:
    """Build a config from a mapping; keys may use dashes or underscores.

    A nested config field (``train: TrainConfig``) accepts a mapping, and its options
    may also be given flat at the top level (``lr: 3e-5``), as on the command line.
    """
    hints = _hints(cls)
    nested = _nested(cls)
    by_name = {f.name: f for f in dataclasses.fields(cls)}
    names = list(by_name)
    values: dict[str, Any] = {}
    routed: dict[str, dict[str, Any]] = {name: {} for name in nested}
    for raw_key, value in data.items():
        key = str(raw_key).replace("-", "_")
        if key in nested:
            if isinstance(value, nested[key]):
                value = dataclasses.asdict(value)
            if not isinstance(value, dict):
                raise CompressError(f"{where}: {raw_key} must be a mapping of options")
            routed[key].update(value)
            continue
        if key in names:
            values[key] = coerce(value, hints[key], f"{where}: {raw_key}")
            check_bounds(by_name[key], values[key], where)
            continue
        owner = [n for n, sub in nested.items() if key in field_names(sub)]
        if owner:
            routed[owner[0]][key] = value
            continue
        valid = [n for n in names if n not in nested] + [n for sub in nested.values() for n in field_names(sub)]
        close = difflib.get_close_matches(key, valid, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise CompressError(f"{where}: unknown option {raw_key!r}{hint}; valid: {', '.join(valid)}")
    defaults = {f.name: f.default_factory() for f in dataclasses.fields(cls)
                if f.name in nested and f.default_factory is not dataclasses.MISSING}
    for name, sub in nested.items():
        # Start from the field's own default (a stage may default lr=1e-4 where TrainConfig says 2e-5).
        base = dataclasses.asdict(defaults[name]) if name in defaults else {}
        values[name] = from_dict(sub, {**base, **routed[name]}, where, validate)
    try:
        cfg = cls(**values)
    except TypeError as err:
        raise CompressError(f"{where}: {err}") from None
    check = getattr(cfg, "validate", None)
    if validate and callable(check):
        check()
    return cfg


def replace(cfg: C, **changes: Any) -> C:
    """A copy of ``cfg`` with type-checked changes."""
    return from_dict(type(cfg), {**dataclasses.asdict(cfg), **changes}, type(cfg).__name__)


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


# ---------------------------------------------------------------------------- argparse bridge


def flag_name(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser, cls: type, skip: tuple[str, ...] = (), defaults: Any = None) -> None:
    """Add one ``--flag`` per config field; defaults stay in the dataclass (argparse sees None).

    Nested configs get their own argument group, with flat flag names; ``defaults`` is
    the instance whose values the help shows (a nested field's own default).
    """
    hints = _hints(cls)
    nested = _nested(cls)
    group = parser.add_argument_group(f"{cls.__name__} options (also settable in --config FILE)")
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        if f.name in nested:
            sub_default = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
            add_arguments(parser, nested[f.name], skip, sub_default)
            continue
        tp = hints[f.name]
        default = getattr(defaults, f.name) if defaults is not None else f.default
        help_text = f.metadata.get("help", "")
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
        said = [f"default: {shown}"] if default not in (None, "", ()) else []
        bounds = f.metadata.get("bounds")
        said += [f"from {bounds[0]} to {bounds[1]}"] if bounds is not None else []
        help_text += f" ({'; '.join(said)})" if said else ""
        # argparse %-formats help strings: a literal "%" must be doubled.
        kwargs: dict[str, Any] = {"dest": f.name, "default": None, "help": help_text.replace("%", "%%")}
        choices = choices_of(f)
        if tp is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif choices is not None and f.metadata.get("other"):  # an open set: show the choices, accept others
            kwargs["metavar"] = "{" + ",".join(choices) + "}|" + f.metadata["other"]
        elif choices is not None or get_origin(tp) is Literal:
            kwargs["choices"] = choices if choices is not None else list(get_args(tp))
        else:
            kwargs["metavar"] = f.metadata.get("metavar") or _metavar(tp)
        group.add_argument(flag_name(f), **kwargs)


def _metavar(tp: Any) -> str:
    origin = get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        tp = next(a for a in get_args(tp) if a is not type(None))
        origin = get_origin(tp)
    if origin is tuple:
        return _metavar(get_args(tp)[0]) + "[,...]"
    return {int: "N", float: "X", str: "TEXT"}.get(tp, "VALUE")


def _overrides(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    nested = _nested(cls)
    for f in dataclasses.fields(cls):
        if f.name in nested:
            sub = _overrides(nested[f.name], args)
            if sub:
                out[f.name] = sub
        elif getattr(args, f.name, None) is not None:
            out[f.name] = getattr(args, f.name)
    return out


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in top.items():
        merged[key] = _deep_merge(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) else value
    return merged


def from_args(cls: type[C], args: argparse.Namespace, config_file: str | None = None) -> C:
    """Config from an optional file, then the flags that were given on the command line."""
    data = load_file(config_file) if config_file else {}
    where = str(config_file) if config_file else "options"
    base = from_dict(cls, data, where, validate=False)  # names and types of the file's keys
    merged = _deep_merge(dataclasses.asdict(base), _overrides(cls, args))
    return from_dict(cls, merged, "options")
