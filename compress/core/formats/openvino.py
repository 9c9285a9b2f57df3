"""OpenVINO IR of any model directory the toolkit makes: conversion and export.

``export_openvino(model_dir, out)`` writes ``openvino_model.xml`` + ``openvino_model.bin``
(the file names optimum-intel uses) with dynamic batch and sequence dimensions, next to
``config.json``, the tokenizer, a sentence-transformers folder's pooling files and the
sidecars (``compression.json``: stage ``export``, format ``openvino``; ``metrics.json``).
What converts:

=====================  =========================================================
source format          how
=====================  =========================================================
``torch``              the model as ``runtime.load_model`` rebuilds it (per-layer heads
                       and FFN widths included), eager attention, traced by
                       ``openvino.convert_model``: outputs equal torch's to ~1e-6
``onnx`` fp32          its graph, by ``openvino.convert_model``
``onnx`` int8          its graph when OpenVINO runs its int8 layers in int8 (ONNX Runtime
                       static, QDQ); ONNX Runtime *dynamic* int8 (MatMulInteger +
                       DynamicQuantizeLinear) is refused: OpenVINO reads it but emulates
                       the integer ops in f32, slower than the fp32 IR
``openvino``           nothing to do (refused: it is one already)
other int8 formats     refused: quantize the fp32 parent with ``compress quantize --backend openvino``
=====================  =========================================================

Weights are saved as they are (``compress_to_fp16=False``: OpenVINO's default would store
fp32 weights as fp16). The IR runs through ``compress.core.formats.openvino_runtime.OpenVINORunner``,
in f32 unless another precision is asked for; int8 IRs come from
``compress quantize --backend openvino`` (NNCF, in ``compress.quantize.openvino``), which converts
with :func:`convert` and saves with :func:`save_ir`.

OpenVINO's converter and NNCF send usage telemetry unless a consent file opts out; both
skip it in CI, and :func:`no_telemetry` runs them as in CI.
"""

from __future__ import annotations

import contextlib
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch

from compress.core.formats.artifacts import (
    artifact_format, is_quantized, load_config, load_tokenizer, output_dir, save_tokenizer, saved_head,
)
from compress.core.formats.layout import (  # noqa: F401  (OPENVINO, OPENVINO_FILE re-exported)
    INT8_FORMATS, ONNX, ONNX_FILE, OPENVINO, OPENVINO_FILE, TORCH,
)
from compress.core.formats.records import compression_record, parent_path, read_compression
from compress.core.formats.writes import write_json_atomic
from compress.core.preflight import check_output, require_model_dir
from compress.core.errors import CompressError, reason
from compress.core.formats.onnx import _Positional
from compress.core.formats.architecture import structure_of
from compress.core.formats.openvino_runtime import (
    OPENVINO_PRECISION,
    compile_openvino,
    inference_precision,
    layer_precisions,
    runnable_precision,
)
from compress.core.formats.runtime import load_model
from compress.core.formats.sentence import copy_sentence_files
from compress.core.model.heads import EXPORTABLE_HEADS, HEADS
from compress.core.model.structure import describe

OPENVINO_WEIGHTS = "openvino_model.bin"  # written by openvino.save_model beside OPENVINO_FILE
INT8_TYPES = ("i8", "u8")
QUANTIZE_HINT = "compress quantize --backend openvino --scheme static --task TASK"


@dataclass
class Converted:
    """An ``openvino.Model`` and what it was made from."""

    model: Any  # openvino.Model, outputs named as the head's (logits, start_logits/end_logits, last_hidden_state)
    source: Path
    source_format: str  # torch or onnx
    head: str
    outputs: tuple[str, ...]
    structure: dict[str, Any] = field(default_factory=dict)
    precision: str = "fp32"  # int8 when the source graph is quantized

    @property
    def inputs(self) -> list[str]:
        return [port.get_any_name() for port in self.model.inputs]


@contextlib.contextmanager
def no_telemetry() -> Iterator[None]:
    """Run OpenVINO's converter and NNCF without their usage telemetry.

    Both send it unless a consent file opts out, and both (``disable_in_ci``) skip it when
    ``CI=true``, the one switch they share; it is set for the duration of the block only.
    NNCF decides when first imported, so import it inside the block.
    """
    saved = os.environ.get("CI")
    os.environ["CI"] = "true"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("CI", None)
        else:
            os.environ["CI"] = saved


