"""Which kernels, on which instruction set, a backend's matrix multiplications ran on, as its library reports them.

``kernels_used(runtime, run, precision, compiled=None)`` is called once per model inside the
latency worker that timed it, after the timing (it runs the model once more), and returns a
JSON-able record::

    {"runtime": "torch", "summary": "MKL SGEMM x14 (...); ATen AVX2", "isa": "avx2",
     "reported": True, "detail": {...}, "note": None}

How each runtime tells (``reported``: from the library's own output, else inferred):

- torch (``torch-fbgemm`` for dynamic int8 Linears): one forward with oneDNN verbose (``torch.backends.mkldnn.verbose``, as ``ONEDNN_VERBOSE=1``;
  lines name the implementation, e.g. ``brg:avx512_core_amx``, ``jit:avx2``) and MKL verbose
  on (fp32 GEMMs go to MKL's SGEMM; its banner names the code path on Intel CPUs only), their
  C-level stdout captured; ``torch.backends.cpu.get_cpu_capability()`` names ATen's own
  vectorised kernels (``AVX2``, ``AVX512``), which run a product neither library ran. Dynamic
  int8 Linears run fbgemm, which reports nothing: it is inferred from the flags.
- onnxruntime: MLAS picks its kernels by cpuid and reports nothing: "MLAS (by cpuid: ...)",
  inferred from the flags as MLAS's dispatch (``mlas/lib/platform.cpp``) does.
- openvino: the compiled model's runtime graph gives each layer's ``primitiveType`` (e.g.
  ``brgemm_avx512_amx``, ``jit_avx2_f32``, ``gemm_mlas_f32``) and ``runtimePrecision``; the
  compiled model its ``INFERENCE_PRECISION_HINT`` (what it really ran: bf16 where the plugin
  chose it) and the device its ``OPTIMIZATION_CAPABILITIES``.

``note`` says when the CPU has a matrix unit (AMX, AVX512_BF16, VNNI) for the row's precision
that the reported kernels did not use.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import sys
import tempfile
from collections import Counter
from typing import Any, Callable

import torch

from compress.core.hardware import cpu_info
from compress.core.registry import Registry
from compress.core.formats.openvino_runtime import inference_precision, openvino_capabilities

# A probe: (run, precision, compiled) -> record; ``run`` does one forward pass, ``compiled`` is an OpenVINO compiled model.
PROBES: Registry[Callable[..., dict[str, Any]]] = Registry("kernel probe")

MATMUL_LAYERS = ("FullyConnected", "MatMul", "Gemm", "ScaledAttn")  # (attention fused in a Subgraph is not listed)
ONEDNN_MATRIX = ("matmul", "inner_product", "convolution")  # oneDNN primitive kinds that multiply matrices
ATEN_ISAS = {"AVX2": "avx2", "AVX512": "avx512", "ZVECTOR": "zvector", "SVE256": "sve"}  # get_cpu_capability() -> ISA  # OpenVINO runtime layer types that multiply matrices

# ISA names as the libraries spell them, most capable first: the first found in a kernel's name is its ISA.
ISA_NAMES = (("amx", "amx"), ("avx512", "avx512"), ("avx2_vnni", "avx_vnni"), ("avx2", "avx2"), ("avx", "avx"),
             ("sse4", "sse4"))
# How capable each ISA's matrix kernels are, to tell when a unit the CPU has went unused.
ISA_RANK = {"amx": 3, "avx512": 2, "avx512_bf16": 2, "avx512_vnni": 2, "avx_vnni": 1, "avx2": 1, "avx": 0, "sse4": 0}
# MKL's verbose banner on Intel CPUs: "for Intel(R) 64 architecture Intel(R) Advanced Vector Extensions 2 (...) enabled
# processors"; elsewhere (AMD) "Intel(R) Architecture processors", which names no code path.
MKL_ISAS = (("Advanced Matrix Extensions", "amx"), ("AVX-512", "avx512"), ("Advanced Vector Extensions 512", "avx512"),
            ("Advanced Vector Extensions 2", "avx2"), ("AVX2", "avx2"))


def kernels_used(runtime: str, run: Callable[[], Any], precision: str, compiled: Any = None) -> dict[str, Any]:
    """The kernels ``runtime`` ran ``precision`` (fp32 / bf16 / int8) matrix multiplications on (module docstring).

    Never raises: a probe that fails is a record saying so (the timing it follows stands).
    """
    try:
        record = PROBES.get(runtime)(run, precision, compiled)
    except Exception as err:  # a library's reporting must never cost the measurement
        return {"runtime": runtime, "summary": f"unknown (probe failed: {type(err).__name__}: {err})", "isa": None,
                "reported": False, "detail": {}, "note": None}
    record["note"] = missed_unit(cpu_info()["flags"], precision, record)
    return record


# ---------------------------------------------------------------------------- parsing what libraries print


def parse_onednn_verbose(text: str) -> Counter:
    """``(primitive kind, implementation)`` -> executions, from oneDNN verbose lines.

    Both layouts: ``onednn_verbose,v1,primitive,exec,cpu,matmul,brg:avx512_core_amx,...`` (v3)
    and ``onednn_verbose,exec,cpu,inner_product,gemm:jit,...`` / ``dnnl_verbose,...`` (v2).
    """
    found: Counter = Counter()
    for line in text.splitlines():
        fields = line.strip().split(",")
        if not fields or fields[0] not in ("onednn_verbose", "dnnl_verbose") or "exec" not in fields[:4]:
            continue
        at = fields.index("exec") + 1  # then the engine (cpu), the primitive kind, the implementation
        if len(fields) > at + 2 and fields[at] == "cpu":
            found[fields[at + 1], fields[at + 2]] += 1
    return found


def parse_mkl_verbose(text: str) -> tuple[Counter, str | None]:
    """MKL verbose: function -> calls (``SGEMM``), and the banner's code path (``"avx2"``; None when it names none)."""
    calls: Counter = Counter()
    isa = None
    for line in text.splitlines():
        if not line.startswith("MKL_VERBOSE"):
            continue
        call = re.match(r"MKL_VERBOSE\s+([A-Z][A-Z0-9_]*)\(", line)
        if call:
            calls[call.group(1)] += 1
        elif " for " in line and isa is None:  # the banner
            isa = next((ours for phrase, ours in MKL_ISAS if phrase in line), None)
    return calls, isa


