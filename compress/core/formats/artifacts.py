"""Model directories: save, load, provenance, metrics, and never losing an existing output.

A model directory is an ordinary Hugging Face folder (``config.json``,
``model.safetensors``, tokenizer files) plus two sidecars:

* ``compression.json``: what produced it (stage, method, resolved config, parent and
  its hash), its structure (see ``compress.core.model.structure``), and provenance (argv, git
  revision, package versions, seed, date, hardware).
* ``metrics.json``: ``{"results": [...]}``, one record per evaluation or latency run,
  appended.

Every output is written to a temporary sibling directory and renamed into place, so an
interrupted run never leaves a half-written model; an existing non-empty output is
refused unless ``overwrite`` is set.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import uuid
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any, Iterator

import torch
import transformers
from safetensors import SafetensorError
from safetensors.torch import load_file
from transformers import AutoTokenizer, BertTokenizerFast, PreTrainedTokenizerFast
from transformers.activations import ACT2FN

from compress.core.formats import card
from compress.core.model import structure as st
from compress.core.config import loads_json
from compress.core.errors import CompressError
from compress.core.model.families import class_names, family_of, get_family
from compress.core.hardware import git_revision, hardware, package_versions
# check_output and require_model_dir live in compress.core.preflight, which the command line runs before it imports
# torch; the stages import them from here.
from compress.core.preflight import _nearest_existing, _writable, check_output, require_model_dir  # noqa: F401
from compress.core.model.structure import apply_structure
from compress.core.formats.weight_checks import check_shard_names, check_tensors

try:
    import fcntl  # POSIX file locks, for build_lock
except ImportError:  # pragma: no cover - Windows
    fcntl = None

COMPRESSION_FILE = "compression.json"
METRICS_FILE = "metrics.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
LEGACY_WEIGHTS = "pytorch_model.bin"
ONNX_FILE = "model.onnx"
OPENVINO_FILE = "openvino_model.xml"  # OpenVINO IR (graph); its weights are openvino_model.bin beside it
CARD_FILE = "README.md"
# int8 PyTorch weights: a name no stock loader looks for, so transformers, pipeline and
# SentenceTransformer refuse the folder (no model.safetensors) instead of loading the fp32
# config.json with its Linear weights silently re-initialised.
INT8_WEIGHTS_FILE = "model.int8.safetensors"

# Artifact formats (compression.json's "format"); each has a loader in compress.core.formats.runtime.
TORCH = "torch"
TORCH_INT8 = "torch-int8-dynamic"
ONNX = "onnx"
INC_PT2E = "inc-pt2e"
OPENVINO = "openvino"
STATIC = "static"  # model2vec static token vectors (compress.core.formats.static); config.json's model_type is "model2vec"
INT8_FORMATS = (TORCH_INT8, INC_PT2E)  # an "onnx" directory is int8 when its precision says so

# Architectures the loader builds, by the name in config.json's "architectures", for
# every encoder family (compress.core.model.families), e.g. "RobertaForQuestionAnswering".
HEADS = class_names()
# BERT's class per head: what teacher creation and pretraining build (other families are loaded, not created).
HEAD_CLASSES = dict(get_family("bert").classes)
# Heads that exist only by training on a task: a folder saved with one must hold all its weights.
TRAINED_HEADS = ("sequence-classification", "token-classification", "question-answering")

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------- time and json


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


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


def read_json(path: Path) -> Any:
    try:
        return loads_json(Path(path).read_text(encoding="utf-8"), path)
    except FileNotFoundError:
        raise CompressError(f"{path} does not exist") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CompressError(f"{path} is not valid JSON ({err}); restore or re-create it") from None


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


@contextlib.contextmanager
def output_dir(out: Path | str, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary directory next to ``out``; on success rename it to ``out``.

    On any error the temporary directory is removed and an existing ``out`` is untouched.
    """
    out = check_output(out, overwrite).absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        yield tmp
        write_model_card(tmp, name=out.name)
        publish(tmp, out, overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


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


# ---------------------------------------------------------------------------- provenance


def provenance(seed: int | None = None) -> dict[str, Any]:
    """Where a directory came from. ``threads`` (torch's intra-op threads) belongs with the seed: another
    thread count sums in another order, so the same command then trains to other weights."""
    return {
        "argv": list(sys.argv),
        "git": git_revision(),
        "packages": package_versions(),
        "seed": seed,
        "threads": torch.get_num_threads(),
        "date": utc_now(),
        "hardware": hardware(),
    }


def dir_hash(path: Path | str) -> str:
    """SHA-256 over a model directory's config and weight files (names and bytes)."""
    path = Path(path)
    digest = hashlib.sha256()
    names = sorted(
        p.name
        for p in path.iterdir()
        if p.is_file() and (p.suffix in {".safetensors", ".onnx", ".bin", ".data", ".pt2"} or p.name in ("config.json", OPENVINO_FILE))
    )
    for name in names:
        digest.update(name.encode())
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
    return path or None


def lineage(path: Path | str, limit: int = 64) -> Iterator[tuple[Path, dict[str, Any]]]:
    """(directory, its compression.json) for ``path``, then its parent, grandparent, ... (resolved paths).

    A parent that no longer exists is yielded with an empty record and ends the chain, as
    does a directory that names no parent or ``limit`` ancestors; a loop (a folder that is its
    own ancestor) is refused, and an unreadable compression.json raises as :func:`read_compression` does.
    """
    current, seen = Path(path).resolve(), []
    while len(seen) <= limit:
        seen.append(current)
        record = read_compression(current) if current.is_dir() else {}
        yield current, record
        parent = parent_path(record)
        if not parent:
            return
        current = Path(parent).resolve()
        if current in seen:
            loop = " -> ".join(str(p) for p in [*seen[seen.index(current):], current])
            raise CompressError(f"the compression.json files form a loop ({loop}): a model cannot be its own ancestor; "
                                f"fix \"parent\" in {seen[-1] / COMPRESSION_FILE}")


def read_compression(path: Path | str) -> dict[str, Any]:
    """The directory's ``compression.json`` ({} for a plain Hugging Face folder)."""
    file = Path(path) / COMPRESSION_FILE
    if not file.exists():
        return {}
    record = read_json(file)
    if not isinstance(record, dict):
        raise CompressError(f"{file} holds {type(record).__name__}, not a record; restore the file or remove it")
    parent = parent_path(record)  # also refuses a parent that is not {"path": ...}
    if parent and Path(parent).resolve() == Path(path).resolve():
        raise CompressError(f"{file} names its own folder as its parent: a model cannot be its own ancestor; "
                            "fix or remove \"parent\" in it")
    return record


def compression_record(
    *,
    stage: str,
    method: str,
    config: Any = None,
    parent: Path | str | None = None,
    structure: dict[str, Any] | None = None,
    seed: int | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The content of ``compression.json`` for one stage's output."""
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
        parent = Path(parent)
        record["parent"] = {
            "path": str(parent.resolve()),
            "hash": dir_hash(parent) if parent.is_dir() else None,
            "stage": read_compression(parent).get("stage") if parent.is_dir() else None,
        }
    if extra:
        record.update(extra)
    return record


# ---------------------------------------------------------------------------- metrics.json


def read_metrics(path: Path | str) -> list[dict[str, Any]]:
    file = Path(path) / METRICS_FILE
    if not file.exists():
        return []
    data = read_json(file)
    return list(data.get("results", [])) if isinstance(data, dict) else []


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
    path = Path(path)
    file = path / CARD_FILE
    if not (path / "config.json").is_file() or not (path / COMPRESSION_FILE).is_file() or file.is_symlink():
        return
    if file.exists() and not card.written_here(file.read_text(encoding="utf-8", errors="replace")):
        return
    config, record = read_json(path / "config.json"), read_compression(path)
    head = record.get("head") or HEADS.get((config.get("architectures") or [""])[0], "base")
    text = card.model_card(name or path.name, record, config, read_metrics(path), head=head,
                           sentence=(path / "modules.json").is_file())
    write_text_atomic(file, text)


# ---------------------------------------------------------------------------- saving


def save_model_dir(
    model,
    out: Path | str,
    *,
    tokenizer=None,
    record: dict[str, Any],
    overwrite: bool = False,
    metrics: list[dict[str, Any]] | None = None,
    files: dict[str, Path] | None = None,
) -> Path:
    """Write ``model`` (+ tokenizer, ``compression.json``, ``metrics.json``) to ``out`` atomically.

    ``record`` comes from :func:`compression_record`; its ``structure`` is filled in from
    the model when missing. ``files`` are extra files copied in (name -> source path).
    """
    out = Path(out)
    with output_dir(out, overwrite) as tmp:
        write_model_files(model, tmp, tokenizer=tokenizer)
        record = {**record}
        if record.get("structure") is None:
            record["structure"] = st.describe(model)
        write_json_atomic(tmp / COMPRESSION_FILE, record)
        write_json_atomic(tmp / METRICS_FILE, {"results": list(metrics or [])})
        for name, source in (files or {}).items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)  # e.g. "1_Pooling/config.json"
            shutil.copy2(source, tmp / name)
    return out


def write_model_files(model, directory: Path, *, tokenizer=None) -> None:
    """config.json + model.safetensors (+ tokenizer files) in ``directory``."""
    widths = st.ffn_widths(model)
    if len(set(widths)) == 1:
        # Uniform width (e.g. after uniform FFN pruning): stock from_pretrained can load it.
        st.set_config_sizes(model.config, ffn=widths[0])
    model.save_pretrained(directory, safe_serialization=True)
    if tokenizer is not None:
        save_tokenizer(tokenizer, directory)


def save_tokenizer(tokenizer, directory: Path) -> None:
    """``tokenizer.save_pretrained(directory)`` without the truncation/padding its last call left behind."""
    tokenizer.save_pretrained(directory)
    clear_tokenizer_state(directory)


def clear_tokenizer_state(directory: Path) -> None:
    """Reset ``tokenizer.json``'s truncation and padding to none.

    A fast tokenizer keeps the truncation/padding of its last call in its backend and
    writes it into tokenizer.json: a folder saved after a run at max length 64 would
    silently truncate every later user's input at 64 (and an exported one pad to longest).
    """
    file = Path(directory) / "tokenizer.json"
    if not file.is_file():
        return
    data = read_json(file)
    if data.get("truncation") is not None or data.get("padding") is not None:
        write_json_atomic(file, {**data, "truncation": None, "padding": None})


# ---------------------------------------------------------------------------- loading


def is_model_dir(path: Path | str) -> bool:
    path = Path(path)
    return path.is_dir() and (path / "config.json").is_file()


def model_format(path: Path | str) -> str:
    """``torch`` (safetensors / .bin weights), ``onnx`` (model.onnx), ``openvino`` (openvino_model.xml) or ``static``
    (a model2vec folder, written elsewhere), from the files present."""
    path = Path(path)
    if _model_type(path) == "model2vec":
        return STATIC
    if (path / ONNX_FILE).is_file() and not (path / WEIGHTS_FILE).is_file():
        return "onnx"
    if (path / OPENVINO_FILE).is_file() and not (path / WEIGHTS_FILE).is_file():
        return OPENVINO
    return "torch"


def _model_type(path: Path) -> str | None:
    """config.json's ``model_type`` (None without a readable one: the loaders say what is wrong with it)."""
    try:
        raw = loads_json((path / "config.json").read_text(encoding="utf-8"), path / "config.json")
    except (OSError, ValueError, CompressError):
        return None
    return raw.get("model_type") if isinstance(raw, dict) else None


def artifact_format(path: Path | str) -> str:
    """The directory's format: compression.json's ``format``, else ``onnx``/``openvino``/``torch`` from its files."""
    return read_compression(path).get("format") or model_format(path)


def is_quantized(path: Path | str) -> bool:
    """True for an int8 directory (any backend)."""
    record = read_compression(path)
    return record.get("precision") == "int8" or record.get("format") in INT8_FORMATS


def require_torch_weights(path: Path | str, stage: str) -> Path:
    """Refuse int8 / ONNX directories for stages that train or edit weights, naming the fp32 parent."""
    path = require_model_dir(path)
    fmt = artifact_format(path)
    if fmt != TORCH:
        parent = parent_path(read_compression(path))
        hint = f" (it was made from {parent})" if parent else ""
        raise CompressError(
            f"{path} is a {fmt} model; {stage} needs PyTorch fp32 weights: use the model it was quantized or exported from{hint}"
        )
    return path


def load_config(path: Path | str):
    """The directory's config, read by its encoder family's config class; other model types are refused."""
    path = require_model_dir(path)
    raw = read_json(path / "config.json")
    model_type = raw.get("model_type") if isinstance(raw, dict) else None
    try:
        family = get_family(model_type)
    except CompressError as err:
        raise CompressError(f"{path}/config.json: {err}") from None
    check_config_values(raw, f"{path}/config.json")
    try:
        return getattr(transformers, family.config_class).from_pretrained(path, local_files_only=True)
    except Exception as err:
        raise CompressError(f"cannot read {path}/config.json: {err}") from None


# Sizes a config may hold, with a ceiling far above any real encoder's (XLM-R's 250k vocabulary, 8k positions):
# a value beyond it is a corrupt or hostile file, refused before a tensor of that size is allocated.
CONFIG_SIZES = {
    "vocab_size": 4_000_000, "hidden_size": 32_768, "num_hidden_layers": 512, "num_attention_heads": 1024,
    "intermediate_size": 262_144, "max_position_embeddings": 1_048_576, "type_vocab_size": 1024, "num_labels": 100_000,
    "dim": 32_768, "n_layers": 512, "n_heads": 1024, "hidden_dim": 262_144, "embedding_size": 32_768,
}
CONFIG_MIN = {"type_vocab_size": 0, "num_labels": 1}
EMBEDDING_BYTES = 64e9  # vocabulary x width x 4 bytes above this cannot be a model to compress here
ACTIVATION_KEYS = ("hidden_act", "hidden_activation", "activation")  # BERT/ELECTRA, ModernBERT, DistilBERT
EPSILON_KEYS = ("layer_norm_eps", "norm_eps")


def check_config_values(raw: dict, where: str) -> None:
    """Refuse a config whose sizes are not whole numbers in range (a string, a float, two billion rows), naming the key."""
    for key, ceiling in CONFIG_SIZES.items():
        if key not in raw:
            continue
        value, floor = raw[key], CONFIG_MIN.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or not floor <= value <= ceiling:
            raise CompressError(f"{where}: {key} is {value!r}; it must be a whole number from {floor} to {ceiling:,}. "
                                "Fix or re-create the file")
    width = raw.get("hidden_size", raw.get("dim", raw.get("embedding_size")))
    if isinstance(raw.get("vocab_size"), int) and isinstance(width, int) and raw["vocab_size"] * width * 4 > EMBEDDING_BYTES:
        raise CompressError(f"{where}: vocab_size {raw['vocab_size']:,} x width {width:,} would need "
                            f"{raw['vocab_size'] * width * 4 / 1e9:.0f} GB of embeddings; fix or re-create the file")
    for hidden, heads in (("hidden_size", "num_attention_heads"), ("dim", "n_heads")):
        if isinstance(raw.get(hidden), int) and isinstance(raw.get(heads), int) and raw[hidden] % raw[heads]:
            raise CompressError(f"{where}: {heads} {raw[heads]} does not divide {hidden} {raw[hidden]}; every head must have "
                                f"the same width, so {heads} must be a divisor of {raw[hidden]}. Fix or re-create the file")
    for key in ACTIVATION_KEYS:
        value = raw.get(key)
        if isinstance(value, str) and value not in ACT2FN:
            raise CompressError(f"{where}: {key} {value!r} is not an activation transformers knows; valid: "
                                f"{', '.join(sorted(ACT2FN))}. Fix or re-create the file")
    for key, value in raw.items():
        if "dropout" in key and value is not None and not (_is_number(value) and 0 <= value <= 1):
            raise CompressError(f"{where}: {key} is {value!r}; a dropout probability must be a number from 0 to 1 "
                                "(or null where the default applies). Fix or re-create the file")
        if key in EPSILON_KEYS and not (_is_number(value) and 0 < value < 1):
            raise CompressError(f"{where}: {key} is {value!r}; it must be a small positive number (BERT's is 1e-12). "
                                "Fix or re-create the file")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def saved_head(path: Path | str) -> str:
    """The head a directory's weights were saved with (``base`` for a bare encoder)."""
    config = load_config(path)
    archs = config.architectures or [family_of(config).classes["base"]]
    return HEADS.get(archs[0], "base")


def architecture_class(config, head: str):
    """The transformers class building ``head`` for the config's encoder family (``RobertaForMaskedLM``, ...)."""
    return getattr(transformers, family_of(config).head_class(head))


def load_tokenizer(path: Path | str):
    """The directory's fast tokenizer (vocab.txt or tokenizer.json)."""
    path = require_model_dir(path)
    if not any((path / name).is_file() for name in ("tokenizer.json", "vocab.txt")):
        raise CompressError(f"{path} has no tokenizer (tokenizer.json or vocab.txt); copy the parent model's tokenizer files into it")
    try:
        if model_format(path) == STATIC:  # AutoTokenizer would read model2vec's config.json as a transformers config
            tok = _static_tokenizer(path)
        else:
            tok = AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False, use_fast=True)
    except Exception as err:
        try:
            tok = BertTokenizerFast.from_pretrained(path, local_files_only=True)
        except Exception:
            raise CompressError(f"cannot load the tokenizer in {path}: {str(err).splitlines()[0]}") from None
    if not getattr(tok, "is_fast", False):
        raise CompressError(f"the tokenizer in {path} is not a fast tokenizer; save it with tokenizers' tokenizer.json")
    _check_ids_fit(tok, path)
    return check_tokenizer(tok, str(path))