def convert(model_dir: Path | str) -> Converted:
    """The directory's model as an ``openvino.Model`` with dynamic batch and sequence dims (see the module docstring)."""
    model_dir = require_model_dir(model_dir)
    fmt = artifact_format(model_dir)
    head = saved_head(model_dir)
    if fmt == OPENVINO:
        raise CompressError(f"{model_dir} is an OpenVINO IR already; copy it, or convert the directory it was made from")
    if fmt not in (TORCH, ONNX):
        kind = "int8 " if fmt in INT8_FORMATS else ""
        raise CompressError(f"{model_dir} is a {fmt} {kind}model, which OpenVINO cannot read; {_instead(model_dir)}")
    if head not in EXPORTABLE_HEADS:
        raise CompressError(f"OpenVINO conversion supports {', '.join(EXPORTABLE_HEADS)} models; {model_dir} is a {head} model")
    if fmt == TORCH:
        return _convert_torch(model_dir, head)
    return _convert_onnx(model_dir, head)


def _convert_torch(model_dir: Path, head: str) -> Converted:
    # deferred: a heavy import, paid only where it is used
    import openvino as ov

    # Eager attention, as the ONNX export: plain ops, which OpenVINO fuses into its own attention.
    model = load_model(model_dir, attn_implementation="eager")
    # TorchScript tracing reads every attribute; transformers' ``loss_function`` property would log a
    # bogus "loss_type=None ... unrecognized" warning for a model that computes no loss here.
    for module in model.modules():
        if hasattr(type(module), "loss_function"):
            module.loss_function = None
    names = HEADS[head].outputs
    positional = _Positional(model, names, first_token=HEADS[head].first_token)
    tokenizer = load_tokenizer(model_dir)
    # Two rows of different lengths: nothing is specialised to batch 1 or to one length.
    example = tokenizer(["an example input", "a second, longer example input for tracing"], padding=True, return_tensors="pt")
    inputs = {name: example[name] if name in example else torch.zeros_like(example["input_ids"]) for name in positional.inputs}
    with no_telemetry(), warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # tracer warnings about Python control flow on shapes
        try:
            ov_model = ov.convert_model(positional.module, example_input=inputs)
        except Exception as err:
            raise CompressError(f"OpenVINO could not convert {model_dir}: {reason(err)}") from None
    for port, name in zip(ov_model.inputs, positional.inputs):
        if name not in port.get_names():
            raise CompressError(f"OpenVINO converted {model_dir} with inputs {[sorted(p.get_names()) for p in ov_model.inputs]}, "
                                f"not {list(positional.inputs)}")
        port.get_tensor().set_names({name})  # only the input's own name (tracing may add an internal one, e.g. "60")
    for port, name in zip(ov_model.outputs, names):
        port.get_tensor().set_names({name})  # traced outputs have no names
    return Converted(ov_model, model_dir, TORCH, head, names, describe(model))


def _convert_onnx(model_dir: Path, head: str) -> Converted:
    # deferred: a heavy import, paid only where it is used
    import openvino as ov

    file = model_dir / ONNX_FILE
    if not file.is_file():
        raise CompressError(f"{model_dir} has no {ONNX_FILE}; is the directory complete?")
    with no_telemetry():
        try:
            ov_model = ov.convert_model(str(file))
        except Exception as err:
            raise CompressError(f"OpenVINO could not read {file}: {reason(err)}") from None
    names = tuple(port.get_any_name() for port in ov_model.outputs)  # the ONNX graph's output names
    converted = Converted(ov_model, model_dir, ONNX, head, names, structure_of(model_dir))
    if is_quantized(model_dir) or int8_weights(ov_model):
        converted.precision = "int8"
        ran = layer_precisions(compile_openvino(ov_model))
        if not any(ran.get(t) for t in INT8_TYPES):
            raise CompressError(
                f"{model_dir} is an ONNX int8 graph whose integer ops OpenVINO only emulates in f32 (ONNX Runtime "
                f"dynamic int8: MatMulInteger), slower than fp32; {_instead(model_dir)}"
            )
    return converted