def isa_of(kernel: str) -> str | None:
    """The instruction set a kernel's name states (``brg:avx512_core_amx`` -> amx, ``jit_avx2_f32`` -> avx2), or None."""
    name = kernel.lower()
    return next((ours for theirs, ours in ISA_NAMES if theirs in name), None)


def best_isa(kernels: list[str]) -> str | None:
    """The most capable ISA among kernel names (what the GEMMs that matter ran on)."""
    found = {isa_of(k) for k in kernels} - {None}
    return next((ours for _, ours in ISA_NAMES if ours in found), None)


def run_capturing_stdout(run: Callable[[], Any], fd: int = 1) -> str:
    """What ``run()`` wrote to the process's stdout (file descriptor 1, where C libraries print; ``fd=2``: stderr,
    where CTranslate2 logs), as text."""
    libc = ctypes.CDLL(None)
    sys.stdout.flush()
    sys.stderr.flush()
    libc.fflush(None)  # C stdio buffers: written before the switch, then what run() printed, before the switch back
    saved = os.dup(fd)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), fd)
        try:
            run()
        finally:
            libc.fflush(None)
            os.dup2(saved, fd)
            os.close(saved)
        tmp.seek(0)
        return tmp.read().decode(errors="replace")


# ---------------------------------------------------------------------------- the probes