def _static_tokenizer(path: Path):
    """A model2vec folder's tokenizer.json as a fast tokenizer; one saved without padding pads with its id 0 (padded
    positions are masked out, so any token does)."""
    tok = PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json"))
    if tok.pad_token is None:
        tok.pad_token = tok.convert_ids_to_tokens(0)
    return tok


def _check_ids_fit(tok, path: Path) -> None:
    """Refuse a tokenizer whose ids run past the folder's embedding matrix (an index error deep in the forward)."""
    raw = read_json(path / "config.json")
    rows = raw.get("vocab_size") if isinstance(raw, dict) else None
    top = max(tok.get_vocab().values(), default=-1)
    if isinstance(rows, int) and top >= rows:
        raise CompressError(f"the tokenizer in {path} gives ids up to {top}, but the model's embedding matrix has {rows} rows "
                            "(config.json vocab_size); the tokenizer belongs to another model, copy the tokenizer files of "
                            "the model these weights came from")


def check_tokenizer(tok, where: str):
    """Refuse a tokenizer that cannot encode arbitrary text: a WordPiece vocabulary without its unknown token
    (any unseen character would fail), or one with no ordinary token at all (e.g. made from an empty vocab file)."""
    vocab = tok.get_vocab()
    special = set(tok.all_special_tokens)
    if not any(token not in special for token in vocab):
        raise CompressError(f"the tokenizer from {where} has no ordinary tokens (an empty vocabulary?); "
                            "pass a vocab.txt with one token per line or a trained tokenizer")
    try:  # the failure itself: a word-piece model without its unknown token cannot encode an unseen character
        tok("\u2603 qzxjvk")
        encodes = True
    except Exception:  # tokenizers raises a bare Exception ("WordPiece error: Missing [UNK] token ...")
        encodes = False
    if not encodes:
        raise CompressError(f"the tokenizer from {where} has no unknown token ({tok.unk_token or '[UNK]'}) in its vocabulary, "
                            "so text with an unseen word cannot be encoded; add it to the vocabulary")
    return tok