def int8_weights(ov_model) -> int:
    """How many int8/uint8 weight matrices (2-D constants) an ``openvino.Model`` stores."""
    count = 0
    for op in ov_model.get_ops():
        if op.get_type_name() == "Constant" and op.get_output_element_type(0).get_type_name() in INT8_TYPES:
            count += len(op.get_output_partial_shape(0)) == 2
    return count


def matmuls_outside(ov_model, layers: str) -> list[str]:
    """The MatMul ops of an ``openvino.Model`` outside the encoder layers (the pooler and task head), by name.

    ``layers``: the layer list's qualified name in the PyTorch model (``bert.encoder.layer``);
    converted ops are named after their module, ``__module.inner.bert.encoder.layer.0.attention.self.query/...``
    (ONNX graphs: ``/bert/encoder/layer.0/...``). Empty when no MatMul carries the layers' names
    (an export that named its ops otherwise): then nothing can be told apart.
    """
    names = [op.get_friendly_name() for op in ov_model.get_ops() if op.get_type_name() == "MatMul"]
    inside = re.compile(re.escape(layers) + r"\.\d+\.")
    outside = [n for n in names if not inside.search(n.replace("/", "."))]
    return outside if len(outside) < len(names) else []


def save_ir(ov_model, directory: Path) -> Path:
    """Write ``openvino_model.xml`` + ``.bin`` in ``directory`` with the weights as they are (no fp16 halving)."""
    # deferred: a heavy import, paid only where it is used
    import openvino as ov

    file = Path(directory) / OPENVINO_FILE
    ov.save_model(ov_model, str(file), compress_to_fp16=False)
    return file


def write_sidecars(source: Path, directory: Path) -> None:
    """config.json, the tokenizer and a sentence-transformers folder's files, as the source has them."""
    load_config(source).save_pretrained(directory)
    save_tokenizer(load_tokenizer(source), directory)
    copy_sentence_files(source, directory)  # a sentence-transformers folder stays one: pooling, Normalize


def export_openvino(model_dir: str | Path, out: str | Path, *, overwrite: bool = False, precision: str = "f32") -> Path:
    """Write the model in ``model_dir`` as an OpenVINO IR directory ``out``; ``out``.

    ``compression.json`` records the source format, the precision (fp32, or int8 for a
    quantized ONNX graph) and the inference precision the compiled IR reports. ``precision``
    ``bf16`` keeps fp32 weights and records ``inference_precision_hint: bf16``, which every
    loader of the folder asks the CPU plugin for where the CPU has bf16 kernels (f32 elsewhere).
    """
    if precision not in ("f32", "bf16"):
        raise CompressError(f"an OpenVINO folder runs in f32 or bf16, not {precision!r}")
    check_output(out, overwrite, inputs=model_dir)  # before minutes of conversion
    converted = convert(model_dir)
    hint = {"inference_precision_hint": precision} if precision != OPENVINO_PRECISION else {}
    with output_dir(out, overwrite) as tmp:
        save_ir(converted.model, tmp)
        write_sidecars(converted.source, tmp)
        compiled = compile_openvino(tmp / OPENVINO_FILE, precision=runnable_precision(precision))  # reads back what was written
        record = compression_record(
            stage="export", method="openvino", parent=converted.source, structure=converted.structure,
            config={"inputs": converted.inputs, "outputs": list(converted.outputs), "compress_to_fp16": False},
            extra={
                "format": OPENVINO, "backend": "openvino", "head": converted.head, "precision": converted.precision,
                "source_format": converted.source_format, "outputs": list(converted.outputs),
                "inference_precision": inference_precision(compiled), "layer_precisions": layer_precisions(compiled),
                **hint,
            },
        )
        write_json_atomic(tmp / "compression.json", record)
        write_json_atomic(tmp / "metrics.json", {"results": []})
    return Path(out)


def _instead(model_dir: Path) -> str:
    """What to do instead, naming the fp32 parent when compression.json knows it."""
    parent = parent_path(read_compression(model_dir)) or "its fp32 parent"
    return f"quantize {parent} for OpenVINO instead: {QUANTIZE_HINT}"

