"""What a model directory says about itself: ``compression.json`` (provenance, parent, lineage), ``metrics.json``,
and the model card written from the two.

Reading the records imports no model library: a model folder's task is read from them by the command line's data
check (:mod:`compress.core.data.check`); what writes them (provenance, the card) loads torch and transformers there.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import sys
from dataclasses import asdict, is_dataclass
from importlib import import_module
from pathlib import Path
from typing import Any, Iterator

from compress.core.config import loads_json
from compress.core.errors import CompressError
from compress.core.formats.layout import CARD_FILE, COMPRESSION_FILE, METRICS_FILE, OPENVINO_FILE
from compress.core.formats.schemas import BOOL, NUMBER, STR, ListOf, MapOf, Record, Schema, Whole, optional
from compress.core.formats.writes import write_json_atomic, write_text_atomic
from compress.core.lazy import load


# ---------------------------------------------------------------------------- dates and json


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def read_json(path: Path) -> Any:
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise CompressError(f"{path} does not exist") from None
    except OSError as err:  # a directory, no permission
        raise CompressError(f"cannot read {path}: {err.strerror or err}") from None
    return parse_json(data, path)


def parse_json(data: bytes, path: Path) -> Any:
    """The JSON in a file's bytes (read as text is: UTF-8, universal newlines); ``path`` names it in errors."""
    try:
        text = data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
        return loads_json(text, path)
    except ValueError as err:  # bad syntax, not UTF-8, an integer of more digits than Python converts
        raise CompressError(f"{path} is not valid JSON ({err}); restore or re-create it") from None


def read_record(path: Path, schema: Schema, fix: str | None = None) -> Any:
    """The JSON in ``path`` checked against ``schema`` (see :mod:`compress.core.formats.schemas`; ``fix``: what to do
    about a wrong field, when not the schema's own)."""
    return schema.check(read_json(path), path, fix)


# ---------------------------------------------------------------------------- the two records' schemas

TEXT = optional(STR)
# compression.json's fields this toolkit reads (written by compression_record and the stages' ``extra``); any other
# field is kept for people and passes. Counts are whole numbers, never their text.
STRUCTURE = Record({
    "num_layers": Whole(0), "hidden_size": Whole(1), "head_size": Whole(1),
    "heads": ListOf(Whole(0)), "ffn": ListOf(Whole(0)), "kept_layers": ListOf(Whole(0)),
    "pruned_heads": MapOf(ListOf(Whole(0))),  # layer index (a JSON key) -> original head ids removed
    "glu": BOOL, "first_token_last_layer": BOOL, "static": BOOL, "vocabulary": Whole(0),
})
TASK_SPEC = Record({  # a user's task (compress.core.data.tasks.Task.to_record)
    "name": STR, "kind": STR, "text_fields": ListOf(STR), "labels": optional(ListOf(STR)),
    "columns": optional(MapOf(STR)), "metric": TEXT, "metrics": optional(ListOf(STR)), "label_sep": TEXT,
    "threshold": optional(NUMBER),
}, required=("name", "kind", "text_fields"))
COMPRESSION = Schema(Record({
    "stage": TEXT, "method": TEXT, "format": TEXT, "precision": TEXT, "backend": TEXT, "scheme": TEXT, "head": TEXT,
    "inference_precision_hint": TEXT, "task": TEXT, "task_spec": optional(TASK_SPEC),
    "config": optional(Record({"task": TEXT, "inputs": optional(ListOf(STR))})),
    "parent": optional(Record({"path": TEXT, "hash": TEXT, "stage": TEXT})),
    "structure": optional(STRUCTURE), "outputs": optional(ListOf(STR)), "params": optional(Whole(0)),
    "summary": optional(Record({"params_after": optional(Whole(0))})),
    "provenance": optional(Record({"date": TEXT})),
    "teacher_check": optional(Record({"problems": optional(ListOf(STR)), "at_chance": BOOL})),
}), fix="restore the file, or re-create the folder with the stage that made it")