def _read_weights(path: Path) -> dict:
    """The folder's tensors by name, checked (:mod:`compress.core.formats.weight_checks`) before anything uses them."""
    index = path / WEIGHTS_INDEX
    file = path / WEIGHTS_FILE
    try:
        if file.is_file():
            state = load_file(file)
            check_tensors(state, file)
            return state
        if index.is_file():
            raw = read_json(index)
            shards = check_shard_names(path, index, raw.get("weight_map") if isinstance(raw, dict) else None)
            state = {}
            for shard in shards:
                part = load_file(path / shard)
                check_tensors(part, path / shard)
                state.update(part)
            return state
    except (SafetensorError, OSError, ValueError, KeyError) as err:
        raise CompressError(
            f"{file} is corrupt or truncated ({str(err).splitlines()[0]}); re-create the model directory"
        ) from None
    if (path / LEGACY_WEIGHTS).is_file():
        try:
            # weights_only: a checkpoint must never be able to run code on load.
            state = torch.load(path / LEGACY_WEIGHTS, map_location="cpu", weights_only=True)
        except Exception as err:
            raise CompressError(f"cannot read {path}/{LEGACY_WEIGHTS} safely: {str(err).splitlines()[0]}") from None
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise CompressError(f"{path}/{LEGACY_WEIGHTS} is not a state dict of tensors; re-save the model with save_pretrained")
        check_tensors(state, path / LEGACY_WEIGHTS)
        return state
    if (path / ONNX_FILE).is_file():
        raise CompressError(f"{path} holds an ONNX model (model.onnx), which has no PyTorch weights; use a PyTorch model directory for this stage")
    raise CompressError(f"{path} has no weights (model.safetensors); is the directory complete?")


