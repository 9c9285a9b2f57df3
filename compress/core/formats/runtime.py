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
=====================  ==================  ============================================

:func:`load_model` returns, for every format, an object the evaluation code uses
exactly like a Hugging Face model: called with ``input_ids`` / ``attention_mask`` /
``token_type_ids`` tensors (the last only for families that take it:
``structure.model_inputs``; runners ignore it otherwise) it returns an output with ``.logits`` (or
``.start_logits`` / ``.end_logits``, ``.last_hidden_state``) as torch tensors; it has
``.config``, ``.eval()``, ``.train(False)`` and ``.to(device)``. The non-torch runners
are ``torch.nn.Module`` subclasses without parameters and carry a ``device``
attribute; :func:`model_device` finds the device of either kind.

The int8 PyTorch layout (read by :func:`load_torch_int8`, written by
:func:`write_torch_int8`): for every quantized ``nn.Linear`` named ``NAME``,
``NAME.weight_int8`` (out, in) int8, ``NAME.weight_scale`` (out,) float64 and
``NAME.weight_zero_point`` (out,) int64 (0-d tensors for per-tensor weights),
``NAME.bias`` (out,) fp32; every other tensor as in the fp32 state dict.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import warnings
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear
from torch.ao.quantization import default_dynamic_qconfig, per_channel_dynamic_qconfig, quantize_dynamic
from transformers import modeling_outputs as mo

from compress.core.formats.artifacts import (  # noqa: F401  (re-exported)
    HEAD_CLASSES,
    INC_PT2E,
    INT8_FORMATS,
    INT8_WEIGHTS_FILE,
    ONNX,
    ONNX_FILE,
    OPENVINO,
    OPENVINO_FILE,
    TORCH,
    TORCH_INT8,
    WEIGHTS_FILE,
    architecture_class,
    artifact_format,
    is_quantized,
    load_config,
    load_torch_model,
    read_compression,
    require_model_dir,
    saved_head,
)
from compress.core.compat import no_init_weights
from compress.core.errors import CompressError
from compress.core.registry import Registry
from compress.core.formats.static import STATIC, load_static
from compress.core.model.structure import apply_structure, config_sizes, count_parameters, describe, input_names
from compress.core.data.tasks import Task
from compress.core.formats.weight_checks import check_tensors

PT2_FILE = "model.pt2"
INPUTS = ("input_ids", "attention_mask", "token_type_ids")  # the order exported graphs take (those of them the family has)
NO_COMPILE_ENV = "COMPRESS_NO_COMPILE"  # "1": run INC programs eagerly (tests; no C++ compiler)
MAX_COMPILED_SHAPES = 64  # graphs compiled per INC program before dynamo falls back to eager

# Suffixes of the int8 Linear tensors in the torch-int8 safetensors file.
INT8_WEIGHT, INT8_SCALE, INT8_ZERO = ".weight_int8", ".weight_scale", ".weight_zero_point"


# ---------------------------------------------------------------------------- formats


def model_device(model) -> torch.device:
    """The device a model runs on: its first parameter's, else the runner's ``device``, else cpu."""
    for param in model.parameters():
        return param.device
    device = getattr(model, "device", None)
    return torch.device(device) if device is not None else torch.device("cpu")


# A loader: (path, options) -> a model usable like a Hugging Face BERT.
FORMATS: Registry[Callable[[Path, dict[str, Any]], Any]] = Registry("model format")