# A latency row as metrics.json keeps it (compress.eval.latency.row.Row.to_dict), the fields read back.
STAT_FIELDS = ("p50_ms", "p90_ms", "p99_ms", "mean_ms")
STATS = Record(dict.fromkeys(STAT_FIELDS, NUMBER), required=STAT_FIELDS)
LATENCY_ROW = Record({
    "batch": Whole(1), "seq": Whole(1), "p50_ms": NUMBER, "backend": TEXT, "params": optional(Whole(0)),
    "size_mb": optional(NUMBER), "slowest_run": optional(STATS),
})
RESULT = Record({  # one entry of metrics.json's results: an evaluation, a latency run, a retention, a training...
    "kind": TEXT, "task": TEXT, "split": TEXT, "n": optional(Whole(0)), "when": TEXT, "backend": TEXT,
    "metrics": MapOf(optional(NUMBER)),  # metric name -> value (NaN when undefined)
    "rows": ListOf(LATENCY_ROW), "metric": TEXT,
    "student": optional(NUMBER), "teacher": optional(NUMBER), "ratio": optional(NUMBER),  # a retention's scores
})
METRICS = Schema(Record({"results": ListOf(RESULT)}),
                 fix="restore the file, or fix or remove that entry (a folder without metrics.json has no results)")


# ---------------------------------------------------------------------------- provenance


def provenance(seed: int | None = None) -> dict[str, Any]:
    """Where a directory came from. ``threads`` (torch's intra-op threads) belongs with the seed: another
    thread count sums in another order, so the same command then trains to other weights."""
    # deferred, with compress.core.hardware (torch too): reading records costs no torch
    import torch

    return {
        "argv": list(sys.argv),
        "git": load("compress.core.hardware:git_revision")(),
        "packages": load("compress.core.hardware:package_versions")(),
        "seed": seed,
        "threads": torch.get_num_threads(),
        "date": utc_now(),
        "hardware": load("compress.core.hardware:hardware")(),
    }