def _rename_legacy(key: str) -> str:
    # Checkpoints converted from the original TF code name LayerNorm parameters gamma/beta.
    if key.endswith(".gamma"):
        return key[: -len(".gamma")] + ".weight"
    if key.endswith(".beta"):
        return key[: -len(".beta")] + ".bias"
    return key


def load_torch_model(
    path: Path | str,
    head: str | None = None,
    *,
    num_labels: int | None = None,
    id2label: dict[int, str] | None = None,
    attn_implementation: str | None = None,
    with_info: bool = False,
    seed: int = 0,
):
    """Rebuild a PyTorch model directory, pruned shapes included (other formats: ``runtime.load_model``).

    ``head`` is one of ``base``, ``sequence-classification``, ``token-classification``,
    ``question-answering``, ``masked-lm``, ``pretraining``; by default the head the weights
    were saved with. A different head (e.g. a classifier on a bare encoder) starts with fresh
    head weights; so does a classifier whose ``num_labels`` changes. Fresh weights are drawn
    from ``seed`` alone: the same directory and seed give the same model in any process (torch
    seeds its own generator at random when a process starts), and the caller's random state
    is left as it was. With ``with_info`` the function returns ``(model, info)`` where
    ``info["new_weights"]`` lists the freshly initialised names.
    """
    path = require_model_dir(path)
    config = load_config(path)
    saved = saved_head(path)
    head = head or saved
    if head not in HEAD_CLASSES:
        raise CompressError(f"unknown model head {head!r}; valid: {', '.join(HEAD_CLASSES)}")
    cls = architecture_class(config, head)  # refuses a head the family has none of
    drop_head = False
    if num_labels is not None and num_labels != config.num_labels:
        drop_head = head == saved  # the saved classifier has the wrong width
        config.num_labels = num_labels
    if id2label is not None:
        config.id2label = {int(k): v for k, v in id2label.items()}
        config.label2id = {v: int(k) for k, v in id2label.items()}
    if attn_implementation:
        config._attn_implementation = attn_implementation
    config.architectures = [cls.__name__]

    structure = (read_compression(path) or {}).get("structure")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config)  # transformers 4.x builds pruned heads from config.pruned_heads
    if structure:
        apply_structure(model, structure)
    # A task head the folder says it was trained with must be in the file, not drawn afresh.
    trained_head = head == saved and not drop_head and head in TRAINED_HEADS
    missing = _load_weights_into(model, _read_weights(path), path, drop_head, trained_head=trained_head)
    model.tie_weights()
    model.eval()
    model.to(torch.float32)
    if with_info:
        return model, {"new_weights": missing, "saved_head": saved, "structure": structure}
    return model