@PROBES.register("torch")
def torch_kernels(run: Callable[[], Any], precision: str, compiled: Any = None) -> dict[str, Any]:
    """One forward under oneDNN and MKL verbose; ATen's CPU capability; fbgemm inferred for dynamic int8."""
    def verbose_run():
        with contextlib.ExitStack() as stack:  # each library's verbose mode where the build has it (not MKL on Arm)
            if torch.backends.mkldnn.is_available():
                stack.enter_context(torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON))
            if torch.backends.mkl.is_available():
                stack.enter_context(torch.backends.mkl.verbose(torch.backends.mkl.VERBOSE_ON))
            run()

    text = run_capturing_stdout(verbose_run)
    onednn = parse_onednn_verbose(text)
    mkl, mkl_isa = parse_mkl_verbose(text)
    aten = torch.backends.cpu.get_cpu_capability()  # ATen's own kernels: "AVX2", "AVX512", "DEFAULT"
    matrix = {(kind, impl): n for (kind, impl), n in onednn.most_common() if kind in ONEDNN_MATRIX}
    parts = [f"oneDNN {kind} {impl} x{n}" for (kind, impl), n in matrix.items()]
    parts += [f"MKL {fn} x{n}" + ("" if mkl_isa else " (MKL names no code path on this CPU)") for fn, n in mkl.most_common()]
    isa = best_isa([impl for _, impl in matrix]) or mkl_isa  # None: the GEMM library names no instruction set
    if not parts:  # neither oneDNN nor MKL ran a product: ATen's own kernels did, at the capability it reports
        parts, isa = [f"ATen's own kernels ({aten})"], ATEN_ISAS.get(aten)
    else:
        parts.append(f"ATen {aten}")
    return {"runtime": "torch", "summary": "; ".join(parts), "isa": isa, "reported": True,
            "detail": {"onednn": {f"{k} {i}": n for (k, i), n in onednn.items()}, "mkl": dict(mkl), "mkl_isa": mkl_isa,
                       "aten_capability": aten, "quantized_engine": torch.backends.quantized.engine}}


@PROBES.register("torch-fbgemm")
def fbgemm_kernels(run: Callable[[], Any], precision: str, compiled: Any = None) -> dict[str, Any]:
    """Dynamic int8 Linears (torch.ao): fbgemm, which picks its kernels by cpuid and says nothing, so inferred."""
    record = torch_kernels(run, precision)
    if any(key.split(" ")[0] in ONEDNN_MATRIX for key in record["detail"]["onednn"]):
        return record  # the quantized engine ran them in oneDNN, which reported
    isa = fbgemm_isa(set(cpu_info()["flags"]))
    return {**record, "runtime": "torch-fbgemm", "isa": isa, "reported": False,
            "summary": f"fbgemm (by cpuid: {isa}; inferred); ATen {record['detail']['aten_capability']}"}


def fbgemm_isa(flags: set[str]) -> str:
    """fbgemm's int8 kernel set for these flags (its ``fbgemmHasAvx512VnniSupport`` / ``Avx512`` / ``Avx2`` checks)."""
    if {"avx512_vnni", "avx512bw"} <= flags:
        return "avx512_vnni"
    if "avx512bw" in flags:
        return "avx512"
    return "avx2" if "avx2" in flags else "reference (no AVX2)"


def mlas_kernels(flags: set[str], precision: str) -> tuple[str, str]:
    """The MLAS GEMM kernel ONNX Runtime's cpuid dispatch (``mlas/lib/platform.cpp``) picks for these flags, and its ISA."""
    if precision == "int8":  # MlasGemmU8S8Dispatch*: u8 activations x s8 weights
        choices = (("amx_int8", "U8S8 AMX", "amx"), ("avx512_vnni", "U8S8 AVX512-VNNI", "avx512_vnni"),
                   ("avx_vnni", "U8S8 AVX-VNNI", "avx_vnni"), ("avx512bw", "U8S8 AVX512 core", "avx512"),
                   ("avx2", "U8S8 AVX2", "avx2"))
        fallback = ("U8S8 SSE4.1", "sse4")
    else:  # MlasGemmFloatKernel*
        choices = (("avx512f", "SGEMM AVX512F", "avx512"), ("fma", "SGEMM FMA3", "avx2"), ("avx", "SGEMM AVX", "avx"))
        fallback = ("SGEMM SSE", "sse4")
    return next(((kernel, isa) for flag, kernel, isa in choices if flag in flags), fallback)


@PROBES.register("onnxruntime")
def onnxruntime_kernels(run: Callable[[], Any], precision: str, compiled: Any = None) -> dict[str, Any]:
    """MLAS by cpuid: ONNX Runtime reports no kernel choice, so this is inferred from the flags."""
    kernel, isa = mlas_kernels(set(cpu_info()["flags"]), precision)
    return {"runtime": "onnxruntime", "summary": f"MLAS {kernel} (by cpuid; inferred: ONNX Runtime reports no kernels)",
            "isa": isa, "reported": False, "detail": {"mlas": kernel}}


