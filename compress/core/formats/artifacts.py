"""Model directories: write one (never losing an existing output), tell its format, rebuild its PyTorch model.

The folder's files and formats are named in :mod:`compress.core.formats.layout`, its records written and read by
:mod:`compress.core.formats.records`. A folder opened for reading is a :class:`~compress.core.formats.folder.ModelFolder`;
the path-taking readers here (``load_config``, ``load_tokenizer``, ``saved_head``, ``require_torch_weights``) open
one and read its part, and :func:`load_torch_folder` rebuilds its PyTorch model. Every output is built in a temporary
sibling directory and renamed into place (:func:`output_dir`), so an interrupted run never leaves a half-written
model; an existing non-empty output is refused unless ``overwrite`` is set.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Any, Iterator

import torch
import transformers
from safetensors import SafetensorError
from safetensors.torch import load_file

from compress.core.config import loads_json
from compress.core.errors import CompressError, reason
from compress.core.formats.layout import COMPRESSION_FILE, LEGACY_WEIGHTS, METRICS_FILE, ONNX_FILE, WEIGHTS_FILE, WEIGHTS_INDEX
from compress.core.formats.folder import ModelFolder, files_format, is_int8, open_folder
from compress.core.formats.records import read_compression, read_json, write_model_card
from compress.core.formats.weight_checks import check_shard_names, check_tensors
from compress.core.formats.writes import staged_dir, write_json_atomic
from compress.core.model import structure as st
from compress.core.model.families import family_of
from compress.core.model.heads import get_head
from compress.core.model.structure import apply_structure
from compress.core.preflight import check_output


# ---------------------------------------------------------------------------- saving


@contextlib.contextmanager
def output_dir(out: Path | str, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary directory next to ``out``; on success rename it to ``out`` (``writes.staged_dir``).

    On any error the temporary directory is removed and an existing ``out`` is untouched.
    """
    out = check_output(out, overwrite).absolute()
    with staged_dir(out, overwrite) as tmp:  # a failed write named, the temporary directory removed on any failure
        yield tmp
        write_model_card(tmp, name=out.name)


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

    ``record`` comes from :func:`records.compression_record`; its ``structure`` is filled in from
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
    """``torch``, ``onnx``, ``openvino`` or ``static`` from the files present (:func:`folder.files_format`); any path,
    a model folder or not."""
    path = Path(path)
    return files_format(path, _model_type(path))


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
    return is_int8(read_compression(path))


def require_torch_weights(path: Path | str, stage: str) -> Path:
    """Refuse int8 / ONNX directories for stages that train or edit weights, naming the fp32 parent
    (:meth:`ModelFolder.check_torch` of the folder at ``path``)."""
    return open_folder(path).check_torch(stage).path


def load_config(path: Path | str):
    """The directory's config, read by its encoder family's config class; other model types are refused
    (:attr:`ModelFolder.config` of the folder at ``path``)."""
    return open_folder(path).config


def saved_head(path: Path | str) -> str:
    """The head a directory's weights were saved with (``base`` for a bare encoder; :attr:`ModelFolder.head`)."""
    return open_folder(path).head


def architecture_class(config, head: str):
    """The transformers class building ``head`` for the config's encoder family (``RobertaForMaskedLM``, ...)."""
    return getattr(transformers, family_of(config).head_class(head))


def load_tokenizer(path: Path | str):
    """The directory's fast tokenizer (vocab.txt or tokenizer.json; :attr:`ModelFolder.tokenizer`)."""
    return open_folder(path).tokenizer


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
            f"{file} is corrupt or truncated ({reason(err)}); re-create the model directory"
        ) from None
    if (path / LEGACY_WEIGHTS).is_file():
        try:
            # weights_only: a checkpoint must never be able to run code on load.
            state = torch.load(path / LEGACY_WEIGHTS, map_location="cpu", weights_only=True)
        except Exception as err:
            raise CompressError(f"cannot read {path}/{LEGACY_WEIGHTS} safely: {reason(err)}") from None
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


def load_torch_folder(
    folder: ModelFolder,
    head: str | None = None,
    *,
    num_labels: int | None = None,
    id2label: dict[int, str] | None = None,
    attn_implementation: str | None = None,
    with_info: bool = False,
    seed: int = 0,
):
    """Rebuild a PyTorch model directory, pruned shapes included (other formats: ``runtime.load_folder_model``).

    ``head`` is one of ``base``, ``sequence-classification``, ``token-classification``,
    ``question-answering``, ``masked-lm``, ``pretraining``; by default the head the weights
    were saved with. A different head (e.g. a classifier on a bare encoder) starts with fresh
    head weights; so does a classifier whose ``num_labels`` changes. Fresh weights are drawn
    from ``seed`` alone: the same directory and seed give the same model in any process (torch
    seeds its own generator at random when a process starts), and the caller's random state
    is left as it was. With ``with_info`` the function returns ``(model, info)`` where
    ``info["new_weights"]`` lists the freshly initialised names.
    """
    path, config, saved = folder.path, folder.fresh_config(), folder.head
    head = head or saved
    spec = get_head(head)  # refuses an unknown head, naming the valid ones
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

    structure = folder.record.get("structure")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config)  # transformers 4.x builds pruned heads from config.pruned_heads
    if structure:
        apply_structure(model, structure)
    # A task head the folder says it was trained with must be in the file, not drawn afresh.
    trained_head = head == saved and not drop_head and spec.trained
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
