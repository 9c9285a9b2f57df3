"""How to load and run every model-directory format, so eval and latency treat them alike.

A directory's format is the ``"format"`` field of its ``compression.json`` (``torch``
when absent; a folder holding only ``model.onnx`` is ``onnx``):

=====================  ==================  ============================================
format                 weights file        runs as
=====================  ==================  ============================================
``torch``              model.safetensors   the Hugging Face encoder (``artifacts.load_model``)
``torch-int8-dynamic`` model.int8.         the same encoder with torch.ao dynamic int8
                       safetensors         Linear layers (per-channel qint8 weights);
                       (int8 + scales)     stock loaders find no model.safetensors and refuse
``onnx``               model.onnx          an ONNX Runtime session (fp32 or int8 graph)
``inc-pt2e``           model.pt2           a ``torch.export`` program quantized by Neural
                                           Compressor (PT2E), compiled by inductor
``openvino``           openvino_model.xml  an OpenVINO compiled model on the CPU (fp32 or
                       + .bin              NNCF int8 IR), f32 unless another precision is
                                           asked for (``compress.core.formats.openvino`` writes it)
``ctranslate2``        model.bin +         ``ctranslate2.Encoder`` (its stored compute type) and the
                       head.safetensors    task head in NumPy on its outputs
                                           (``compress.core.formats.ctranslate2`` writes it)
=====================  ==================  ============================================

:func:`load_model` (a path) and :func:`load_folder_model` (an opened :class:`ModelFolder`) return, for every
format, an object the evaluation code uses exactly like a Hugging Face model: called with ``input_ids`` / ``attention_mask`` /
``token_type_ids`` tensors (the last only for families that take it:
``structure.model_inputs``; runners ignore it otherwise) it returns an output with ``.logits`` (or
``.start_logits`` / ``.end_logits``, ``.last_hidden_state``) as torch tensors; it has
``.config``, ``.eval()``, ``.train(False)`` and ``.to(device)``. The non-torch runners
are ``torch.nn.Module`` subclasses without parameters and carry a ``device``
attribute; :func:`model_device` finds the device of either kind.

This module is the dispatch only: :data:`FORMATS` names each format's loader, which lives
in the format's own module (``torch_int8``, ``onnx_runtime``, ``pt2``, ``openvino_runtime``,
``ctranslate2_runtime``, ``static``; the runner base classes in ``runners``, the checks they share in ``load_checks``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch

from compress.core.data.tasks import Task
from compress.core.formats.artifacts import load_torch_folder
from compress.core.formats.folder import ModelFolder, open_folder
from compress.core.formats.ctranslate2_runtime import load_ctranslate2
from compress.core.formats.layout import CTRANSLATE2, INC_PT2E, ONNX, OPENVINO, STATIC, TORCH, TORCH_INT8
from compress.core.formats.onnx_runtime import load_onnx
from compress.core.formats.openvino_runtime import load_openvino
from compress.core.formats.pt2 import load_inc
from compress.core.formats.static import load_static
from compress.core.formats.torch_int8 import load_torch_int8
from compress.core.registry import Registry


def model_device(model) -> torch.device:
    """The device a model runs on: its first parameter's, else the runner's ``device``, else cpu."""
    for param in model.parameters():
        return param.device
    device = getattr(model, "device", None)
    return torch.device(device) if device is not None else torch.device("cpu")


def load_model(path: Path | str, **options):
    """:func:`load_folder_model` of the folder at ``path`` (the check of the folder, then the options)."""
    return load_folder_model(open_folder(path), **options)


def load_folder_model(
    folder: ModelFolder,
    *,
    head: str | None = None,
    num_labels: int | None = None,
    id2label: dict[int, str] | None = None,
    attn_implementation: str | None = None,
    with_info: bool = False,
    threads: int | None = None,
    device: str | torch.device | None = None,
    compile: bool | None = None,
    fmt: str | None = None,
    seed: int = 0,
):
    """Load an opened model folder with the loader of its format; the only loader the stages use.

    ``head`` is one of ``base``, ``sequence-classification``, ``question-answering``,
    ``masked-lm``, ``pretraining`` (default: the saved one; see
    ``artifacts.load_torch_folder`` for new heads, ``with_info`` and ``seed``, which draws a new
    head's weights); a non-torch format refuses those that would need new weights (another
    head, another ``num_labels``).
    ``threads`` sets ONNX Runtime's intra-op pool and OpenVINO's CPU threads (default: torch's thread count);
    ``device`` places a runner (PyTorch models move with ``.to()`` as usual);
    ``compile`` (default: on unless ``COMPRESS_NO_COMPILE=1``) compiles INC programs;
    ``fmt`` overrides the format compression.json states.
    """
    fmt = fmt or folder.format
    options = {
        "head": head, "num_labels": num_labels, "id2label": id2label, "attn_implementation": attn_implementation,
        "with_info": with_info, "threads": threads, "device": device, "compile": compile, "seed": seed,
    }
    return FORMATS.get(fmt)(folder, options)


def load_model_for_task(model_dir: Path | str, task: Task, **options):
    """:func:`load_folder_for_task` of the folder at ``model_dir``."""
    return load_folder_for_task(open_folder(model_dir), task, **options)


def load_folder_for_task(folder: ModelFolder, task: Task, **options):
    """Model with the task's head; labels named after the task (ids never trusted across sources).

    ``options`` go to :func:`load_folder_model`; with ``with_info=True`` the result is ``(model, info)``.
    """
    kind = task.behaviour
    if kind.label_type is None:  # answers, not labels (a span head): nothing to size or name
        return load_folder_model(folder, head=kind.head, **options)
    loaded = load_folder_model(folder, head=kind.head, num_labels=task.num_labels, id2label=task.id2label, **options)
    model = loaded[0] if options.get("with_info") else loaded
    model.config.problem_type = kind.problem_type  # None for a token classifier: transformers' cross-entropy per token
    return loaded


def _load_torch(folder: ModelFolder, options: dict[str, Any]):
    keys = ("head", "num_labels", "id2label", "attn_implementation", "with_info", "seed")
    return load_torch_folder(folder, **{k: options[k] for k in keys})


# A loader: (folder, options) -> a model usable like a Hugging Face BERT; ``options`` as load_folder_model builds them.
FORMATS: Registry[Callable[[ModelFolder, dict[str, Any]], Any]] = Registry("model format")
FORMATS.register(TORCH, _load_torch)
FORMATS.register(TORCH_INT8, load_torch_int8)
FORMATS.register(ONNX, load_onnx)
FORMATS.register(INC_PT2E, load_inc)
FORMATS.register(OPENVINO, load_openvino)
FORMATS.register(CTRANSLATE2, load_ctranslate2)  # CTranslate2's Encoder, the task head in NumPy beside it
FORMATS.register(STATIC, load_static)  # model2vec static folders: each token's vector as ``last_hidden_state``
