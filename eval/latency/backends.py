"""The latency backends: what loads one model directory into a :class:`Session` for timing.

A backend is ``(model_dir, options) -> Session``, registered in ``BACKENDS`` under the
name ``compress latency --backend`` takes. It runs inside a latency worker
(``compress.eval.latency.worker``) once the thread count is fixed, so it may import its
runtime freely. ``auto`` picks by the directory's format: ``torch`` (fp32 eager),
``torch-int8`` (dynamic int8 Linears), ``onnxruntime`` (an ONNX directory, or an fp32
PyTorch one exported inside the worker), ``inc`` (Neural Compressor PT2E,
inductor-compiled), ``static`` (a model2vec folder: token vectors, a mean and a normalisation), ``openvino`` (an OpenVINO IR, or an fp32 PyTorch / ONNX directory
converted inside the worker; f32, PERFORMANCE_HINT=LATENCY; with a ``compile_for`` that
compiles once more for a fixed shape), ``ctranslate2`` (a CTranslate2 Encoder folder in its stored compute type,
its task head in NumPy); ``torch-bf16`` casts an fp32 model to bfloat16 and
``openvino-bf16`` asks OpenVINO for bf16. All load through ``compress.core.formats.runtime``, as
evaluation does. ONNX Runtime and OpenVINO sessions time the runtime's own call on numpy
feeds built before timing (``NumpyRunner.feeds`` / ``call``): no tensor conversion or
transformers output object inside the timed region, which at batch 1 on short sentences
was up to a tenth of a small model's time (bench/results/2026-11-27/call-overhead).
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np
import torch

from compress.core.formats.artifacts import artifact_format, is_quantized, load_config, saved_head
from compress.core.formats.layout import CTRANSLATE2
from compress.core.formats.records import read_compression
from compress.core.errors import CompressError
from compress.core.formats.onnx import export_onnx
from compress.core.hardware import precisions
from compress.core.formats.openvino import OPENVINO, export_openvino
from compress.core.formats.openvino_runtime import (
    OPENVINO_PRECISION,
    RECORDED,
    OpenVINORunner,
    layer_precisions,
    recorded_precision,
)
from compress.core.registry import Registry
from compress.core.formats.architecture import parameter_count, structure_of
from compress.core.formats.runners import NumpyRunner
from compress.core.formats.runtime import load_model
from compress.core.formats.sentence import finish, mean_pooling, read_spec
from compress.core.formats.static import STATIC, structure as static_structure
from compress.core.model.structure import config_sizes, count_parameters, describe, model_inputs
from compress.eval.latency.kernels import kernels_used, run_capturing_stdout
from compress.eval.latency.peak import precision_of_backend


class Options(Protocol):
    """What a backend reads of its options (``compress.eval.latency.config.LatencyConfig`` has them all)."""

    threads: int | None  # intra-op threads of a runtime's own pool (ONNX Runtime, OpenVINO)
    openvino_shapes: str  # "static": OpenVINO compiles once more per fixed shape (``Session.compile_for``)
    lengths: str | None  # real inputs to come: OpenVINO pads them to a multiple of ``lengths_multiple``
    lengths_multiple: int


@dataclass
class Session:
    """One model loaded by a backend, ready to be timed on any batch.

    A batch is a dict of int64 numpy arrays of shape (batch, seq): ``input_ids``,
    ``attention_mask``, ``token_type_ids``. ``prepare`` turns it into what ``forward``
    takes (tensors or a runtime's feeds, the family's inputs only), outside the timed region; ``forward``
    runs the model once. ``compile_for``, where a backend has it, returns a forward
    compiled for one fixed (batch, seq) only: a grid point of that shape, and real inputs
    padded to that shape, use it instead of ``forward``.
    """

    prepare: Callable[[dict[str, np.ndarray]], Any]
    forward: Callable[[Any], Any]
    vocab_size: int
    params: int  # distinct parameters
    structure: dict[str, Any]  # compress.core.model.structure dict, for the FLOP count
    max_positions: int  # longest sequence the model accepts
    backend: str = ""  # the backend that ran, as rows name it (e.g. onnxruntime-int8)
    note: str | None = None  # a caveat for the report (e.g. bf16 without native support)
    compile_for: Callable[[tuple[int, int]], Callable[[Any], Any]] | None = None
    # Given a call that runs one forward pass, what the matrix multiplications ran on (compress.eval.latency.kernels); the
    # worker calls it once, after the timing.
    kernels: Callable[[Callable[[], Any]], dict[str, Any]] | None = None


# A backend: (model_dir, cfg) -> Session, called inside a worker process after the
# thread count is fixed; it may import its runtime (torch, onnxruntime) freely.
BACKENDS: Registry[Callable[[Path, Options], Session]] = Registry("latency backend")


@BACKENDS.register("torch")
def torch_fp32(model_dir: Path, cfg: Options) -> Session:
    """PyTorch eager fp32 with the directory's saved head, under ``torch.inference_mode``."""
    require_format(model_dir, "torch", "torch")
    model = load_model(model_dir)  # eval mode, fp32, pruned shapes rebuilt
    return runtime_session(model, model_dir, cfg, "torch", counted=model)