def _load_weights_into(model, weights: dict, path: Path, drop_head: bool, *, trained_head: bool = False) -> list[str]:
    """Load a folder's tensors into ``model`` (names aligned to its base-model prefix); the names left fresh.

    Refuses tensors whose shapes disagree with the built model, and a missing encoder weight
    (only a head's or the optional pooler's may be missing: they start fresh), and with
    ``trained_head`` (config.json names the task head being loaded) any missing weight at all.
    """
    state = {_rename_legacy(k): v for k, v in weights.items()}
    prefix = model.base_model_prefix  # "bert", "roberta", "distilbert", "electra", "model" (ModernBERT)
    wants_prefix = any(k.startswith(prefix + ".") for k in model.state_dict())
    has_prefix = any(k.startswith(prefix + ".") for k in state)
    head_parts = tuple(f"{name}." for name, _ in model.named_children() if name != prefix)  # "cls.", "classifier." ...
    if wants_prefix and not has_prefix:
        state = {(f"{prefix}.{k}" if not k.startswith(head_parts) else k): v for k, v in state.items()}
    elif not wants_prefix and has_prefix:
        state = {k[len(prefix) + 1:]: v for k, v in state.items() if k.startswith(prefix + ".")}
    if drop_head:  # every head weight goes: the classifier has the wrong width
        state = {k: v for k, v in state.items() if k.startswith(prefix + ".")}

    expected = model.state_dict()
    mismatched = [
        f"{k}: file {tuple(v.shape)} vs model {tuple(expected[k].shape)}"
        for k, v in state.items()
        if k in expected and tuple(v.shape) != tuple(expected[k].shape)
    ]
    if mismatched:
        raise CompressError(
            f"weights in {path} do not match its config.json/compression.json "
            f"({len(mismatched)} tensors, e.g. {mismatched[0]}); the directory is inconsistent"
        )
    result = model.load_state_dict({k: v for k, v in state.items() if k in expected}, strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    missing = [k for k in result.missing_keys if k not in tied and not k.endswith("position_ids")]

    def encoder_weight(key: str) -> bool:  # not a head's, not the (optional) pooler's
        if wants_prefix and not key.startswith(prefix + "."):
            return False
        return not (key[len(prefix) + 1:] if wants_prefix else key).startswith("pooler.")

    if trained_head and missing:
        raise CompressError(
            f"{path}/config.json says the model is a fine-tuned {type(model).__name__}, but its weights lack "
            f"{len(missing)} of its tensors (e.g. {missing[0]}), which would be drawn at random; copy the complete "
            "weights from the fine-tuned model, or remove \"architectures\" from config.json to use it as a base encoder"
        )
    lost = [k for k in missing if encoder_weight(k)]
    if lost:
        raise CompressError(
            f"{path} lacks {len(lost)} encoder weights (e.g. {lost[0]}); the checkpoint is incomplete "
            "or belongs to another architecture"
        )
    return missing
