"""What machine and software a result was produced on (for provenance and latency headers), and which precisions
its CPU runs natively (:class:`Precisions`, read by every stage that picks bf16, AMX or VNNI kernels)."""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import psutil
import torch

from compress.core.cpu_peaks import identify

# Instruction-set flags that decide which int8/bf16 kernels a CPU can use.
INTERESTING_FLAGS = (
    "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16",
    "amx_tile", "amx_bf16", "amx_int8", "asimd", "asimddp", "sve", "i8mm", "bf16",
)

CPUINFO = Path("/proc/cpuinfo")
ARM_ARCHES = ("arm64", "aarch64")  # platform.machine() of a 64-bit ARM CPU (macOS, Linux)

PACKAGES = (
    "torch", "transformers", "tokenizers", "datasets", "accelerate", "optimum", "optimum-onnx",
    "onnxruntime", "onnx", "openvino", "nncf", "neural-compressor-pt", "torch-pruning", "safetensors", "numpy",
    "ctranslate2",  # compress export --format ctranslate2 (the ctranslate2 extra)
    "model2vec", "skeletoken",  # distill-static (the static extra)
)


@functools.lru_cache(maxsize=1)
def cpu_info() -> dict:
    """CPU model, its microarchitecture, core counts, memory and the relevant instruction-set flags."""
    name, flags, physical, generation = platform.processor() or platform.machine(), set(), set(), None
    text = CPUINFO.read_text(errors="replace") if CPUINFO.exists() else ""
    if text:
        parsed = parse_cpuinfo(text)
        name, flags, physical, generation = parsed["name"] or name, parsed["flags"], parsed["physical"], parsed["generation"]
    core = identify(text)  # e.g. "Zen 4" (core "AMD Zen 4"); "unknown" (core "unknown AVX2 core")
    logical = os.cpu_count() or 1
    memory_gib = round(psutil.virtual_memory().total / 2**30, 1)
    physical_count = psutil.cpu_count(logical=False) or len(physical) or logical
    try:
        available = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        available = logical
    return {
        "cpu": name,
        "arch": platform.machine(),
        "logical_cores": logical,
        "physical_cores": physical_count,
        "usable_cores": available,
        "memory_gib": memory_gib,
        "flags": sorted(f for f in INTERESTING_FLAGS if f in flags),
        "generation": generation,
        "microarchitecture": core.name,
        "core": core.core,
    }


@dataclass(frozen=True)
class Precisions:
    """Which precisions this CPU runs natively: the one answer every stage reads (this module alone tests the flags).

    What a runtime then actually ran is its own report (a latency row's and an export's ``inference_precision``);
    OpenVINO's word on its bf16 kernels is ``compress.core.formats.openvino_runtime.openvino_bf16``.
    """

    bf16: bool  # native bf16 dot products: AVX512_BF16 or AMX-BF16 (x86), FEAT_BF16 (ARM's "bf16")
    amx_bf16: bool  # AMX tile products in bf16 (TDPBF16PS): Sapphire Rapids and later
    amx_int8: bool  # AMX tile products in int8 (TDPBUSD)
    vnni: bool  # one-instruction int8 dot products on x86: AVX512-VNNI or AVX-VNNI
    int8_preset: str  # ONNX Runtime's quantization preset: avx512_vnni (int8 weights), avx2 (uint8 weights), arm64
    arch: str  # platform.machine(), e.g. x86_64, aarch64
    source: str  # what it was read from: "/proc/cpuinfo flags", "no /proc/cpuinfo (no flags)" or "given flags"

    @classmethod
    def from_flags(cls, flags: Iterable[str], arch: str, source: str = "given flags") -> Precisions:
        """The record for a CPU with these instruction-set flags (``/proc/cpuinfo`` spelling) and architecture."""
        flags, arm = set(flags), arch.lower() in ARM_ARCHES
        # ONNX Runtime's preset follows AVX512-VNNI alone: avx2's uint8 weights run 3x slower where it exists.
        preset = "arm64" if arm else "avx512_vnni" if "avx512_vnni" in flags else "avx2"
        return cls(bf16=bool({"avx512_bf16", "amx_bf16"} & flags) or (arm and "bf16" in flags),
                   amx_bf16="amx_bf16" in flags, amx_int8="amx_int8" in flags,
                   vnni=not arm and bool({"avx512_vnni", "avx_vnni"} & flags),
                   int8_preset=preset, arch=arch, source=source)


@functools.lru_cache(maxsize=1)
def precisions() -> Precisions:
    """This CPU's :class:`Precisions`, read once per process from :func:`cpu_info`'s flags."""
    info = cpu_info()
    source = "/proc/cpuinfo flags" if CPUINFO.exists() else "no /proc/cpuinfo (no flags)"
    return Precisions.from_flags(info["flags"], info["arch"], source)


def cpu_summary() -> dict:
    """What a benchmark's header records of the CPU with every figure: model, microarchitecture, cores, flags."""
    info = cpu_info()
    # The model name with its microarchitecture ("AMD EPYC (Zen 4)"): a VM names Zen 4 and Zen 5 alike, and every
    # header that prints "cpu" then says which it was.
    named = f"{info['cpu']} ({info['microarchitecture']})" if info["microarchitecture"] != "unknown" else info["cpu"]
    return {"cpu": named, "microarchitecture": info["microarchitecture"], "generation": info["generation"],
            "cores": info["usable_cores"], "flags": info["flags"]}


def parse_cpuinfo(text: str) -> dict:
    """``/proc/cpuinfo`` as {"name", "flags", "physical" (core ids), "generation"}: the x86 family, model and stepping
    (``"family 26 model 2 stepping 1"``), which tell apart CPUs a virtual machine names alike ("AMD EPYC" is
    Zen 4 or Zen 5, whose AVX-512 is twice as wide), or None where the file has no family."""
    name, flags, physical, ids, core_key = None, set(), set(), {}, None
    for line in text.splitlines():
        key, _, value = (part.strip() for part in line.partition(":"))
        if key == "model name":
            name = value
        elif key in ("flags", "Features"):
            flags.update(value.split())
        elif key == "physical id":
            core_key = value
        elif key == "core id":
            physical.add((core_key, value))
        elif key in ("cpu family", "model", "stepping"):
            ids.setdefault(key, value)
    generation = (f"family {ids['cpu family']} model {ids.get('model', '?')} stepping {ids.get('stepping', '?')}"
                  if "cpu family" in ids else None)
    return {"name": name, "flags": flags, "physical": physical, "generation": generation}


def gpu_info() -> list[str]:
    try:
        if torch.cuda.is_available():
            return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception:  # pragma: no cover - a broken CUDA install must not stop provenance
        pass
    return []


def hardware() -> dict:
    info = dict(cpu_info())
    info["gpus"] = gpu_info()
    info["os"] = f"{platform.system()} {platform.release()}"
    info["python"] = platform.python_version()
    return info


@functools.lru_cache(maxsize=1)
def package_versions() -> dict[str, str]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    try:
        versions["compress"] = metadata.version("compress")
    except metadata.PackageNotFoundError:
        pass
    return versions


@functools.lru_cache(maxsize=1)
def git_revision() -> str | None:
    """The toolkit's git commit (with ``+dirty`` for local changes), when run from a checkout."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        rev = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (rev + ("+dirty" if dirty else "")) if rev else None
