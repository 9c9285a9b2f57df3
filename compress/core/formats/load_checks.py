"""The steps every stored (int8 or exported) format's loader shares: refuse what fixed weights cannot honour,
return the model (with its info when asked), and load a graph file's runner.

``options`` is the dict ``runtime.load_model`` hands every loader: ``head``, ``num_labels``,
``id2label``, ``attn_implementation``, ``with_info``, ``threads``, ``device``, ``compile``, ``seed``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from compress.core.errors import CompressError
from compress.core.formats.architecture import structure_of
from compress.core.formats.folder import ModelFolder


def check_options(path: Path, fmt: str, config, saved: str, options: dict[str, Any], *, eager_ok: bool = False) -> None:
    """Refuse load options a stored (int8 or exported) model cannot honour, in one line."""
    head, num_labels = options.get("head"), options.get("num_labels")
    if head is not None and head != saved:
        raise CompressError(
            f"{path} is a {fmt} model with a {saved} head and cannot be given a {head} head "
            "(its weights are fixed); use the PyTorch model it was made from"
        )
    if num_labels is not None and num_labels != config.num_labels:
        raise CompressError(
            f"{path} is a {fmt} model with {config.num_labels} outputs, not {num_labels}; "
            "use the PyTorch model it was made from to train a new classifier"
        )
    attn = options.get("attn_implementation")
    if attn and not eager_ok:
        raise CompressError(
            f"{path} is a {fmt} model: it runs as stored and cannot switch to {attn!r} attention "
            "(e.g. to return attention maps); use the PyTorch model it was made from"
        )
    if options.get("id2label"):
        # Renaming labels touches no weight: allowed, as for PyTorch directories.
        id2label = {int(k): v for k, v in options["id2label"].items()}
        config.id2label, config.label2id = id2label, {v: k for k, v in id2label.items()}


def with_info(model, saved: str, structure, fmt: str, options: dict[str, Any]):
    """``model``, or ``(model, info)`` when ``options`` asks ``with_info`` (no new weights: the stored head)."""
    if options.get("with_info"):
        return model, {"new_weights": [], "saved_head": saved, "structure": structure, "format": fmt}
    return model


def load_graph_runner(folder: ModelFolder, options: dict[str, Any], fmt: str, file: str, runner_class: type):
    """A runner of a graph file (ONNX Runtime, OpenVINO): the file checked, the options checked, placed."""
    path = folder.path
    if not (path / file).is_file():
        raise CompressError(f"{path} has no {file}; is the directory complete?")
    config, saved = folder.fresh_config(), folder.head
    check_options(path, fmt, config, saved, options)
    runner = runner_class(path, config, saved, threads=options.get("threads"))
    if options.get("device") is not None:
        runner.to(options["device"])
    return with_info(runner, saved, structure_of(path), fmt, options)
