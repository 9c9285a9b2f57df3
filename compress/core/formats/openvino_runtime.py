"""The ``openvino`` format at run time: an IR compiled for the CPU, its precision, and its runner.

Writing the IR is ``compress.core.formats.openvino``'s; this module compiles and runs it.
A folder runs in f32 unless its ``compression.json`` asks for another precision that this
CPU can run (:func:`recorded_precision`).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np
import torch

from compress.core.errors import CompressError, foreign
from compress.core.formats.folder import ModelFolder
from compress.core.formats.layout import OPENVINO, OPENVINO_FILE
from compress.core.formats.load_checks import load_graph_runner
from compress.core.formats.records import read_compression
from compress.core.formats.runners import INPUTS, NumpyRunner


# INFERENCE_PRECISION_HINT unless asked otherwise: left to itself, OpenVINO's CPU plugin runs
# floating-point layers in bf16 wherever the CPU has bf16 kernels, i.e. not the model as stored.
OPENVINO_PRECISION = "f32"
# A runner's precision when none is asked: what the folder's compression.json asks (``compress export --precision
# bf16`` records ``inference_precision_hint``), where this CPU can run it (see recorded_precision).
RECORDED = "recorded"
MATMUL_LAYERS = ("FullyConnected", "MatMul")  # layer types of the compiled graph that multiply matrices


def compile_openvino(model, *, threads: int | None = None, precision: str | None = OPENVINO_PRECISION,
                     perf_count: bool = False, shape: tuple[int, int] | None = None):
    """An OpenVINO model (an ``openvino.Model`` or the path of an IR) compiled for the CPU, one request at a time.

    ``precision`` is the ``INFERENCE_PRECISION_HINT`` (``f32``, ``bf16``, ``f16``; None: the
    plugin's own choice); int8 layers of an int8 IR run in int8 whatever it is, it decides the
    rest (attention, softmax, LayerNorm, fp32 layers). ``threads``: CPU threads (default torch's).
    ``perf_count``: keep per-layer timings (a request's ``profiling_info``; profiling only).
    ``shape``: compile for this one (batch, seq) only: every input (each ``[batch, seq]``) gets
    that static shape, which lets the plugin plan its kernels and memory once (5-11% faster for
    small int8 encoders at batch 1); any other shape is then refused by the request.
    """
    # deferred: a heavy import, paid only where it is used
    import openvino as ov

    properties = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads or torch.get_num_threads(),
                  "PERF_COUNT": perf_count}
    if precision:
        properties["INFERENCE_PRECISION_HINT"] = precision
    what = model if isinstance(model, (str, Path)) else "the model"
    core = ov.Core()
    try:
        if shape is not None:
            model = core.read_model(str(model)) if isinstance(model, (str, Path)) else model.clone()
            ranks = {port.get_any_name(): port.get_partial_shape().rank for port in model.inputs}
            odd = [name for name, rank in ranks.items() if rank.is_dynamic or rank.get_length() != 2]
            if odd:
                raise CompressError(f"OpenVINO cannot fix the shape of {what}: input {odd[0]} is not [batch, seq]")
            model.reshape({port: ov.PartialShape(list(shape)) for port in model.inputs})
        return core.compile_model(str(model) if isinstance(model, Path) else model, "CPU", properties)
    except CompressError:
        raise
    except Exception as err:  # RuntimeError from the plugin: a corrupt IR, an unsupported precision
        fix = "; restore the folder's openvino_model.xml and .bin, or export it again" if what != "the model" else ""
        raise CompressError(f"OpenVINO cannot compile {what}: {foreign(err) or type(err).__name__}{fix}") from None


@functools.cache
def openvino_capabilities() -> tuple[str, ...]:
    """What OpenVINO's CPU plugin reports it can run here (its OPTIMIZATION_CAPABILITIES: ``FP32``, ``BF16``, ``INT8``...)."""
    # deferred: a heavy import, paid only where it is used
    import openvino as ov

    return tuple(ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))


def openvino_bf16() -> bool:
    """Whether OpenVINO's CPU plugin has bf16 kernels on this CPU (its BF16 capability: AVX512_BF16 or AMX-BF16).

    The plugin's own word, not ``compress.core.hardware.precisions().bf16``: it decides what an OpenVINO folder runs,
    and may differ from the CPU's flags (no BF16 on ARM, whose plugin has no bf16 kernels; BF16 on Intel cores with
    AVX2-VNNI-2, which convert bf16 without bf16 dot products). On x86 it holds wherever the record's ``bf16`` does
    (tests/core/test_hardware.py checks it on the machine the tests run on).
    """
    return "BF16" in openvino_capabilities()


def recorded_precision(path: Path) -> str:
    """The INFERENCE_PRECISION_HINT an OpenVINO folder asks for, where this CPU runs it, else f32.

    ``compress export --format openvino --precision bf16`` records ``inference_precision_hint: bf16``;
    the IR's weights stay fp32, so on a CPU without bf16 kernels the folder runs as the fp32 export it is.
    """
    return runnable_precision(read_compression(path).get("inference_precision_hint") or OPENVINO_PRECISION)


def runnable_precision(asked: str) -> str:
    """``asked`` where this CPU runs it: bf16 only where OpenVINO has bf16 kernels, else f32."""
    return OPENVINO_PRECISION if asked == "bf16" and not openvino_bf16() else asked


def inference_precision(compiled) -> str:
    """The precision a compiled model runs its floating-point layers in (``f32``, ``bf16``, ``f16``)."""
    return compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()


def layer_precisions(compiled) -> dict[str, int]:
    """How many matrix-multiply layers the compiled model runs in each precision, e.g. ``{"u8": 12, "i8": 2}``.

    Read from the plugin's runtime graph: what executes, not what the IR stores (an int8 IR
    whose integer ops the plugin only emulates shows ``f32`` here).
    """
    counts: dict[str, int] = {}
    for op in compiled.get_runtime_model().get_ops():
        info = op.get_rt_info()
        if info["layerType"].astype(str) in MATMUL_LAYERS:
            precision = info["runtimePrecision"].astype(str).lower()
            counts[precision] = counts.get(precision, 0) + 1
    return counts


class OpenVINORunner(NumpyRunner):
    """An OpenVINO IR compiled for the CPU (:func:`compile_openvino`); ``precision`` is what it runs in
    (default: what the folder records, :func:`recorded_precision`).

    ``compiled`` runs an already compiled model instead of reading ``path`` (NNCF hands its
    candidates to validation functions that way). ``shape``: compiled for that one (batch, seq).
    """

    format = OPENVINO

    def __init__(self, path: Path, config, head: str, *, threads: int | None = None,
                 precision: str | None = RECORDED, compiled=None, shape: tuple[int, int] | None = None):
        super().__init__(path, config, head, ())
        if compiled is None:
            if precision == RECORDED:
                precision = recorded_precision(self.path)
            compiled = compile_openvino(self.path / OPENVINO_FILE, threads=threads, precision=precision, shape=shape)
        # Hidden from nn.Module's registry: neither is a submodule.
        object.__setattr__(self, "compiled", compiled)
        object.__setattr__(self, "request", compiled.create_infer_request())
        self.precision = inference_precision(compiled)
        unnamed = [i for i, port in enumerate(compiled.outputs) if not port.get_names()]
        if unnamed:
            raise CompressError(f"{self.path}/{OPENVINO_FILE}: output {unnamed[0]} has no name; name the outputs "
                                "(logits, start_logits/end_logits or last_hidden_state) when converting")
        self.input_names = [_port_name(port, INPUTS) for port in compiled.inputs]
        self.input_types = [port.get_element_type().to_dtype() for port in compiled.inputs]
        self.output_names = tuple(_port_name(port, OUTPUT_FIELDS) for port in compiled.outputs)
        object.__setattr__(self, "output_ports", list(compiled.outputs))  # built once: reading .outputs makes new ports
        # A model compiled for one shape: the request's own input buffers, written in place each call.
        static = all(port.get_partial_shape().is_static for port in compiled.inputs)
        object.__setattr__(self, "buffers", [self.request.get_input_tensor(i).data for i in range(len(compiled.inputs))]
                           if static else None)

    def feeds(self, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        # Only the inputs the IR declares (no token_type_ids for DistilBERT, ModernBERT), in its order and integer type.
        return [np.ascontiguousarray(inputs[name], dtype=dtype) for name, dtype in zip(self.input_names, self.input_types)]

    def call(self, feeds: list[np.ndarray]) -> list[np.ndarray]:
        # Feeding the request's tensors directly (no input dict for the Python data dispatcher) saves 0.06-0.09 ms a
        # call, measured on a 2-layer int8 student at batch 1 (0.50 against 0.56 ms at 32 tokens).
        request = self.request
        for i, array in enumerate(feeds):
            if self.buffers is None:  # any shape: the request reads the array in place (the call is synchronous)
                request.set_input_tensor(i, _ov_tensor(array))
            elif array.shape != self.buffers[i].shape:
                raise CompressError(f"{self.path} was compiled for inputs of shape {self.buffers[i].shape}; got {array.shape} "
                                    "(pad to that shape, or compile for any shape)")
            else:  # one shape: the request's own input buffers, written in place
                np.copyto(self.buffers[i], array)
        request.infer()
        # Copied out: the request's buffers are overwritten by its next call.
        return [request.get_output_tensor(i).data.copy() for i in range(len(self.output_ports))]

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, precision={self.precision}"


def _ov_tensor(array: np.ndarray):
    """An OpenVINO tensor over ``array``'s memory (no copy)."""
    # deferred: a heavy import, loaded already by whoever compiled the model
    import openvino as ov

    return ov.Tensor(array, shared_memory=True)


# Output names the Hugging Face output classes use, preferred when an IR tensor has several names.
OUTPUT_FIELDS = ("logits", "start_logits", "end_logits", "last_hidden_state", "prediction_logits", "seq_relationship_logits")


def _port_name(port, known: tuple[str, ...]) -> str:
    """The name of an IR input/output: a known one when it has several (converters add internal names)."""
    names = port.get_names()
    return next((name for name in known if name in names), port.get_any_name())


def load_openvino(folder: ModelFolder, options: dict[str, Any]):
    """Load an ``openvino`` directory as an :class:`OpenVINORunner` in the precision it records."""
    return load_graph_runner(folder, options, OPENVINO, OPENVINO_FILE, OpenVINORunner)