# The backend ``auto`` picks for each directory format (compression.json "format").
AUTO_BACKENDS = {"torch": "torch", "torch-int8-dynamic": "torch-int8", "onnx": "onnxruntime", "inc-pt2e": "inc",
                 OPENVINO: "openvino", STATIC: "static", CTRANSLATE2: "ctranslate2"}


@BACKENDS.register("auto")
def auto(model_dir: Path, cfg: Options) -> Session:
    """The backend for the directory's format: torch, torch-int8, onnxruntime or inc."""
    fmt = artifact_format(model_dir)
    if fmt not in AUTO_BACKENDS:
        raise CompressError(f"{model_dir} has format {fmt!r}, which no latency backend runs; valid: {', '.join(AUTO_BACKENDS)}")
    return BACKENDS.get(AUTO_BACKENDS[fmt])(model_dir, cfg)


def require_format(model_dir: Path, fmt: str, backend: str) -> None:
    """Refuse a directory whose format the backend does not run (e.g. --backend torch on ONNX)."""
    found = artifact_format(model_dir)
    if found != fmt:
        raise CompressError(f"the {backend} latency backend runs {fmt} directories; {model_dir} is {found} (use --backend auto)")


# A runner's format -> the runtime whose kernels it runs (compress.eval.latency.kernels); anything else runs torch's.
KERNEL_RUNTIMES = {"onnx": "onnxruntime", OPENVINO: "openvino", CTRANSLATE2: "ctranslate2"}