@PROBES.register("openvino")
def openvino_kernels(run: Callable[[], Any], precision: str, compiled: Any = None) -> dict[str, Any]:
    """The compiled model's matrix-multiply primitives and runtime precisions, its inference precision, the CPU's capabilities."""
    run()  # a dynamic-shape model picks its primitives on execution: the runtime graph then names them
    layers = matmul_primitives(compiled.get_runtime_model())
    ran = inference_precision(compiled)
    capabilities = list(openvino_capabilities())
    kinds = ", ".join(f"{layer} {primitive} ({runtime}) x{n}" for (layer, primitive, runtime), n in layers.most_common())
    return {"runtime": "openvino",
            "summary": f"{kinds or 'no matrix-multiply layers'}; inference precision {ran}; "
                       f"CPU capabilities {', '.join(capabilities)}",
            "isa": best_isa([primitive for _, primitive, _ in layers]), "reported": True, "inference_precision": ran,
            "detail": {"primitives": {" ".join(k): n for k, n in layers.items()}, "capabilities": capabilities}}


# CTranslate2's log at its first model load in a process: "[info]  - Selected ISA: AVX2", "- SGEMM backend: DNNL
# (packed: false)", "- GEMM_S8 backend: DNNL (packed: false, u8s8 preferred: true)", "- Selected compute type: ...".
CT2_LOG = re.compile(r"- (Selected ISA|Use Intel MKL|SGEMM backend|GEMM_S8 backend|Selected compute type): ([^\n]+)")


@PROBES.register("ctranslate2")
def ctranslate2_kernels(run: Callable[[], Any], precision: str, compiled: Any = None) -> dict[str, Any]:
    """CTranslate2's own report (``compiled``: its log at the model's load, which the latency backend keeps): the
    instruction set of its own kernels and the GEMM library of the row's precision (MKL on Intel CPUs, else oneDNN,
    which picks its kernels by cpuid and says nothing here: no ISA is claimed for the products)."""
    found = dict(CT2_LOG.findall(compiled or ""))
    if "Selected ISA" not in found:
        return {"runtime": "ctranslate2", "isa": None, "reported": False, "detail": {},
                "summary": "unknown (CTranslate2 logs its kernels at the first model load of a process only)"}
    gemm = "GEMM_S8" if precision == "int8" else "SGEMM"
    library = found.get(f"{gemm} backend", "?").split(" (")[0]
    summary = (f"CTranslate2 {gemm} on {library}; its own kernels {found['Selected ISA']}; "
               f"compute type {found.get('Selected compute type', '?')}")
    return {"runtime": "ctranslate2", "summary": summary, "isa": None, "reported": True,
            "detail": {key: value.strip() for key, value in found.items()}}


def matmul_primitives(runtime_model) -> Counter:
    """``(layer type, primitiveType, runtimePrecision)`` -> layers, for the matrix multiplications of an OpenVINO runtime graph."""
    found: Counter = Counter()
    for op in runtime_model.get_ops():
        info = op.get_rt_info()
        layer = info["layerType"].astype(str)
        if layer in MATMUL_LAYERS:
            found[layer, info["primitiveType"].astype(str), info["runtimePrecision"].astype(str).lower()] += 1
    return found


# ---------------------------------------------------------------------------- units left unused


# The matrix units a precision can use: (the flag that has it, the ISA its kernels name).
UNITS = {"bf16": (("amx_bf16", "amx"), ("avx512_bf16", "avx512_bf16")),
         "int8": (("amx_int8", "amx"), ("avx512_vnni", "avx512_vnni"), ("avx_vnni", "avx_vnni"))}


def missed_unit(flags: list[str] | set[str], precision: str, record: dict[str, Any]) -> str | None:
    """A note when the CPU has a matrix unit for ``precision`` that the reported kernels fall short of, else None.

    Only for reported kernels whose names state an ISA, and by ISA family (AMX above AVX-512
    above AVX2): kernel names do not always say bf16 or VNNI within AVX-512.
    """
    if not record.get("reported") or not record.get("isa"):
        return None
    used = ISA_RANK.get(record["isa"], 0)
    for flag, isa in UNITS.get(precision, ()):
        if flag in set(flags) and used < ISA_RANK[isa]:
            return f"this CPU has {flag} but the {precision} kernels ran on {record['isa']}"
    return None
