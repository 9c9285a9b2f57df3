"""The CPU's matrix-multiply peak per precision: measured on every GEMM engine, and on paper.

``measure_peaks(threads)`` times square n x n products in fp32, bf16 and int8 on each engine
that can run them (torch, numpy's BLAS, ONNX Runtime, OpenVINO) and keeps the best per
precision: the hardware's attainable peak is what its best engine reaches, not what
``torch.mm`` happens to reach (engines differ by precision and by load: on an idle 2-core Zen 4
EPYC the fp32 engines agree within 4% at ~205 GFLOP/s, while int8 ranges 850-901 GOP/s).
``theoretical_peaks(flags, cores, ghz, ...)`` is the paper figure: cores x clock x
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
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from compress.core.hardware import cpu_info
from compress.core.runtime import compile_openvino, inference_precision, layer_precisions

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

PROC_CPUINFO = Path("/proc/cpuinfo")
CPUFREQ_MAX = Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")  # kHz


# ---------------------------------------------------------------------------- engines


@dataclass(frozen=True)
class Product:
    """One engine ready to multiply two prepared n x n matrices: ``run()`` does one product."""

    run: Callable[[], Any]  # inputs, weights and output buffers are built beforehand
    info: dict[str, Any]  # what ran, for the record (op, library, precision reported)


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
    return Product(lambda: torch.mm(a, b, out=c), {"op": "torch.mm"})


@engine("bf16", "torch")
def torch_bf16(n: int, threads: int) -> Product:
    a, b, c = _torch_pair(n, torch.bfloat16)
    # Without native bf16 instructions torch converts to fp32 inside the GEMM: still a bf16
    # product numerically, but bounded by fp32 speed; the record says which.
    native = bool({"avx512_bf16", "amx_bf16"} & set(cpu_info()["flags"]))
    return Product(lambda: torch.mm(a, b, out=c), {"op": "torch.mm", "native_bf16": native})


@engine("int8", "torch")
def torch_int8(n: int, threads: int) -> Product:
    a, b, c = _torch_pair(n, torch.int8)
    try:
        torch._int_mm(a, b, out=c)  # int8 x int8 -> int32; absent or CUDA-only in some builds
        return Product(lambda: torch._int_mm(a, b, out=c), {"op": "torch._int_mm"})
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

    return Product(run, {"op": "quantize_dynamic nn.Linear (torch._int_mm unavailable)"})


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

    return Product(run, {"op": op, "onnxruntime": ort.__version__})


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
    return Product(request.infer, {"precision": what, "inference_precision": floating, "openvino": ov.get_version().split("-")[0]})


@engine("fp32", "openvino")
def openvino_fp32(n: int, threads: int) -> Product:
    return _openvino_product(n, threads, "f32")


@engine("bf16", "openvino")
def openvino_bf16(n: int, threads: int) -> Product:
    # deferred: a heavy import, paid only when this engine runs
    import openvino as ov

    # Only where the CPU has bf16 instructions: elsewhere the plugin would emulate (or refuse) it.
    if "BF16" not in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
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


def measure_engine(make: Engine, threads: int, sizes: tuple[int, ...], min_seconds: float) -> dict[str, Any]:
    """One engine's best rate over ``sizes`` (smallest first): ``{"gflops", "n", "seconds", ...info}`` or ``{"error"}``."""
    record: dict[str, Any] = {}
    ordered, began = sorted(sizes), time.perf_counter()
    for i, n in enumerate(ordered):
        start, product = time.perf_counter(), None
        try:
            product = make(n, threads)
            rate, info = best_rate(product.run, 2 * n**3, min_seconds), product.info
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
    """``Type: first line of the message`` (runtimes raise multi-line C++ traces)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__


# ---------------------------------------------------------------------------- on paper


@dataclass(frozen=True)
class Microarchitecture:
    """What one core's vector units multiply-add per cycle, as far as the CPU's identity tells."""

    name: str  # e.g. "AMD Zen 4"
    fma_bits: int  # multiply-add datapath bits per cycle: FMA pipes x width (Zen 4: 2 x 256 = 512)
    why: str  # how that width is known, or what was assumed


# Intel family-6 models whose every SKU has two 512-bit FMA units: Ice Lake-SP (106, 108),
# Sapphire Rapids (143), Emerald Rapids (207), Granite Rapids (173, 174). Skylake-SP /
# Cascade Lake / Cooper Lake (85) have one or two by SKU; client cores have one.
INTEL_TWO_FMA512 = {106, 108, 143, 173, 174, 207}
INTEL_SKYLAKE_SP = 85


def microarchitecture(flags: set[str], vendor: str | None, family: int | None, model: int | None,
                      model_name: str | None) -> Microarchitecture:
    """The core's multiply-add width per cycle from vendor, family, model and flags; conservative when unknown.

    Sources: AMD Zen 4 runs 512-bit ops on its two 256-bit FMA pipes (numberworld.org, "Zen4
    AVX512 teardown", 2022); Zen 5 widened them to 512 bits on desktop and server parts, not on
    Strix/Krackan Point mobiles (numberworld.org "Zen5 AVX512 teardown", 2024; chipsandcheese.com
    "AMD's Strix Point: Zen 5 hits mobile", 2024); Intel Haswell..Alder Lake P-cores have two
    256-bit FMA pipes (ports 0, 1), AVX-512 client cores fuse them into one 512-bit pipe, and
    Xeon Scalable adds a second 512-bit FMA on port 5 (all SKUs from Ice Lake-SP on).
    Checked on a 2-core EPYC (family 25, model 17: Zen 4) with an assembly loop
    timed against a chain of dependent adds: 1 zmm vfmadd231ps, 2 ymm vfmadd231ps, 1 zmm
    vpdpbusd and 1 zmm vdpbf16ps per cycle, i.e. 32 / 128 / 64 ops per cycle as computed here.
    """
    avx512, avx2 = "avx512f" in flags, {"avx2", "fma"} <= flags
    name = model_name or ""
    if vendor == "AuthenticAMD" and family == 26:  # 0x1A: Zen 5
        mobile = "Ryzen AI" in name and "Max" not in name  # Strix Halo (Ryzen AI Max) has the full width
        if not name or mobile:
            return Microarchitecture("AMD Zen 5 (256-bit datapath)", 512,
                                     "mobile Zen 5 (Strix/Krackan Point) keeps 2 x 256-bit FMA pipes" if mobile else
                                     "Zen 5 of unknown kind: assumed the mobile 2 x 256-bit FMA pipes (conservative; "
                                     "desktop and server parts have 2 x 512-bit)")
        return Microarchitecture("AMD Zen 5", 1024, "2 x 512-bit FMA pipes (native 512-bit datapath)")
    if vendor == "AuthenticAMD" and family == 25:  # 0x19: Zen 3, or Zen 4 when it has AVX-512
        if avx512:
            return Microarchitecture("AMD Zen 4", 512, "2 x 256-bit FMA pipes; a 512-bit op occupies both (double-pumped)")
        return Microarchitecture("AMD Zen 3", 512, "2 x 256-bit FMA pipes")
    if vendor in ("AuthenticAMD", "HygonGenuine") and family in (23, 24):  # 0x17 Zen/Zen+/Zen 2; 0x18 Hygon (Zen)
        if vendor == "AuthenticAMD" and model is not None and model >= 0x30:
            return Microarchitecture("AMD Zen 2", 512, "2 x 256-bit FMA pipes")
        return Microarchitecture("AMD Zen / Zen+", 256, "2 x 128-bit FMA pipes; a 256-bit op occupies both")
    if vendor == "GenuineIntel" and avx512:
        if model in INTEL_TWO_FMA512 or "amx_tile" in flags:
            return Microarchitecture("Intel Xeon (Ice Lake-SP or later)", 1024, "2 x 512-bit FMA units (ports 0+1 fused, and port 5)")
        if model == INTEL_SKYLAKE_SP:
            return Microarchitecture("Intel Skylake-SP / Cascade Lake / Cooper Lake", 512,
                                     "one or two 512-bit FMA units by SKU (two on most Xeon Gold 6xxx / Platinum); "
                                     "assumed one (conservative)")
        return Microarchitecture("Intel AVX-512 client core", 512, "one 512-bit FMA pipe (ports 0+1 fused)")
    if vendor == "GenuineIntel" and avx2:
        return Microarchitecture("Intel AVX2 core", 512, "2 x 256-bit FMA pipes (Haswell and later P-cores; E-cores have half)")
    # An unknown vendor or family: the narrowest implementation of the ISA it reports.
    if avx512:
        return Microarchitecture("unknown AVX-512 core", 512,
                                 "unknown microarchitecture: assumed one 512-bit FMA per cycle, the narrowest AVX-512 "
                                 "implementation (conservative; two-FMA Xeons and Zen 5 do twice that)")
    if avx2:
        return Microarchitecture("unknown AVX2 core", 256,
                                 "unknown microarchitecture: assumed 2 x 128-bit FMA pipes, the narrowest AVX2 implementation "
                                 "(conservative; most do 2 x 256-bit)")
    if "asimd" in flags:
        return Microarchitecture("Arm core with NEON", 128, "assumed one 128-bit NEON FMA pipe (conservative; many have 2 to 4)")
    return Microarchitecture("x86 core without FMA", 128, "SSE: one 128-bit multiply and one 128-bit add pipe")


def theoretical_peaks(flags: list[str], cores: int, ghz: float | None, vendor: str | None = None, family: int | None = None,
                      *, model: int | None = None, model_name: str | None = None, clock_source: str | None = None) -> dict[str, Any]:
    """Cores x clock x operations per cycle per core, per precision, with the basis of each figure.

    Returns ``{"fp32": {"gflops", "per_cycle", "basis"}, "bf16": {...}, "int8": {...}, "cores",
    "ghz", "core", "basis"}``: ``per_cycle`` is operations per cycle per core (a multiply-add
    counts 2), ``gflops`` is None when the clock is unknown or the precision has no native
    instructions (the basis says why). Vector widths are in bits: W-bit vectors hold W/32
    fp32/int32 lanes.
    """
    flagset = set(flags)
    core = microarchitecture(flagset, vendor, family, model, model_name)
    lanes = core.fma_bits // 32  # 32-bit multiply-add lanes per cycle per core (Zen 4: 512 / 32 = 16)
    peaks: dict[str, Any] = {}

    # fp32: each lane does one fused multiply-add = 2 FLOPs (vfmadd231ps).
    if {"avx2", "fma"} <= flagset or "avx512f" in flagset or "asimd" in flagset:
        peaks["fp32"] = (lanes * 2, f"{core.fma_bits} FMA bits/cycle = {lanes} fp32 lanes x 2 (FMA)")
    else:
        peaks["fp32"] = (8, "4 fp32 lanes x (1 multiply + 1 add) per cycle, no FMA")

    # bf16: AMX tiles when present; else vdpbf16ps, 2 bf16 multiply-adds into each 32-bit lane = 4 FLOPs.
    if "amx_bf16" in flagset:
        peaks["bf16"] = (1024, "AMX TMUL: 1024 bf16 FLOPs/cycle/core (Intel, Sapphire Rapids)")
    elif "avx512_bf16" in flagset:
        peaks["bf16"] = (lanes * 4, f"vdpbf16ps: {lanes} lanes x 2 multiply-adds x 2, assumed at the FMA pipes' rate (as on Zen 4)")
    else:
        peaks["bf16"] = (None, "no native bf16 dot product (avx512_bf16 / amx_bf16): bf16 GEMMs widen to fp32, "
                               "so the fp32 figure bounds them")

    # int8: AMX tiles; else vpdpbusd (VNNI), 4 u8 x s8 multiply-adds into each 32-bit lane = 8 ops;
    # else vpmaddubsw + vpmaddwd, two multiply instructions for the same 4 multiply-adds: half.
    if "amx_int8" in flagset:
        peaks["int8"] = (2048, "AMX TMUL: 2048 int8 ops/cycle/core (Intel, Sapphire Rapids)")
    elif "avx512_vnni" in flagset and "avx512f" in flagset:
        peaks["int8"] = (lanes * 8, f"vpdpbusd (AVX512-VNNI): {lanes} lanes x 4 multiply-adds x 2, at the FMA pipes' rate")
    elif "avx_vnni" in flagset:
        narrow = min(lanes, 16)  # VEX-encoded VNNI is 256 bits wide: at most 2 x 8 lanes per cycle
        peaks["int8"] = (narrow * 8, f"vpdpbusd (AVX-VNNI, 256-bit): {narrow} lanes x 4 multiply-adds x 2")
    elif "avx512bw" in flagset or "avx2" in flagset:
        width = lanes if "avx512bw" in flagset else min(lanes, 16)
        peaks["int8"] = (width * 4, f"no VNNI: vpmaddubsw + vpmaddwd, 2 instructions per 4 multiply-adds per lane: {width} lanes x 4 "
                                    "(and vpmaddubsw saturates at int16)")
    else:
        peaks["int8"] = (None, "no x86 int8 dot-product instructions modelled for these flags")

    result: dict[str, Any] = {}
    for precision, (per_cycle, how) in peaks.items():
        gflops = cores * ghz * per_cycle if per_cycle is not None and ghz else None
        basis = how if per_cycle is None else f"{cores} cores x {_ghz(ghz)} x {per_cycle} ops/cycle/core; {how}"
        result[precision] = {"gflops": gflops, "per_cycle": per_cycle, "basis": basis}
    clock = f"clock {_ghz(ghz)} from {clock_source}" if clock_source else f"clock {_ghz(ghz)}"
    result.update(cores=cores, ghz=ghz, core=core.name,
                  basis=f"{core.name}: {core.why}; {clock}" + ("" if ghz else " (unknown: no GFLOP/s figures)"))
    return result


def _ghz(ghz: float | None) -> str:
    return f"{ghz:.2f} GHz" if ghz else "? GHz"


def cpu_clock(max_freq_path: Path | str = CPUFREQ_MAX, cpuinfo_path: Path | str = PROC_CPUINFO) -> tuple[float | None, str]:
    """The core clock in GHz and where it came from: cpufreq's maximum, else /proc/cpuinfo.

    ``cpuinfo_max_freq`` (kHz) is the highest clock the kernel may set, turbo included. Without
    cpufreq (a VM) "cpu MHz" is the current clock on bare metal and usually the nominal one in
    a VM, where the real core may boost higher; Intel's model name also states the nominal clock.
    (An EPYC VM measured here says 2.60 GHz; a dependent-add loop runs there at 3.66 GHz.)
    """
    try:
        khz = float(Path(max_freq_path).read_text().strip())
        if khz > 0:
            return khz / 1e6, f"{max_freq_path} (maximum, turbo included)"
    except (OSError, ValueError):
        pass
    try:
        text = Path(cpuinfo_path).read_text(errors="replace")
    except OSError:
        return None, "nowhere (no cpufreq, no /proc/cpuinfo)"
    mhz = [float(m) for m in re.findall(r"^cpu MHz\s*:\s*([0-9.]+)", text, flags=re.M)]
    if mhz and max(mhz) > 0:
        return max(mhz) / 1e3, f"{cpuinfo_path} 'cpu MHz' (current or, in a VM, nominal clock; boost may be higher)"
    stated = re.search(r"^model name\s*:.*@\s*([0-9.]+)\s*GHz", text, flags=re.M)
    if stated:
        return float(stated.group(1)), f"{cpuinfo_path} model name (nominal clock; boost may be higher)"
    return None, f"nowhere ({max_freq_path} and {cpuinfo_path} give no clock)"


def cpu_clock_ghz(max_freq_path: Path | str = CPUFREQ_MAX, cpuinfo_path: Path | str = PROC_CPUINFO) -> float | None:
    """The core clock in GHz (see :func:`cpu_clock`), or None when nothing states it."""
    return cpu_clock(max_freq_path, cpuinfo_path)[0]


def cpu_identity(cpuinfo_path: Path | str = PROC_CPUINFO) -> dict[str, Any]:
    """Vendor, family, model number and model name of the first CPU in ``/proc/cpuinfo`` (None where absent).

    ``compress.core.hardware.cpu_info`` gives the name, flags and cores but not the vendor and
    family, which decide the microarchitecture. A VM reports what its hypervisor chooses.
    """
    found: dict[str, Any] = {"vendor": None, "family": None, "model": None, "model_name": None}
    keys = {"vendor_id": "vendor", "cpu family": "family", "model": "model", "model name": "model_name"}
    try:
        text = Path(cpuinfo_path).read_text(errors="replace")
    except OSError:
        return found
    for line in text.splitlines():
        if not line.strip() and any(v is not None for v in found.values()):
            break  # the end of the first processor's block
        key, _, value = (part.strip() for part in line.partition(":"))
        if key in keys and found[keys[key]] is None:
            found[keys[key]] = int(value) if key in ("cpu family", "model") and value.isdigit() else value
    return found


def cpu_theoretical_peaks(cores: int | None = None) -> dict[str, Any]:
    """:func:`theoretical_peaks` of this machine, on ``cores`` cores (default: its usable physical cores)."""
    info, identity = cpu_info(), cpu_identity()
    ghz, source = cpu_clock()
    cores = cores or max(1, min(info["physical_cores"], info["usable_cores"]))
    return theoretical_peaks(info["flags"], cores, ghz, identity["vendor"], identity["family"], model=identity["model"],
                             model_name=identity["model_name"], clock_source=source)


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