def dir_hash(path: Path | str, known: dict[str, bytes] | None = None) -> str:
    """SHA-256 over a model directory's config and weight files (names and bytes); ``known``: files' bytes already read."""
    path, known = Path(path), known or {}
    digest = hashlib.sha256()
    names = sorted(
        p.name
        for p in path.iterdir()
        if p.is_file() and (p.suffix in {".safetensors", ".onnx", ".bin", ".data", ".pt2"} or p.name in ("config.json", OPENVINO_FILE))
    )
    for name in names:
        digest.update(name.encode())
        if name in known:
            digest.update(known[name])
            continue
        with open(path / name, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def parent_path(record: dict[str, Any]) -> str | None:
    """The parent directory a ``compression.json`` record names (None for a model made from nothing)."""
    parent = record.get("parent")
    if parent is None:
        return None
    path = parent.get("path") if isinstance(parent, dict) else parent
    if not isinstance(parent, dict) or not isinstance(path, (str, type(None))):
        raise CompressError(f"a compression.json names its parent as {parent!r}, not as {{\"path\": DIR, ...}}; "
                            "restore the file or remove its \"parent\" entry")
    if path and "\0" in path:  # no file system takes it: every use of the path would raise
        raise CompressError(f"a compression.json names its parent as {path!r}, which holds a NUL character; "
                            "restore the file or remove its \"parent\" entry")
    return path or None


def lineage(path: Path | str, limit: int = 64, *, record: dict[str, Any] | None = None) -> Iterator[tuple[Path, dict[str, Any]]]:
    """(directory, its compression.json) for ``path``, then its parent, grandparent, ... (resolved paths).

    A parent that no longer exists is yielded with an empty record and ends the chain, as
    does a directory that names no parent or ``limit`` ancestors; a loop (a folder that is its
    own ancestor) is refused, and an unreadable compression.json raises as :func:`read_compression` does.
    ``record``: ``path``'s own compression.json, when it has been read already.
    """
    current, seen = Path(path).resolve(), []
    while len(seen) <= limit:
        if seen or record is None:
            record = read_compression(current) if _is_dir(current) else {}
        seen.append(current)
        yield current, record
        parent = parent_path(record)
        if not parent:
            return
        current = Path(parent).resolve()
        if current in seen:
            loop = " -> ".join(str(p) for p in [*seen[seen.index(current):], current])
            raise CompressError(f"the compression.json files form a loop ({loop}): a model cannot be its own ancestor; "
                                f"fix \"parent\" in {seen[-1] / COMPRESSION_FILE}")


def _is_dir(path: Path) -> bool:
    """Whether ``path`` is a directory; False for a name no file system takes (too long), as for a missing one."""
    try:
        return path.is_dir()
    except OSError:
        return False


def read_compression(path: Path | str) -> dict[str, Any]:
    """The directory's ``compression.json`` ({} for a plain Hugging Face folder)."""
    file = Path(path) / COMPRESSION_FILE
    return compression_in(read_json(file), file) if file.exists() else {}


def compression_in(record: Any, file: Path) -> dict[str, Any]:
    """The JSON read from the compression.json ``file`` as a record; refused when it is none, or when it names its own
    folder as its parent."""
    if not isinstance(record, dict):
        raise CompressError(f"{file} holds {type(record).__name__}, not a record; restore the file or remove it")
    parent = parent_path(record)  # also refuses a parent that is not {"path": ...}
    COMPRESSION.check(record, file)
    if parent and Path(parent).resolve() == file.parent.resolve():
        raise CompressError(f"{file} names its own folder as its parent: a model cannot be its own ancestor; "
                            "fix or remove \"parent\" in it")
    return record


def compression_record(
    *,
    stage: str,
    method: str,
    config: Any = None,
    parent: Any = None,
    structure: dict[str, Any] | None = None,
    seed: int | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The content of ``compression.json`` for one stage's output (``parent``: see :func:`parent_entry`)."""
    cfg = asdict(config) if is_dataclass(config) else (config or {})
    record: dict[str, Any] = {
        "stage": stage,
        "method": method,
        "config": cfg,
        "parent": None,
        "structure": structure,
        "provenance": provenance(seed),
    }
    if parent is not None:
        record["parent"] = parent_entry(parent)
    if extra:
        record.update(extra)
    return record


def parent_entry(parent: Any) -> dict[str, Any]:
    """compression.json's ``parent``: the folder's resolved path, content hash and the stage that made it.

    ``parent`` is a path, or a folder a stage has opened (``compress.core.formats.folder.ModelFolder``, which this
    lower module knows by its ``record``): its hash and compression.json as already read.
    """
    if hasattr(parent, "record"):
        return {"path": str(parent.path.resolve()), "hash": parent.hash, "stage": parent.record.get("stage")}
    parent = Path(parent)
    return {
        "path": str(parent.resolve()),
        "hash": dir_hash(parent) if parent.is_dir() else None,
        "stage": read_compression(parent).get("stage") if parent.is_dir() else None,
    }


# ---------------------------------------------------------------------------- metrics.json


def read_metrics(path: Path | str) -> list[dict[str, Any]]:
    file = Path(path) / METRICS_FILE
    if not file.exists():
        return []
    return list(read_record(file, METRICS).get("results", []))


def append_metrics(path: Path | str, record: dict[str, Any]) -> dict[str, Any]:
    """Append one result (``when`` is filled in) to the directory's ``metrics.json``."""
    path = Path(path)
    record = {**record}
    record.setdefault("when", utc_now())
    results = read_metrics(path)
    results.append(record)
    write_json_atomic(path / METRICS_FILE, {"results": results})
    write_model_card(path)
    return record


def write_model_card(path: Path | str, name: str | None = None) -> None:
    """(Re)write a model directory's ``README.md`` from its records (see :mod:`compress.core.formats.card`).

    Only in a directory with config.json and compression.json, and never over a README.md
    the toolkit did not write (or a symbolic link).
    """
    # the card and the model families are loaded here: reading records costs no transformers
    card = import_module("compress.core.formats.card")
    head_of_class = load("compress.core.model.families:head_of_class")
    path = Path(path)
    file = path / CARD_FILE
    if not (path / "config.json").is_file() or not (path / COMPRESSION_FILE).is_file() or file.is_symlink():
        return
    if file.exists() and not card.written_here(file.read_text(encoding="utf-8", errors="replace")):
        return
    config, record = read_json(path / "config.json"), read_compression(path)
    head = record.get("head") or head_of_class((config.get("architectures") or [""])[0]) or "base"
    text = card.model_card(name or path.name, record, config, read_metrics(path), head=head,
                           sentence=(path / "modules.json").is_file())
    write_text_atomic(file, text)
