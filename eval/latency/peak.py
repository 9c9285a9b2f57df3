"""The CPU's matrix-multiply peak per precision: measured on every GEMM engine, and on paper.

``measure_peaks(threads)`` times square n x n products in fp32, bf16 and int8 on each engine
that can run them (torch, numpy's BLAS, ONNX Runtime, OpenVINO) and keeps the best per
precision: the hardware's attainable peak is what its best engine reaches, not what
``torch.mm`` happens to reach (engines differ by precision and by load: on an idle 2-core Zen 4
EPYC the fp32 engines agree within 4% at ~205 GFLOP/s, while int8 ranges 850-901 GOP/s).
``cpu_theoretical_peaks(cores)`` is the paper figure (``compress.core.cpu_peaks``): cores x clock x
operations per cycle of the instruction set and microarchitecture, with its basis spelled out.
``floor_ms(flops, peak)`` is the time a model would take at that peak, and
``precision_of_backend(backend, note)`` says which precision's peak a latency row is bound by.

It runs inside a latency worker whose thread count is already fixed (environment and
``torch.set_num_threads``): it never changes threads, only passes ``threads`` to the
runtimes that take it per session (ONNX Runtime, OpenVINO). Every engine is timed in
turn, never two at once, and each is freed before the next starts.

Units: fp32 and bf16 in GFLOP/s, int8 in GOP/s, both counting a multiply-add as 2
operations, so an n x n x n product is 2 n^3 of them.
"""

from __future__ import annotations

import re
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from compress.core.cpu_peaks import cpu_peaks
from compress.core.hardware import cpu_info, precisions
from compress.core.errors import foreign
from compress.core.formats import openvino_runtime
from compress.core.formats.openvino_runtime import compile_openvino, inference_precision, layer_precisions
from compress.eval.latency.kernels import kernels_used

try:  # optional: names the BLAS library and its thread count; scikit-learn brings it
    import threadpoolctl
except ImportError:  # pragma: no cover - the BLAS name then comes from numpy alone
    threadpoolctl = None

PRECISIONS = ("fp32", "bf16", "int8")
UNITS = {"fp32": "GFLOP/s", "bf16": "GFLOP/s", "int8": "GOP/s"}

# Square sizes: compute-bound on a CPU (2 n^3 operations on 3 n^2 numbers), ~0.1 s per
# 2048 product on 2 cores. An engine whose first size took longer than SLOW_SECONDS skips
# the larger ones, so the whole measurement stays near 15 s on 2 cores.
PEAK_SIZES = (1024, 2048)
PEAK_SECONDS = 0.3
WARMUP = 2
# The best of at least REPEATS products and min_seconds per size: noise from other
# processes only ever slows a product down, so the fastest one is the peak.
REPEATS = 5
SLOW_SECONDS = 1.0
SEED = 0  # the same operands on every run



# ---------------------------------------------------------------------------- engines


@dataclass(frozen=True)
class Product:
    """One engine ready to multiply two prepared n x n matrices: ``run()`` does one product."""

    run: Callable[[], Any]  # inputs, weights and output buffers are built beforehand
    info: dict[str, Any]  # what ran, for the record (op, library, precision reported)
    runtime: str | None = None  # whose kernels ran (compress.eval.latency.kernels: torch, onnxruntime, openvino); None: not probed
    compiled: Any = None  # an OpenVINO compiled model: its runtime graph names the kernels


class WrongPrecision(Exception):
    """The runtime ran the product in another precision than asked (e.g. int8 emulated in f32)."""

    def __init__(self, message: str, reported: str):
        super().__init__(message)
        self.reported = reported


# An engine: (n, threads) -> Product. precision -> engine name -> engine, in timing order.
Engine = Callable[[int, int], Product]
ENGINES: dict[str, dict[str, Engine]] = {precision: {} for precision in PRECISIONS}


def engine(precision: str, name: str) -> Callable[[Engine], Engine]:
    """Register a GEMM engine for ``precision`` under ``name``; a name registered twice is refused."""

    def add(fn: Engine) -> Engine:
        if name in ENGINES[precision]:
            raise ValueError(f"{precision} GEMM engine {name!r} is registered twice")
        ENGINES[precision][name] = fn
        return fn

    return add