def runtime_session(model, model_dir: Path, cfg: Options, backend: str, note: str | None = None, *,
                    counted=None, structure: dict[str, Any] | None = None, runtime: str | None = None) -> Session:
    """A Session timing any model from ``compress.core.formats.runtime`` (HF call convention, torch tensors in).

    ``counted``: an fp32 torch model to count parameters and shapes on; otherwise they come
    from the directory (an int8 file has no fp32 tensors to count). ``structure``: that of
    the graph the worker converted the directory to, which is what runs (a classifier's
    last layer computes the first token only), so FLOPs are counted from it.
    """
    config = model.config

    def tensors(batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        return model_inputs(model, {k: torch.from_numpy(v) for k, v in batch.items()})  # those the family takes

    if counted is not None:
        params, structure = count_parameters(counted), describe(counted)
    else:
        params, structure = parameter_count(model_dir), structure or structure_of(model_dir)
    if isinstance(model, NumpyRunner):  # ONNX Runtime, OpenVINO: time the runtime's call on feeds built beforehand
        prepare, forward = model.feeds, model.call
    else:
        prepare, forward = tensors, forward_of(model)
    sizes = config_sizes(config)
    runtime = runtime or KERNEL_RUNTIMES.get(getattr(model, "format", None), "torch")  # the library whose kernels ran
    precision = precision_of_backend(backend, note)  # the precision the row's GEMMs ran in (an OpenVINO note may say bf16)
    compiled = getattr(model, "compiled", None)  # an OpenVINO compiled model: its runtime graph names the primitives

    def kernels(run: Callable[[], Any]) -> dict[str, Any]:
        return kernels_used(runtime, run, precision, compiled)

    return Session(prepare, forward, sizes.vocab, params, structure, sizes.max_positions, backend, note, kernels=kernels)


def forward_of(model) -> Callable[[dict[str, torch.Tensor]], Any]:
    """One call of ``model`` on prepared inputs, without autograd."""
    def forward(inputs: dict[str, torch.Tensor]):
        with torch.inference_mode():
            return model(**inputs)
    return forward


@BACKENDS.register("static")
def static_session(model_dir: Path, cfg: Options) -> Session:
    """A model2vec folder in PyTorch: each sentence's token vectors, their mean over the mask, the folder's normalisation.

    The whole sentence embedding is timed, not only the lookup an encoder's ``last_hidden_state``
    would stand for: with no layers, the mean and the normalisation are much of the work. It has no
    matrix multiplication, so no FLOPs and no kernels to report.
    """
    require_format(model_dir, STATIC, "static")
    model, spec = load_model(model_dir), read_spec(model_dir)
    tokens, width = model.embedding.weight.shape

    def tensors(batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        return {k: torch.from_numpy(batch[k]) for k in ("input_ids", "attention_mask")}

    def forward(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        with torch.inference_mode():
            hidden = model(**inputs).last_hidden_state  # (batch, seq, d)
            return finish(mean_pooling(hidden, inputs["attention_mask"]), spec)  # (batch, d)

    sizes = config_sizes(model.config)
    return Session(tensors, forward, tokens, count_parameters(model), static_structure(tokens, width), sizes.max_positions,
                   "static")


@BACKENDS.register("torch-int8")
def torch_int8(model_dir: Path, cfg: Options) -> Session:
    """PyTorch eager with the directory's dynamic int8 Linears (``compress quantize --backend torch``)."""
    require_format(model_dir, "torch-int8-dynamic", "torch-int8")
    return runtime_session(load_model(model_dir), model_dir, cfg, "torch-int8", runtime="torch-fbgemm")


@BACKENDS.register("torch-bf16")
def torch_bf16(model_dir: Path, cfg: Options) -> Session:
    """PyTorch eager after ``model.to(torch.bfloat16)`` of an fp32 directory."""

    require_format(model_dir, "torch", "torch-bf16")
    model = load_model(model_dir).to(torch.bfloat16)
    note = None
    if not precisions().bf16:
        note = "torch-bf16: this CPU has no avx512_bf16/amx_bf16, so bf16 matmuls are emulated (usually slower than fp32)"
    return runtime_session(model, model_dir, cfg, "torch-bf16", note)


@BACKENDS.register("onnxruntime")
def onnxruntime_session(model_dir: Path, cfg: Options) -> Session:
    """An ONNX Runtime session (ORT_ENABLE_ALL); an fp32 PyTorch directory is exported first, in this worker."""
    fmt = artifact_format(model_dir)
    if fmt == "onnx":
        model, structure = load_model(model_dir, threads=cfg.threads), None
    elif fmt == "torch":
        with tempfile.TemporaryDirectory(prefix="compress-onnx-") as tmp:
            # The session reads the whole graph at load, so the export can go right after.
            exported = export_onnx(model_dir, Path(tmp) / "onnx")
            model, structure = load_model(exported, threads=cfg.threads), structure_of(exported)
    else:
        raise CompressError(f"the onnxruntime latency backend runs ONNX or fp32 PyTorch directories; {model_dir} is {fmt} (use --backend auto)")
    return runtime_session(model, model_dir, cfg, "onnxruntime-int8" if is_quantized(model_dir) else "onnxruntime",
                           structure=structure)


@BACKENDS.register("inc")
def inc_session(model_dir: Path, cfg: Options) -> Session:
    """A Neural Compressor PT2E int8 program, compiled by inductor with freezing (first call per shape)."""
    require_format(model_dir, "inc-pt2e", "inc")
    return runtime_session(load_model(model_dir), model_dir, cfg, "inc-int8")


@BACKENDS.register("openvino")
def openvino_session(model_dir: Path, cfg: Options, precision: str = RECORDED) -> Session:
    """An OpenVINO compiled model (the worker's threads, PERFORMANCE_HINT=LATENCY, in ``precision``: by default what
    the folder records, bf16 for ``compress export --precision bf16`` where the CPU has bf16 kernels, else f32).

    An fp32 PyTorch or ONNX directory is converted first, in this worker. The row's backend
    names int8 and any precision other than f32 (``openvino-int8``, ``openvino-bf16``); its
    note gives the precision the compiled model reports and what its matrix multiplications run in.
    """
    fmt = artifact_format(model_dir)
    name = "openvino" if precision in (OPENVINO_PRECISION, RECORDED) else f"openvino-{precision}"
    if fmt not in (OPENVINO, "torch", "onnx"):
        raise CompressError(f"the {name} latency backend runs OpenVINO, ONNX or fp32 PyTorch directories; {model_dir} is {fmt} "
                            "(use --backend auto)")
    # A converted IR lives as long as the worker (a temporary folder, removed at exit): shapes are compiled from it on demand.
    tmp = None if fmt == OPENVINO else tempfile.TemporaryDirectory(prefix="compress-openvino-")
    ir = model_dir if tmp is None else export_openvino(model_dir, Path(tmp.name) / "openvino")
    config, head = load_config(ir), saved_head(ir)
    model = OpenVINORunner(ir, config, head, threads=cfg.threads, precision=precision)  # any shape
    ran = layer_precisions(model.compiled)
    backend = "openvino" + ("-int8" if is_quantized(model_dir) else "") + ("" if model.precision == "f32" else f"-{model.precision}")
    static = cfg.openvino_shapes == "static"
    asked = f"{recorded_precision(ir)}, as the folder records" if precision == RECORDED else precision
    note = (f"{model_dir.name}: OpenVINO inference precision {model.precision} (asked: {asked}); matrix multiplications in "
            + ", ".join(f"{kind} x{count}" for kind, count in sorted(ran.items()))
            + ("; compiled for each grid point's fixed [batch, seq]" if static else "; compiled for any shape")
            + (f", real inputs padded to a multiple of {cfg.lengths_multiple} tokens, compiled per padded shape"
               if static and cfg.lengths else ""))
    session = runtime_session(model, model_dir, cfg, backend, note, structure=structure_of(ir))
    latest = [model]  # the runner compiled last: the one the kernel probe reads

    def compile_for(shape: tuple[int, int], _keep=tmp) -> Callable[[Any], Any]:
        latest[-1] = OpenVINORunner(ir, config, head, threads=cfg.threads, precision=precision, shape=shape)
        return latest[-1].call

    def kernels(run: Callable[[], Any]) -> dict[str, Any]:
        return kernels_used("openvino", run, precision_of_backend(backend, note), latest[-1].compiled)

    if static:
        session.compile_for = compile_for
    session.kernels = kernels
    return session


@BACKENDS.register("ctranslate2")
def ctranslate2_session(model_dir: Path, cfg: Options) -> Session:
    """A CTranslate2 Encoder (the worker's threads, the folder's stored compute type) and its head in NumPy.

    The row's backend names the compute type this CPU ran (``ctranslate2-int8``; ``ctranslate2`` for float32, which
    bfloat16 weights run in without bf16 kernels). CTranslate2 logs its instruction set and GEMM libraries at the
    first model load of a process only, so the load is made with its log on and the log kept for the kernel record.
    """
    # deferred: CTranslate2's extension, imported by the workers that time it
    import ctranslate2

    require_format(model_dir, CTRANSLATE2, "ctranslate2")
    loaded, level = [], ctranslate2.get_log_level()
    ctranslate2.set_log_level(logging.INFO)
    try:  # its log goes to the process's stderr (file descriptor 2)
        log = run_capturing_stdout(lambda: loaded.append(load_model(model_dir, threads=cfg.threads)), fd=2)
    finally:
        ctranslate2.set_log_level(level)
    model = loaded[0]
    compute = model.compute_type
    backend = "ctranslate2" + ("-int8" if compute.startswith("int8") else "-bf16" if compute == "bfloat16" else "")
    note = f"{model_dir.name}: CTranslate2 compute type {compute} (weights {read_quantization(model_dir)})"
    session = runtime_session(model, model_dir, cfg, backend, note)

    def kernels(run: Callable[[], Any]) -> dict[str, Any]:
        return kernels_used("ctranslate2", run, precision_of_backend(backend, note), log)

    session.kernels = kernels
    return session


def read_quantization(model_dir: Path) -> str:
    """The weight type a CTranslate2 folder's compression.json records (``?`` when it records none)."""
    spec = read_compression(model_dir).get(CTRANSLATE2)
    return str(spec.get("quantization")) if isinstance(spec, dict) else "?"


@BACKENDS.register("openvino-bf16")
def openvino_bf16_session(model_dir: Path, cfg: Options) -> Session:
    """The ``openvino`` backend with INFERENCE_PRECISION_HINT=bf16 (what the CPU plugin picks by itself where bf16 exists)."""
    return openvino_session(model_dir, cfg, precision="bf16")