def load_model(
    path: Path | str,
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
    """Load any model directory with the loader of its format; the only loader the stages use.

    ``head`` is one of ``base``, ``sequence-classification``, ``question-answering``,
    ``masked-lm``, ``pretraining`` (default: the saved one; see
    ``artifacts.load_torch_model`` for new heads, ``with_info`` and ``seed``, which draws a new
    head's weights); a non-torch format refuses those that would need new weights (another
    head, another ``num_labels``).
    ``threads`` sets ONNX Runtime's intra-op pool and OpenVINO's CPU threads (default: torch's thread count);
    ``device`` places a runner (PyTorch models move with ``.to()`` as usual);
    ``compile`` (default: on unless ``COMPRESS_NO_COMPILE=1``) compiles INC programs;
    ``fmt`` overrides the format compression.json states.
    """
    path = require_model_dir(path)
    fmt = fmt or artifact_format(path)
    options = {
        "head": head, "num_labels": num_labels, "id2label": id2label, "attn_implementation": attn_implementation,
        "with_info": with_info, "threads": threads, "device": device, "compile": compile, "seed": seed,
    }
    return FORMATS.get(fmt)(path, options)


def load_model_for_task(model_dir: Path | str, task: Task, **options):
    """Model with the task's head; labels named after the task (ids never trusted across sources).

    ``options`` go to :func:`load_model`; with ``with_info=True`` the result is ``(model, info)``.
    """
    kind = task.behaviour
    if kind.label_type is None:  # answers, not labels (a span head): nothing to size or name
        return load_model(model_dir, head=kind.head, **options)
    loaded = load_model(model_dir, head=kind.head, num_labels=task.num_labels, id2label=task.id2label, **options)
    model = loaded[0] if options.get("with_info") else loaded
    model.config.problem_type = kind.problem_type  # None for a token classifier: transformers' cross-entropy per token
    return loaded


@FORMATS.register(TORCH)
def _load_torch(path: Path, options: dict[str, Any]):
    keys = ("head", "num_labels", "id2label", "attn_implementation", "with_info", "seed")
    return load_torch_model(path, **{k: options[k] for k in keys})


def _check_options(path: Path, fmt: str, config, saved: str, options: dict[str, Any], *, eager_ok: bool = False) -> None:
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


def _info(model, saved: str, structure, fmt: str, options: dict[str, Any]):
    if options.get("with_info"):
        return model, {"new_weights": [], "saved_head": saved, "structure": structure, "format": fmt}
    return model


# ---------------------------------------------------------------------------- architecture


def build_architecture(path: Path, config=None, head: str | None = None, *, empty: bool = False):
    """The directory's model (config.json + compression.json's per-layer shapes), without its weights.

    ``empty`` skips the random initialisation (the caller overwrites every weight).
    """

    config = config or load_config(path)
    head = head or saved_head(path)
    cls = architecture_class(config, head)
    if empty:
        context = no_init_weights()
    else:
        context = contextlib.nullcontext()
    with context:
        model = cls(config)  # transformers 4.x builds pruned heads from config.pruned_heads
    structure = read_compression(path).get("structure")
    if structure:
        apply_structure(model, structure)  # per-layer FFN widths (and heads on 5.x)
    return model


def parameter_count(path: Path | str) -> int:
    """Distinct parameters of the directory's architecture, as in its fp32 form.

    Built uninitialised on the CPU (``torch.empty`` pages are never touched), not on the
    meta device: transformers' head pruning indexes with a boolean mask, which meta tensors refuse.
    """
    model = build_architecture(Path(path), empty=True)
    model.tie_weights()
    return count_parameters(model)


def structure_of(path: Path | str) -> dict[str, Any]:
    """The structure dict (heads, FFN widths, layers) from compression.json, else from the config."""
    stored = read_compression(path).get("structure")
    if stored:
        return stored
    return describe(build_architecture(Path(path), empty=True))


# ---------------------------------------------------------------------------- runners


def output_class(head: str):
    """The transformers output dataclass a head's forward returns (``.logits``, ``.start_logits``, ...)."""
    return {
        "sequence-classification": mo.SequenceClassifierOutput,
        "token-classification": mo.TokenClassifierOutput,
        "question-answering": mo.QuestionAnsweringModelOutput,
        "masked-lm": mo.MaskedLMOutput,
        "base": mo.BaseModelOutput,
    }.get(head, mo.ModelOutput)


class Runner(torch.nn.Module):
    """A stored model behind the Hugging Face call convention; a Module without parameters.

    Subclasses implement :meth:`run` on a dict of int64 tensors (batch, seq) and return
    the output tensors in the order of ``output_names``.
    """

    format = "?"

    def __init__(self, path: Path, config, head: str, output_names: tuple[str, ...]):
        super().__init__()
        self.path = Path(path)
        self.config = config
        self.head = head
        self.output_names = tuple(output_names)
        self.device = torch.device("cpu")

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, **unused):
        """Run on (batch, seq) token tensors; a transformers output object holding torch tensors."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        outputs = self.run(inputs)
        values = {name: value.to(self.device) for name, value in zip(self.output_names, outputs)}
        return output_class(self.head)(**values)

    def run(self, inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:  # pragma: no cover - abstract
        raise NotImplementedError

    def to(self, *args, **kwargs):
        """Move to a device the runtime supports; refuse casts (the stored precision is the model)."""
        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        if dtype is not None and dtype != torch.float32:
            raise CompressError(f"{self.path} is a {self.format} model and runs in its stored precision; it cannot be cast to {dtype}")
        if device is not None:
            self.set_device(torch.device(device))
        return self

    def set_device(self, device: torch.device) -> None:
        if device.type != "cpu":
            raise CompressError(f"{self.path} is a {self.format} model, which runs on the CPU only; use --device cpu")
        self.device = device

    def extra_repr(self) -> str:
        return f"format={self.format}, head={self.head}, path={self.path}"


class NumpyRunner(Runner):
    """A runtime fed numpy arrays: :meth:`run` is :meth:`feeds` then :meth:`call`.

    The two halves exist apart for timing: ``compress latency`` builds each batch's feeds
    once, outside the timed region, and times :meth:`call` alone, the runtime's own work
    as a server holding numpy inputs would pay it. On a 2-layer int8 student at batch 1 on
    SST-2 dev sentences the wrapping around it (tensor conversions, the transformers output
    object, the module call) cost 0.05-0.06 ms of a 0.6-1.0 ms call
    (bench/results/2026-11-27/call-overhead).
    """

    def feeds(self, inputs: dict[str, np.ndarray]) -> Any:
        """``inputs`` ((batch, seq) integer arrays by name) in the form :meth:`call` takes."""
        raise NotImplementedError  # pragma: no cover - abstract

    def call(self, feeds: Any) -> list[np.ndarray]:
        """One forward on :meth:`feeds`'s result: arrays in ``output_names`` order, owned by the caller."""
        raise NotImplementedError  # pragma: no cover - abstract

    def run(self, inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        arrays = {name: value.detach().cpu().numpy() for name, value in inputs.items()}
        return [torch.from_numpy(out) for out in self.call(self.feeds(arrays))]


class OnnxRunner(NumpyRunner):
    """An ONNX Runtime session (all graph optimisations on; int64 numpy feeds)."""

    format = ONNX

    def __init__(self, path: Path, config, head: str, *, threads: int | None = None):
        self.threads = threads or torch.get_num_threads()
        super().__init__(path, config, head, ())
        self._make_session(["CPUExecutionProvider"])

    def _make_session(self, providers: list[str]) -> None:
        # deferred: a heavy import, paid only where it is used
        import onnxruntime as ort

        opts = ort.SessionOptions()
        # Fusions (attention, GELU, LayerNorm) happen here, at load: the file stays a plain graph.
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.intra_op_num_threads = self.threads
        opts.inter_op_num_threads = 1  # one forward at a time
        opts.log_severity_level = 3  # errors only
        try:
            session = ort.InferenceSession(str(self.path / ONNX_FILE), opts, providers=providers)
        except Exception as err:
            raise CompressError(f"ONNX Runtime cannot load {self.path / ONNX_FILE}: {str(err).splitlines()[0]}") from None
        # Hidden from nn.Module's registry: a session is not a submodule.
        object.__setattr__(self, "session", session)
        self.input_names = [i.name for i in session.get_inputs()]
        self.output_names = tuple(o.name for o in session.get_outputs())
        self.output_list = list(self.output_names)  # what session.run takes, built once

    def set_device(self, device: torch.device) -> None:
        # deferred: a heavy import, paid only where it is used
        import onnxruntime as ort

        if device.type == "cuda":
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                raise CompressError(f"{self.path}: this onnxruntime build has no CUDA execution provider; use --device cpu")
            if self.device.type != "cuda":
                self._make_session(["CUDAExecutionProvider", "CPUExecutionProvider"])
        elif device.type != "cpu":
            raise CompressError(f"{self.path}: ONNX Runtime runs on cpu or cuda, not {device.type}")
        elif self.device.type != "cpu":
            self._make_session(["CPUExecutionProvider"])
        self.device = device

    def feeds(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        # Only the inputs the graph declares (an export may drop an unused token_type_ids).
        return {name: np.ascontiguousarray(inputs[name], dtype=np.int64) for name in self.input_names}

    def call(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.session.run(self.output_list, feeds)


def padded_shape(batch: int, seq: int, max_seq: int) -> tuple[int, int]:
    """The (batch, seq) an INC program runs compiled at: the batch rounded up to a power of two,
    the length to a multiple of 32 tokens (of 64 beyond 128), at most ``max_seq``.

    Inductor compiles one graph per input shape (tens of seconds each for a 6-layer model on
    2 cores), and the dynamic-shape graph it falls back to ran 2.3x slower than a static one
    (batch 32, seq 64, 6 layers x 384); so inputs are padded to these few shapes (1, 2, 4, ...
    x 32, 64, 96, 128, 192, ...), which keep the usual latency points (batch 1/8/32, seq
    128/384) exact. Padded positions are masked and padding rows dropped: the outputs are the
    unpadded ones up to int8 rounding steps that sums in another order can flip.
    """
    step = 32 if seq <= 128 else 64
    return 1 << (batch - 1).bit_length(), max(seq, min(max_seq, -(-seq // step) * step))


class ExportedRunner(Runner):
    """A ``torch.export`` program (INC PT2E int8), compiled by inductor with freezing, one graph per padded shape.

    Freezing turns the graph's dequantize(int8 weight) -> linear patterns into packed
    int8 GEMMs; without it the program runs the q/dq graph in fp32 (correct, not fast).
    Compiled, every batch is padded to :func:`padded_shape` (extra rows repeat the first,
    extra positions are masked out) and the outputs are cut back, so an evaluation compiles
    a handful of static graphs rather than one per (batch, length) it meets.
    """

    format = INC_PT2E

    def __init__(self, path: Path, config, head: str, output_names: tuple[str, ...], *, compile: bool | None = None):
        super().__init__(path, config, head, output_names)
        program = load_exported_program(path / PT2_FILE).module()
        object.__setattr__(self, "program", program)  # not a submodule: the runner has no parameters
        object.__setattr__(self, "compiled", None)
        self.compile = (os.environ.get(NO_COMPILE_ENV) != "1") if compile is None else compile

    def _callable(self):
        if self.compiled is None:
            # Static graphs only: padded_shape bounds how many there are.
            object.__setattr__(self, "compiled", torch.compile(self.program, dynamic=False) if self.compile else self.program)
        return self.compiled

    def run(self, inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        # deferred: a heavy import, paid only where it is used
        import torch._dynamo.config as dynamo_config

        # deferred: a heavy import, paid only where it is used
        import torch._inductor.config as inductor_config

        names = input_names(self)
        args = tuple(inputs[name].to(torch.long) for name in names)  # positional, as exported: (batch, seq) each
        batch, seq = args[0].shape
        if self.compile:
            args = self._padded(args, names, *padded_shape(batch, seq, config_sizes(self.config).max_positions))
        # Inference mode: freezing applies only without autograd, and one grad mode means no recompiles.
        with torch.inference_mode(), inductor_config.patch(freezing=True), warnings.catch_warnings(), \
                dynamo_config.patch(recompile_limit=MAX_COMPILED_SHAPES):
            # Inductor's int8 lowering copies zero points with torch.tensor(tensor) and warns once per GEMM.
            warnings.filterwarnings("ignore", message="To copy construct from a tensor", category=UserWarning)
            out = self._callable()(*args)
        out = list(out) if isinstance(out, (tuple, list)) else [out]
        # Padding rows go; per-token outputs (batch, seq[, width]) lose the padded positions too.
        per_token = self.head != "sequence-classification"
        return [o[:batch, :seq] if per_token and o.dim() >= 2 and o.shape[1] == args[0].shape[1] else o[:batch] for o in out]

    def _padded(self, args: tuple[torch.Tensor, ...], names: tuple[str, ...], batch: int, seq: int) -> tuple[torch.Tensor, ...]:
        """``args`` padded to (batch, seq): masked pad tokens on the right, copies of the first row below."""
        fill = {"input_ids": self.config.pad_token_id or 0}  # attention_mask and token_type_ids: 0
        padded = []
        for name, t in zip(names, args):
            t = torch.nn.functional.pad(t, (0, seq - t.shape[1]), value=fill.get(name, 0))
            padded.append(torch.cat([t, t[:1].expand(batch - t.shape[0], -1)]))
        return tuple(padded)


def _load_runner(path: Path, options: dict[str, Any], fmt: str, file: str, runner_class: type):
    """A runner of a graph file (ONNX Runtime, OpenVINO): the file checked, the options checked, placed."""
    if not (path / file).is_file():
        raise CompressError(f"{path} has no {file}; is the directory complete?")
    config, saved = load_config(path), saved_head(path)
    _check_options(path, fmt, config, saved, options)
    runner = runner_class(path, config, saved, threads=options.get("threads"))
    if options.get("device") is not None:
        runner.to(options["device"])
    return _info(runner, saved, structure_of(path), fmt, options)


@FORMATS.register(ONNX)
def _load_onnx(path: Path, options: dict[str, Any]):
    return _load_runner(path, options, ONNX, ONNX_FILE, OnnxRunner)


@FORMATS.register(INC_PT2E)
def _load_inc(path: Path, options: dict[str, Any]):
    if not (path / PT2_FILE).is_file():
        raise CompressError(f"{path} has no {PT2_FILE}; is the directory complete?")
    config, saved = load_config(path), saved_head(path)
    _check_options(path, INC_PT2E, config, saved, options)
    outputs = tuple(read_compression(path).get("outputs") or ("logits",))
    runner = ExportedRunner(path, config, saved, outputs, compile=options.get("compile"))
    if options.get("device") is not None:
        runner.to(options["device"])
    return _info(runner, saved, structure_of(path), INC_PT2E, options)


# ---------------------------------------------------------------------------- OpenVINO

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
        raise CompressError(f"OpenVINO cannot compile {what}: {(str(err).strip().splitlines() or [type(err).__name__])[0]}") from None


@functools.cache
def openvino_bf16() -> bool:
    """Whether OpenVINO's CPU plugin has bf16 kernels on this CPU (its BF16 capability: AVX512_BF16 or AMX-BF16)."""
    # deferred: a heavy import, paid only where it is used
    import openvino as ov

    return "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


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


@FORMATS.register(OPENVINO)
def _load_openvino(path: Path, options: dict[str, Any]):
    return _load_runner(path, options, OPENVINO, OPENVINO_FILE, OpenVINORunner)


@FORMATS.register(STATIC)
def _load_static(path: Path, options: dict[str, Any]):
    """A model2vec static folder (compress.core.formats.static): each token's vector as ``last_hidden_state``."""
    return load_static(path, options)


# ---------------------------------------------------------------------------- torch.export archives


def check_pt2_archive(file: Path) -> None:
    """Refuse a ``.pt2`` archive whose loading could run code, before ``torch.export.load`` opens it.

    ``torch.export.load`` (torch 2.13, ``torch/export/pt2_archive/_package.py``) reads
    plain tensors as raw bytes described by JSON, but it also (a) ``torch.load``s with
    ``weights_only=False`` any weight or constant marked ``use_pickle`` (tensor
    subclasses), (b) ``pickle.loads`` "opaque" constants and rebuilds torchbind
    "custom" objects, (c) falls back to ``weights_only=False`` when the sample inputs
    do not load with ``weights_only=True`` (``_export/serde/serialize.py``), (d) reads
    legacy ``.pt`` weight files and pre-2.8 zip layouts through ``torch.load`` and
    (e) loads AOTInductor shared libraries. So: only the current archive version,
    no native code, every payload a plain tensor, sample inputs loadable with
    ``weights_only=True``.
    """
    # Imported here: torch.export.pt2_archive pulls in torch's serializer and distributed tensors, about a
    # second at every start of a process that never meets a .pt2 (every latency worker, every command).
    from torch.export.pt2_archive import constants as c

    bad = f"{file} is not a plain torch.export archive of tensors"
    try:
        archive = zipfile.ZipFile(file)
    except (OSError, zipfile.BadZipFile) as err:
        raise CompressError(f"{file} is corrupt or not a .pt2 archive ({err}); re-create the model directory") from None
    with archive:
        # Every entry sits under one root folder ("model/archive_version", ...).
        names = {name.split("/", 1)[1]: name for name in archive.namelist() if "/" in name}
        if names.get(c.ARCHIVE_VERSION_PATH) is None or archive.read(names[c.ARCHIVE_VERSION_PATH]).decode().strip() != c.ARCHIVE_VERSION_VALUE:
            raise CompressError(f"{bad}: unknown archive version; re-create it with this torch version")
        for name in names:
            if name.startswith((c.AOTINDUCTOR_DIR, c.EXECUTORCH_DIR, c.MTIA_DIR, c.XL_MODEL_WEIGHTS_DIR)):
                raise CompressError(f"{bad}: it holds compiled code ({name}), which is never loaded")
            legacy = name.startswith((c.WEIGHTS_DIR, c.CONSTANTS_DIR)) and name.endswith(".pt")
            if legacy:
                raise CompressError(f"{bad}: it holds pickled {name}, which is never loaded")
        for name, full in names.items():
            if not (name.startswith((c.WEIGHTS_DIR, c.CONSTANTS_DIR)) and name.endswith("_config.json")):
                continue
            for fqn, meta in json.loads(archive.read(full)).get("config", {}).items():
                plain = not meta.get("use_pickle") and meta.get("path_name", "").startswith(
                    (c.WEIGHT_FILENAME_PREFIX, c.TENSOR_CONSTANT_FILENAME_PREFIX)
                )
                if not plain:
                    raise CompressError(f"{bad}: {fqn} is a pickled object, which is never loaded")
        for name, full in names.items():
            if name.startswith(c.SAMPLE_INPUTS_DIR):
                try:
                    torch.load(io.BytesIO(archive.read(full)), weights_only=True)
                except Exception:
                    raise CompressError(f"{bad}: its sample inputs need unpickling, which is never done") from None


def load_exported_program(file: Path):
    """``torch.export.load`` of an archive that :func:`check_pt2_archive` accepted."""
    check_pt2_archive(file)
    with quiet_torch_ao():
        # Registers the quantized_decomposed ops PT2E graphs call (INC/torchao import it
        # when quantizing; a fresh process must too, or deserialisation fails).
        import torch.ao.quantization.fx._decomposed  # noqa: F401
    try:
        return torch.export.load(str(file))
    except Exception as err:
        raise CompressError(f"cannot load {file}: {str(err).splitlines()[0]}; re-create it with this torch version") from None


# ---------------------------------------------------------------------------- torch dynamic int8


@contextmanager
def quiet_torch_ao() -> Iterator[None]:
    """Silence torch.ao's deprecation warnings (eager dynamic quantization still works in torch 2.13)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.ao\.quantization is deprecated.*")
        warnings.filterwarnings("ignore", message=r".*quantized tensor creation functions.*deprecated.*")
        yield


def dynamic_qconfig(per_channel: bool):
    """qint8 weights, per output channel (symmetric) or per tensor; activations quantized per batch."""
    return per_channel_dynamic_qconfig if per_channel else default_dynamic_qconfig


def quantize_linears(model, names: list[str] | None = None, *, per_channel: bool = True):
    """Replace ``nn.Linear`` layers (all, or the ``names`` given) by torch.ao dynamic int8 Linears, in place."""
    qconfig = dynamic_qconfig(per_channel)
    spec = {torch.nn.Linear: qconfig} if names is None else {name: qconfig for name in names}
    with quiet_torch_ao():
        return quantize_dynamic(model, spec, dtype=torch.qint8, inplace=True)


def _quantized_linears(model) -> Iterator[tuple[str, Any]]:
    for name, module in model.named_modules():
        if isinstance(module, DynamicLinear):
            yield name, module


def int8_state_dict(model) -> dict[str, torch.Tensor]:
    """The torch-int8 layout of a dynamically quantized model (see the module docstring)."""
    state: dict[str, torch.Tensor] = {}
    linears = dict(_quantized_linears(model))
    for name, module in linears.items():
        weight = module.weight()  # quantized (out, in)
        state[name + INT8_WEIGHT] = weight.int_repr().contiguous()  # int8
        if weight.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
            state[name + INT8_SCALE] = weight.q_per_channel_scales().to(torch.float64).contiguous()  # (out,)
            state[name + INT8_ZERO] = weight.q_per_channel_zero_points().to(torch.int64).contiguous()
        else:
            state[name + INT8_SCALE] = torch.tensor(weight.q_scale(), dtype=torch.float64)
            state[name + INT8_ZERO] = torch.tensor(weight.q_zero_point(), dtype=torch.int64)
        bias = module.bias()
        if bias is not None:
            # A copy: packed params keep the float bias, which a tied head shares (MLM decoder).
            state[name + ".bias"] = bias.detach().clone()
    seen: set[int] = set()
    for key, value in model.state_dict().items():
        # Quantized Linears are stored above (their state also holds packed params and an
        # unused output scale/zero point); aliases (tied weights) are stored once.
        if not isinstance(value, torch.Tensor) or value.is_quantized or key.rpartition(".")[0].split("._packed_params")[0] in linears:
            continue
        if value.data_ptr() in seen:
            continue
        seen.add(value.data_ptr())
        state[key] = value.detach().contiguous()
    return state


def write_torch_int8(model, directory: Path) -> Path:
    """Write ``model.int8.safetensors`` in the torch-int8 layout; the file."""

    file = Path(directory) / INT8_WEIGHTS_FILE
    save_file(int8_state_dict(model), str(file), metadata={"format": "pt", "compress_format": TORCH_INT8})
    return file


@FORMATS.register(TORCH_INT8)
def load_torch_int8(path: Path, options: dict[str, Any]):
    """Rebuild a torch-int8 directory: the fp32 architecture, dynamic int8 Linears, the stored int8 weights."""

    config, saved = load_config(path), saved_head(path)
    _check_options(path, TORCH_INT8, config, saved, options, eager_ok=True)
    if options.get("attn_implementation"):
        config._attn_implementation = options["attn_implementation"]
    # Folders written before the int8 file had its own name hold it as model.safetensors.
    file = path / INT8_WEIGHTS_FILE if (path / INT8_WEIGHTS_FILE).is_file() or not (path / WEIGHTS_FILE).is_file() else path / WEIGHTS_FILE
    try:
        state = load_file(str(file))
    except (SafetensorError, OSError, ValueError) as err:
        raise CompressError(f"{file} is missing or corrupt ({str(err).splitlines()[0]}); re-create the model directory") from None
    check_tensors(state, file, integer={INT8_WEIGHT: (torch.int8,), INT8_ZERO: (torch.int64,)})
    names = sorted(k[: -len(INT8_WEIGHT)] for k in state if k.endswith(INT8_WEIGHT))
    int8_keys = {n + s for n in names for s in (INT8_WEIGHT, INT8_SCALE, INT8_ZERO)}
    model = build_architecture(path, config, saved, empty=True)
    # The fp32 tensors (embeddings, LayerNorms, biases) load as usual; quantized weights come after.
    try:
        result = model.load_state_dict({k: v for k, v in state.items() if k not in int8_keys}, strict=False)
    except RuntimeError as err:  # size mismatches
        raise CompressError(f"{file} does not match its config.json/compression.json ({str(err).splitlines()[-1].strip()})") from None
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    quantized_weights = {n + ".weight" for n in names}
    missing = [k for k in result.missing_keys if k not in quantized_weights and k not in tied and not k.endswith("position_ids")]
    if missing or result.unexpected_keys:
        example = (missing or result.unexpected_keys)[0]
        raise CompressError(f"{file} does not match its config.json/compression.json (e.g. {example}); the directory is inconsistent")
    model.tie_weights()
    for name in names:
        # Uninitialised memory must not reach the observers; a fresh tensor, because a tied
        # decoder's weight is the word embedding matrix, which must stay as loaded.
        linear = model.get_submodule(name)
        linear.weight = torch.nn.Parameter(torch.zeros_like(linear.weight), requires_grad=False)
    quantize_linears(model, names, per_channel=state[names[0] + INT8_SCALE].dim() == 1 if names else True)
    with quiet_torch_ao():
        for name in names:
            module = model.get_submodule(name)
            module.set_weight_bias(_stored_qweight(state, name), module.bias())
    model.eval()
    model.compress_format = TORCH_INT8
    return _info(model, saved, describe(model), TORCH_INT8, options)


def _stored_qweight(state: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """The quantized (out, in) weight rebuilt from its int8 values, scales and zero points."""
    values, scale, zero = state[name + INT8_WEIGHT], state[name + INT8_SCALE], state[name + INT8_ZERO]
    if scale.dim() == 1:
        return torch._make_per_channel_quantized_tensor(values, scale.to(torch.float64), zero.to(torch.int64), 0)
    return torch._make_per_tensor_quantized_tensor(values, float(scale), int(zero))