def _torch_pair(n: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two random (n, n) operands of ``dtype`` and an output buffer (products write into it: no allocation timed)."""
    gen = torch.Generator().manual_seed(SEED)
    if dtype == torch.int8:
        a, b = (torch.randint(-128, 128, (n, n), dtype=torch.int8, generator=gen) for _ in range(2))
        return a, b, torch.empty(n, n, dtype=torch.int32)
    a, b = (torch.randn(n, n, generator=gen).to(dtype) for _ in range(2))
    return a, b, torch.empty(n, n, dtype=dtype)


@engine("fp32", "torch")
def torch_fp32(n: int, threads: int) -> Product:
    a, b, c = _torch_pair(n, torch.float32)
    return Product(lambda: torch.mm(a, b, out=c), {"op": "torch.mm"}, "torch")


@engine("bf16", "torch")
def torch_bf16(n: int, threads: int) -> Product:
    a, b, c = _torch_pair(n, torch.bfloat16)
    # Without native bf16 instructions torch converts to fp32 inside the GEMM: still a bf16
    # product numerically, but bounded by fp32 speed; the record says which.
    native = precisions().bf16
    return Product(lambda: torch.mm(a, b, out=c), {"op": "torch.mm", "native_bf16": native}, "torch")


@engine("int8", "torch")
def torch_int8(n: int, threads: int) -> Product:
    a, b, c = _torch_pair(n, torch.int8)
    try:
        torch._int_mm(a, b, out=c)  # int8 x int8 -> int32; absent or CUDA-only in some builds
        return Product(lambda: torch._int_mm(a, b, out=c), {"op": "torch._int_mm"}, "torch")
    except (AttributeError, RuntimeError, NotImplementedError):
        pass
    # The fallback: a dynamically quantized Linear (int8 weights; it quantizes its fp32
    # input on every call, an O(n^2) extra beside the O(n^3) int8 GEMM).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's deprecation of quantized tensors: not this measurement's concern
        linear = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(torch.nn.Linear(n, n, bias=False)),
                                                        {torch.nn.Linear}, dtype=torch.qint8)
    x = torch.randn(n, n, generator=torch.Generator().manual_seed(SEED))  # (n, n) fp32

    def run():
        with torch.inference_mode():
            return linear(x)

    return Product(run, {"op": "quantize_dynamic nn.Linear (torch._int_mm unavailable)"}, "torch-fbgemm")


@engine("fp32", "numpy")
def numpy_fp32(n: int, threads: int) -> Product:
    rng = np.random.default_rng(SEED)
    a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    c = np.empty((n, n), dtype=np.float32)
    return Product(lambda: np.matmul(a, b, out=c), {"op": "np.matmul", **numpy_blas()})


def numpy_blas() -> dict[str, Any]:
    """numpy's BLAS library (e.g. ``scipy-openblas 0.3.31``), its kernel set and threads, as far as known."""
    info: dict[str, Any] = {"blas": "numpy"}
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        info["blas"] = f"{blas['name']} {blas.get('version', '')}".strip()
    except Exception:  # older numpy: no dict form of show_config
        pass
    if threadpoolctl is not None:
        for lib in threadpoolctl.threadpool_info():
            # numpy's own BLAS (its wheel vendors it in numpy.libs), not torch's or another's.
            if lib.get("user_api") == "blas" and "numpy" in lib.get("filepath", ""):
                info["blas_threads"] = lib.get("num_threads")
                if lib.get("architecture"):
                    info["blas_kernels"] = lib["architecture"]
    return info


def _ort_product(n: int, threads: int, integer: bool) -> Product:
    """A one-node ONNX graph: A (an input) x B (an initializer, as a model's weights) -> C."""
    # deferred: heavy imports, paid only when this engine runs
    import onnx
    # deferred: as above
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(SEED)
    if integer:  # MatMulInteger: uint8 activations x int8 weights -> int32, ORT's dynamic-int8 kernel
        a = rng.integers(0, 256, (n, n), dtype=np.uint8)
        b = rng.integers(-128, 128, (n, n), dtype=np.int8)
        op, a_type, c_type, c = "MatMulInteger", TensorProto.UINT8, TensorProto.INT32, np.empty((n, n), np.int32)
    else:
        a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
        op, a_type, c_type, c = "MatMul", TensorProto.FLOAT, TensorProto.FLOAT, np.empty((n, n), np.float32)
    graph = helper.make_graph(
        [helper.make_node(op, ["a", "b"], ["c"])], "gemm",
        [helper.make_tensor_value_info("a", a_type, [n, n])],
        [helper.make_tensor_value_info("c", c_type, [n, n])],
        [numpy_helper.from_array(b, "b")],  # constant B: ORT prepacks it once, as for a model's weights
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # readable by any ORT this toolkit supports
    onnx.checker.check_model(model)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    # Bound input and output buffers: a run is the GEMM, not a copy or an allocation.
    binding = session.io_binding()
    binding.bind_cpu_input("a", a)
    binding.bind_output("c", "cpu", 0, c.dtype, list(c.shape), c.ctypes.data)

    def run():
        session.run_with_iobinding(binding)
        return c  # (n, n), written in place

    return Product(run, {"op": op, "onnxruntime": ort.__version__}, "onnxruntime")


@engine("fp32", "onnxruntime")
def onnxruntime_fp32(n: int, threads: int) -> Product:
    return _ort_product(n, threads, integer=False)


@engine("int8", "onnxruntime")
def onnxruntime_int8(n: int, threads: int) -> Product:
    return _ort_product(n, threads, integer=True)


def _openvino_product(n: int, threads: int, precision: str) -> Product:
    """One MatMul of an input (n, n) by constant weights (n, n), compiled for the CPU.

    ``precision``: ``f32`` or ``bf16`` (INFERENCE_PRECISION_HINT), or ``int8``: both operands
    go through FakeQuantize, the pattern NNCF writes, which the CPU plugin runs as a u8 x i8
    GEMM. What ran is read back from the compiled model, and a mismatch is an error.
    """
    # deferred: a heavy import, paid only when this engine runs
    import openvino as ov
    # deferred: as above
    import openvino.opset13 as ops

    rng = np.random.default_rng(SEED)
    a = rng.random((n, n), dtype=np.float32)  # (n, n) in [0, 1): activations
    weights = rng.standard_normal((n, n), dtype=np.float32)
    x = ops.parameter([n, n], ov.Type.f32, name="a")
    w = ops.constant(weights)
    if precision == "int8":
        def fq(node, low: float, high: float):
            bounds = [ops.constant(np.array(v, dtype=np.float32)) for v in (low, high, low, high)]
            return ops.fake_quantize(node, *bounds, 256)

        # Asymmetric [0, 2.55] -> u8 for activations, symmetric [-1.28, 1.27] -> i8 for weights.
        x_in, w_in, hint = fq(x, 0.0, 2.55), fq(w, -1.28, 1.27), "f32"
    else:
        x_in, w_in, hint = x, w, precision
    model = ov.Model([ops.matmul(x_in, w_in, False, False)], [x], "gemm")
    compiled = compile_openvino(model, threads=threads, precision=hint)
    floating = inference_precision(compiled)  # what the plugin reports, e.g. f32 / bf16
    ran = layer_precisions(compiled)  # e.g. {"u8": 1}: the GEMM as the runtime graph executes it
    what = ", ".join(sorted(ran)) or floating
    # Never count a run under another precision's name (int8 emulated in f32, bf16 refused).
    if (precision_of_layers(ran) or OPENVINO_PRECISIONS.get(floating, floating)) != OPENVINO_PRECISIONS[precision]:
        raise WrongPrecision(f"OpenVINO ran the {precision} product in {what}, not {precision}", what)
    request = compiled.create_infer_request()
    request.set_input_tensor(ov.Tensor(a))  # shares a's memory; the output tensor is the request's own
    return Product(request.infer, {"precision": what, "inference_precision": floating, "openvino": ov.get_version().split("-")[0]},
                   "openvino", compiled)


@engine("fp32", "openvino")
def openvino_fp32(n: int, threads: int) -> Product:
    return _openvino_product(n, threads, "f32")


@engine("bf16", "openvino")
def openvino_bf16(n: int, threads: int) -> Product:
    # Only where the CPU has bf16 instructions: elsewhere the plugin would emulate (or refuse) it.
    if not openvino_runtime.openvino_bf16():
        raise RuntimeError("this CPU has no native bf16 (OpenVINO's OPTIMIZATION_CAPABILITIES lacks BF16)")
    return _openvino_product(n, threads, "bf16")


@engine("int8", "openvino")
def openvino_int8(n: int, threads: int) -> Product:
    return _openvino_product(n, threads, "int8")


# ---------------------------------------------------------------------------- measuring


def measure_peaks(threads: int, sizes: tuple[int, ...] = PEAK_SIZES, min_seconds: float = PEAK_SECONDS) -> dict[str, Any]:
    """The best measured GEMM throughput per precision and engine, on ``threads`` threads (set by the caller).

    Returns ``{"fp32": {"engines": {"torch": {"gflops": 196.0, "n": 2048, ...}, "numpy": {...},
    ...}, "best": "openvino", "gflops": 340.1, "unit": "GFLOP/s"}, "bf16": {...}, "int8": {...},
    "threads": 2}``; an engine that failed or is absent is ``{"error": "one line"}``, and a
    precision no engine ran has ``"best": None, "gflops": None``. Never raises for an engine.
    """
    report: dict[str, Any] = {}
    for precision in PRECISIONS:
        engines = {name: measure_engine(make, threads, sizes, min_seconds) for name, make in ENGINES[precision].items()}
        ran = {name: record["gflops"] for name, record in engines.items() if "gflops" in record}
        best = max(ran, key=ran.get) if ran else None
        report[precision] = {"engines": engines, "best": best, "gflops": ran.get(best), "unit": UNITS[precision]}
    report["threads"] = threads
    report["sizes"] = list(sizes)
    return report


def precision_of(make: Engine) -> str:
    """The precision an engine is registered under (its kernels are judged against that precision's units)."""
    return next((precision for precision, engines in ENGINES.items() if make in engines.values()), "fp32")


def measure_engine(make: Engine, threads: int, sizes: tuple[int, ...], min_seconds: float) -> dict[str, Any]:
    """One engine's best rate over ``sizes`` (smallest first): ``{"gflops", "n", "seconds", ...info}`` or ``{"error"}``."""
    record: dict[str, Any] = {}
    ordered, began = sorted(sizes), time.perf_counter()
    for i, n in enumerate(ordered):
        start, product = time.perf_counter(), None
        try:
            product = make(n, threads)
            rate, info = best_rate(product.run, 2 * n**3, min_seconds), product.info
            if product.runtime and "kernels" not in record:  # once per engine, after its first size's timing
                record["kernels"] = kernels_used(product.runtime, product.run, precision_of(make), product.compiled)
        except Exception as err:  # any runtime's failure is a record, never the caller's exception
            if record:  # a larger size failed (e.g. out of memory): keep what the smaller ones measured
                record["error_at"] = {"n": n, "error": one_line(err)}
                break
            failed = {"error": one_line(err)}
            if isinstance(err, WrongPrecision):
                failed["precision"] = err.reported
            return failed
        finally:
            # Free this size's session or compiled model (and its threads) before the next: the
            # closures hold no cycles, so dropping the last reference is enough (gc.collect costs
            # ~0.2 s with transformers loaded).
            product = None
        if rate > record.get("gflops", 0.0):
            record.update(gflops=rate, n=n, **info)
        if time.perf_counter() - start > SLOW_SECONDS and i + 1 < len(ordered):
            record["skipped"] = ordered[i + 1:]  # a slow engine: the larger sizes would take too long
            break
    record["seconds"] = time.perf_counter() - began  # set-up included: where the measurement's time went
    return record


def best_rate(run: Callable[[], Any], ops: float, min_seconds: float) -> float:
    """Best G-operations per second of ``run`` (``ops`` operations a call) after WARMUP untimed calls."""
    for _ in range(WARMUP):
        run()
    best, spent, calls = float("inf"), 0.0, 0
    while calls < REPEATS or spent < min_seconds:
        start = time.perf_counter()
        run()
        seconds = time.perf_counter() - start
        best, spent, calls = min(best, seconds), spent + seconds, calls + 1
    return ops / best / 1e9


def one_line(err: BaseException) -> str:
    """``Type: message``, the message whole on one line (runtimes raise multi-line C++ traces)."""
    message = foreign(err)
    return f"{type(err).__name__}: {message}" if message else type(err).__name__


# ---------------------------------------------------------------------------- on paper (compress.core.cpu_peaks)


def cpu_theoretical_peaks(cores: int | None = None) -> dict[str, Any]:
    """:func:`compress.core.cpu_peaks.cpu_peaks` of this machine, on ``cores`` cores (default: its usable physical cores)."""
    info = cpu_info()
    return cpu_peaks(cores or max(1, min(info["physical_cores"], info["usable_cores"])))


def peak_notes(measured: dict[str, Any], theoretical: dict[str, Any]) -> list[str]:
    """Where a measured peak beats the paper one: the paper's core or clock assumption is wrong (say so)."""
    notes = []
    for precision in PRECISIONS:
        got, bound = measured.get(precision, {}).get("gflops"), theoretical.get(precision, {}).get("gflops")
        if got and bound and got > bound:
            notes.append(f"measured {precision} {got:.0f} {UNITS[precision]} ({measured[precision]['best']}) exceeds the "
                         f"theoretical {bound:.0f} ({theoretical['basis']}): the core or the clock is not what /proc/cpuinfo "
                         "says (a VM may report another CPU model or only the nominal clock)")
    return notes


# ---------------------------------------------------------------------------- using the peaks


def floor_ms(flops: float, peak_gflops: float) -> float:
    """Milliseconds ``flops`` operations take at ``peak_gflops`` G-operations per second: a model's floor at that peak."""
    if not peak_gflops or peak_gflops <= 0:
        raise ValueError(f"the peak must be a positive GFLOP/s figure, got {peak_gflops!r}")
    return flops / (peak_gflops * 1e9) * 1e3


# The precision each latency backend's matrix multiplications run in. An int8 model's other
# ops (softmax, LayerNorm, unquantized layers) run in fp32 or bf16; its GEMMs are what the peak bounds.
BACKEND_PRECISIONS = {
    "torch": "fp32", "torch-int8": "int8", "torch-bf16": "bf16", "onnxruntime": "fp32", "onnxruntime-int8": "int8",
    "inc-int8": "int8", "openvino": "fp32", "openvino-int8": "int8", "openvino-bf16": "bf16", "openvino-int8-bf16": "int8",
}
# OpenVINO runtime precisions (layer_precisions keys, INFERENCE_PRECISION_HINT names) -> ours.
OPENVINO_PRECISIONS = {"u8": "int8", "i8": "int8", "int8": "int8", "bf16": "bf16", "f16": "fp16", "f32": "fp32"}


def precision_of_layers(counts: dict[str, int]) -> str | None:
    """The precision a model's GEMMs run in from OpenVINO's per-layer counts (``{"u8": 12, "f32": 2}`` -> int8)."""
    ours = {OPENVINO_PRECISIONS.get(kind.lower()) for kind, count in counts.items() if count}
    # Any int8 GEMM makes it an int8 model (its attention products may stay floating point).
    for precision in ("int8", "bf16", "fp16", "fp32"):
        if precision in ours:
            return precision
    return None


def precision_of_backend(backend: str, note: str | None = None) -> str:
    """``fp32``, ``bf16`` or ``int8``: what a latency row's matrix multiplications ran in.

    The row's note wins where it lists what an OpenVINO model's GEMMs ran in ("matrix
    multiplications in u8 x12, f32 x2"), since the plugin may differ from the name; an
    f16 run is ``fp16``, which has no peak here. Unknown names are read by their parts.
    """
    if note:
        listed = re.search(r"matrix multiplications in ([^;]+)", note)
        if listed:
            counts = {kind: int(count) for kind, count in re.findall(r"(\w+) x(\d+)", listed.group(1))}
            found = precision_of_layers(counts)
            if found:
                return found
    if backend in BACKEND_PRECISIONS:
        return BACKEND_PRECISIONS[backend]
    parts = backend.split("-")
    return "int8" if "int8" in parts else "bf16" if "bf16" in parts else "fp32"
