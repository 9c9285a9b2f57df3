"""The CPU's microarchitecture and its theoretical matrix-multiply peak per precision, on paper.

``cpu_peaks(cores)`` reads ``/proc/cpuinfo`` (vendor, family, model, stepping, flags) and the
clock, names the microarchitecture (:func:`microarchitecture`) and returns cores x clock x
operations per cycle per core for fp32, bf16 and int8 (:func:`theoretical_peaks`), each with
the basis of its figure. It reads files only: no torch, no measurement (``compress.eval.latency.peak``
measures; ``compress.core.hardware`` names the microarchitecture in every provenance record).

Operations per cycle per core = the core's multiply-add datapath (FMA pipes x their width, in
bits, from :data:`the core table <microarchitecture>`) / 32 bits per lane x the operations
one instruction does per 32-bit lane (:data:`LANE_OPS`); AMX tiles have their own figure
(:data:`AMX_OPS`). A multiply-add counts 2 operations. Per core, per cycle:

==============================================  =====  =====  =========
core (FMA datapath)                              fp32   bf16   int8
==============================================  =====  =====  =========
Zen 1, Zen+ (2 x 128-bit)                          16      -     32
Zen 2, Zen 3 (2 x 256-bit)                         32      -     64
Zen 4 (2 x 256-bit; 512-bit ops double-pumped)     32     64    128
Zen 5 server / desktop (2 x 512-bit)               64    128    256
Skylake-SP (1 or 2 x 512-bit)                   32/64      -  64/128
Cascade Lake (VNNI), Cooper Lake (+ bf16)       32/64  64/128  128/256
Ice Lake-SP (2 x 512-bit, VNNI)                    64      -    256
Sapphire / Emerald / Granite Rapids (AMX)          64   1024   2048
==============================================  =====  =====  =========

(int8 without VNNI counts vpmaddubsw + vpmaddwd; "-": no native bf16 dot product, bf16 GEMMs
widen to fp32.)
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PRECISIONS = ("fp32", "bf16", "int8")
PROC_CPUINFO = Path("/proc/cpuinfo")
CPUFREQ_MAX = Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")  # kHz

# Operations per cycle per 32-bit lane of the FMA datapath, by instruction (Intel Intrinsics Guide; each runs on
# the FMA pipes at one per pipe per cycle on every core here, checked on Zen 4 with an assembly loop: 1 zmm
# vfmadd231ps, 1 zmm vpdpbusd and 1 zmm vdpbf16ps per cycle).
LANE_OPS = {
    "fma": 2,  # vfmadd231ps: one fp32 multiply-add per lane
    "vdpbf16ps": 4,  # AVX512_BF16: two bf16 multiply-adds into each fp32 lane
    "vpdpbusd": 8,  # AVX512_VNNI / AVX_VNNI: four u8 x s8 multiply-adds into each int32 lane
    "vpmaddubsw": 4,  # no VNNI: vpmaddubsw + vpmaddwd, two instructions for vpdpbusd's four multiply-adds
}
# One AMX TMUL unit per core (Intel 64 and IA-32 Architectures Optimization Reference Manual, chapter "Intel AMX":
# a TDPBF16PS / TDPBUSD tile product of 16 x 32 x 16 issues every 16 cycles: 1024 bf16 FLOPs and 2048 int8 ops
# per cycle per core on Sapphire Rapids and its successors).
AMX_OPS = {"bf16": 1024, "int8": 2048}


@dataclass(frozen=True)
class Microarchitecture:
    """What one core's vector units multiply-add per cycle, as far as the CPU's identity tells."""

    name: str  # the microarchitecture, e.g. "Zen 4", "Sapphire Rapids"; "unknown" when not recognised
    core: str  # how reports name the core, e.g. "AMD Zen 4", "unknown AVX2 core"
    fma_bits: int  # multiply-add datapath bits per cycle: FMA pipes x width (Zen 4: 2 x 256 = 512)
    why: str  # how that width is known (with its source), or what was assumed


# ---------------------------------------------------------------------------- the core table

# AMD family 0x17 (Zen, Zen+, Zen 2) and 0x19 (Zen 3, Zen 4) model numbers (AMD's "Processor Programming Reference"
# per family; Linux arch/x86 model lists). Zen+ is Zen on 12 nm: the same core.
AMD_ZEN_PLUS = {0x08, 0x18}
AMD_ZEN4_MODELS = (range(0x10, 0x20), range(0x60, 0x80), range(0xA0, 0xB0))  # Genoa, Raphael, Phoenix, Bergamo/Siena
# Zen 5 (0x1A) parts that keep 256-bit FMA pipes: Strix Point (0x20-0x2F) and Krackan Point (0x60-0x6F) mobiles.
AMD_ZEN5_NARROW = (range(0x20, 0x30), range(0x60, 0x70))

# Intel family 6 server models (Intel SDM vol. 4 / Linux intel-family.h); every SKU of these has two 512-bit FMA
# units (ark.intel.com "# of AVX-512 FMA Units": 2).
INTEL_SERVER = {106: "Ice Lake-SP", 108: "Ice Lake-SP", 143: "Sapphire Rapids", 207: "Emerald Rapids",
                173: "Granite Rapids", 174: "Granite Rapids"}
INTEL_SKYLAKE_SP = 85  # Skylake-SP (steppings 0-4), Cascade Lake (5-7), Cooper Lake (10-11)
# Skylake-SP / Cascade Lake SKUs with two 512-bit FMA units (ark.intel.com): Platinum, Gold 6xxx, Xeon W, and
# the Gold 5122 / 5222; Silver, Bronze and the other Gold 5xxx have one.
TWO_FMA_SKUS = re.compile(r"Platinum|Gold 6\d|Gold 5[12]22|Xeon\(R\) W-|Xeon W-")

SOURCES = {
    "Zen 1": "AMD Software Optimization Guide for Family 17h (pub. 55723): 2 x 128-bit FMA pipes",
    "Zen 2": "AMD Software Optimization Guide for Family 17h Models 30h+ (pub. 56305): 2 x 256-bit FMA pipes",
    "Zen 3": "AMD Software Optimization Guide for Family 19h (pub. 56665): 2 x 256-bit FMA pipes",
    "Zen 4": "AMD Software Optimization Guide for Family 19h Models 10h+ (pub. 57647): 2 x 256-bit FMA pipes, a 512-bit "
             "op occupies both (double-pumped)",
    "Zen 5": "AMD Software Optimization Guide for Family 1Ah (pub. 58455): 2 x 512-bit FMA pipes (native 512-bit "
             "datapath)",
    "Zen 5 mobile": "Strix/Krackan Point keep 2 x 256-bit FMA pipes (AMD Zen 5 disclosures, Hot Chips 2024)",
    "Intel server": "Intel Xeon Scalable: 2 x 512-bit FMA units (ports 0+1 fused, and port 5; ark.intel.com)",
}


def microarchitecture(flags: set[str], vendor: str | None, family: int | None, model: int | None,
                      model_name: str | None, stepping: int | None = None) -> Microarchitecture:
    """The core's microarchitecture and multiply-add width per cycle; conservative (and said so) when unknown.

    Vendor, family and model decide; flags break ties a missing model number leaves (a VM may
    hide it) and set the fallback for unknown cores: the narrowest implementation of their ISA.
    """
    found = None
    if vendor in ("AuthenticAMD", "HygonGenuine"):
        found = _amd(flags, vendor, family, model, model_name or "")
    elif vendor == "GenuineIntel" and family == 6:
        found = _intel(flags, model, model_name or "", stepping)
    return found or _unknown(flags, vendor)


def _amd(flags: set[str], vendor: str, family: int | None, model: int | None, name: str) -> Microarchitecture | None:
    avx512 = "avx512f" in flags
    if vendor == "HygonGenuine" or family == 23 and model is not None and model < 0x30:  # 0x17 Zen/Zen+; Hygon Dhyana
        label = "Zen+" if vendor == "AuthenticAMD" and model in AMD_ZEN_PLUS else "Zen 1"
        return Microarchitecture(label, f"AMD {label}", 256, SOURCES["Zen 1"] + "; a 256-bit op occupies both")
    if family == 23:  # models 0x30 and up: Zen 2
        return Microarchitecture("Zen 2", "AMD Zen 2", 512, SOURCES["Zen 2"])
    if family == 25:  # 0x19: Zen 3, or Zen 4 (by model; without one, by AVX-512)
        zen4 = any(model in r for r in AMD_ZEN4_MODELS) if model is not None else avx512
        label = "Zen 4" if zen4 else "Zen 3"
        return Microarchitecture(label, f"AMD {label}", 512, SOURCES[label])
    if family == 26:  # 0x1A: Zen 5
        if model is not None:
            narrow = any(model in r for r in AMD_ZEN5_NARROW)
        else:  # no model number: the name, else assume the narrow (mobile) width
            narrow = not name or ("Ryzen AI" in name and "Max" not in name)  # Strix Halo (Ryzen AI Max) is full width
        if not narrow:
            return Microarchitecture("Zen 5", "AMD Zen 5", 1024, SOURCES["Zen 5"])
        why = SOURCES["Zen 5 mobile"] if name or model is not None else (
            "Zen 5 of unknown kind: assumed the mobile 2 x 256-bit FMA pipes (conservative; desktop and server parts "
            "have 2 x 512-bit)")
        return Microarchitecture("Zen 5", "AMD Zen 5 (256-bit datapath)", 512, why)
    return None


def _intel(flags: set[str], model: int | None, name: str, stepping: int | None) -> Microarchitecture | None:
    if model in INTEL_SERVER or ("amx_tile" in flags and "avx512f" in flags):
        label = INTEL_SERVER.get(model, "unknown")
        core = f"Intel {label}" if label != "unknown" else "Intel Xeon (AMX; model not listed)"
        return Microarchitecture(label, core, 1024, SOURCES["Intel server"])
    if model == INTEL_SKYLAKE_SP:
        label = ("Skylake-SP / Cascade Lake" if stepping is None else "Skylake-SP" if stepping <= 4
                 else "Cascade Lake" if stepping <= 7 else "Cooper Lake")
        if TWO_FMA_SKUS.search(name):
            return Microarchitecture(label, f"Intel {label}", 1024, f"two 512-bit FMA units on {name} (ark.intel.com)")
        return Microarchitecture(label, f"Intel {label}", 512,
                                 "one or two 512-bit FMA units by SKU (two on Platinum / Gold 6xxx, ark.intel.com); "
                                 "assumed one (conservative)")
    if "avx512f" in flags:
        return Microarchitecture("unknown", "Intel AVX-512 client core", 512, "one 512-bit FMA pipe (ports 0+1 fused)")
    if {"avx2", "fma"} <= flags:
        return Microarchitecture("unknown", "Intel AVX2 core", 512,
                                 "2 x 256-bit FMA pipes (Haswell and later P-cores; E-cores have half)")
    return None


def _unknown(flags: set[str], vendor: str | None) -> Microarchitecture:
    """An unknown vendor or family: the narrowest implementation of the ISA it reports."""
    if "avx512f" in flags:
        return Microarchitecture("unknown", "unknown AVX-512 core", 512,
                                 "unknown microarchitecture: assumed one 512-bit FMA per cycle, the narrowest AVX-512 "
                                 "implementation (conservative; two-FMA Xeons and Zen 5 do twice that)")
    if {"avx2", "fma"} <= flags:
        return Microarchitecture("unknown", "unknown AVX2 core", 256,
                                 "unknown microarchitecture: assumed 2 x 128-bit FMA pipes, the narrowest AVX2 "
                                 "implementation (conservative; most do 2 x 256-bit)")
    if "asimd" in flags:
        return Microarchitecture("unknown", "Arm core with NEON", 128,
                                 "assumed one 128-bit NEON FMA pipe (conservative; many have 2 to 4)")
    return Microarchitecture("unknown", "x86 core without FMA", 128, "SSE: one 128-bit multiply and one 128-bit add pipe")


# ---------------------------------------------------------------------------- the peaks


def per_cycle(flags: set[str], core: Microarchitecture) -> dict[str, tuple[int | None, str]]:
    """Operations per cycle per core for each precision, and how: ``{"fp32": (32, "..."), ...}``."""
    lanes = core.fma_bits // 32  # 32-bit multiply-add lanes per cycle per core (Zen 4: 512 / 32 = 16)
    peaks: dict[str, tuple[int | None, str]] = {}
    if {"avx2", "fma"} <= flags or "avx512f" in flags or "asimd" in flags:
        peaks["fp32"] = (lanes * LANE_OPS["fma"], f"{core.fma_bits} FMA bits/cycle = {lanes} fp32 lanes x 2 (FMA)")
    else:
        peaks["fp32"] = (8, "4 fp32 lanes x (1 multiply + 1 add) per cycle, no FMA")

    if "amx_bf16" in flags:
        peaks["bf16"] = (AMX_OPS["bf16"], "AMX TMUL: 1024 bf16 FLOPs/cycle/core (Intel, Sapphire Rapids)")
    elif "avx512_bf16" in flags:
        peaks["bf16"] = (lanes * LANE_OPS["vdpbf16ps"],
                         f"vdpbf16ps: {lanes} lanes x 2 multiply-adds x 2, assumed at the FMA pipes' rate (as on Zen 4)")
    else:
        peaks["bf16"] = (None, "no native bf16 dot product (avx512_bf16 / amx_bf16): bf16 GEMMs widen to fp32, "
                               "so the fp32 figure bounds them")

    if "amx_int8" in flags:
        peaks["int8"] = (AMX_OPS["int8"], "AMX TMUL: 2048 int8 ops/cycle/core (Intel, Sapphire Rapids)")
    elif "avx512_vnni" in flags and "avx512f" in flags:
        peaks["int8"] = (lanes * LANE_OPS["vpdpbusd"],
                         f"vpdpbusd (AVX512-VNNI): {lanes} lanes x 4 multiply-adds x 2, at the FMA pipes' rate")
    elif "avx_vnni" in flags:
        narrow = min(lanes, 16)  # VEX-encoded VNNI is 256 bits wide: at most 2 x 8 lanes per cycle
        peaks["int8"] = (narrow * LANE_OPS["vpdpbusd"], f"vpdpbusd (AVX-VNNI, 256-bit): {narrow} lanes x 4 multiply-adds x 2")
    elif "avx512bw" in flags or "avx2" in flags:
        width = lanes if "avx512bw" in flags else min(lanes, 16)
        peaks["int8"] = (width * LANE_OPS["vpmaddubsw"],
                         f"no VNNI: vpmaddubsw + vpmaddwd, 2 instructions per 4 multiply-adds per lane: {width} lanes "
                         "x 4 (and vpmaddubsw saturates at int16)")
    else:
        peaks["int8"] = (None, "no x86 int8 dot-product instructions modelled for these flags")
    return peaks


def theoretical_peaks(flags: list[str] | set[str], cores: int, ghz: float | None, vendor: str | None = None,
                      family: int | None = None, *, model: int | None = None, model_name: str | None = None,
                      stepping: int | None = None, clock_source: str | None = None) -> dict[str, Any]:
    """Cores x clock x operations per cycle per core, per precision, with the basis of each figure.

    Returns ``{"fp32": {"gflops", "per_cycle", "basis"}, "bf16": {...}, "int8": {...}, "cores",
    "ghz", "core", "microarchitecture", "basis"}``: ``per_cycle`` is operations per cycle per
    core (a multiply-add counts 2), ``gflops`` is None when the clock is unknown or the precision
    has no native instructions (the basis says why).
    """
    flagset = set(flags)
    core = microarchitecture(flagset, vendor, family, model, model_name, stepping)
    result: dict[str, Any] = {}
    for precision, (ops, how) in per_cycle(flagset, core).items():
        gflops = cores * ghz * ops if ops is not None and ghz else None
        basis = how if ops is None else f"{cores} cores x {_ghz(ghz)} x {ops} ops/cycle/core; {how}"
        result[precision] = {"gflops": gflops, "per_cycle": ops, "basis": basis}
    clock = f"clock {_ghz(ghz)} from {clock_source}" if clock_source else f"clock {_ghz(ghz)}"
    result.update(cores=cores, ghz=ghz, core=core.core, microarchitecture=core.name,
                  basis=f"{core.core}: {core.why}; {clock}" + ("" if ghz else " (unknown: no GFLOP/s figures)"))
    return result


def _ghz(ghz: float | None) -> str:
    return f"{ghz:.2f} GHz" if ghz else "? GHz"


# ---------------------------------------------------------------------------- reading the machine


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


IDENTITY_KEYS = {"vendor_id": "vendor", "cpu family": "family", "model": "model", "stepping": "stepping",
                 "model name": "model_name", "flags": "flags", "Features": "flags"}


def parse_identity(text: str) -> dict[str, Any]:
    """Vendor, family, model, stepping, model name and flags (a set) of the first CPU of a ``/proc/cpuinfo`` text.

    Numbers are ints, absent fields None (an Arm cpuinfo has no vendor or family; a VM
    reports what its hypervisor chooses).
    """
    found: dict[str, Any] = {"vendor": None, "family": None, "model": None, "stepping": None, "model_name": None,
                             "flags": set()}
    for line in text.splitlines():
        if not line.strip() and any(found[k] is not None for k in ("vendor", "family", "model_name")):
            break  # the end of the first processor's block
        key, _, value = (part.strip() for part in line.partition(":"))
        field = IDENTITY_KEYS.get(key)
        if field == "flags":
            found["flags"] |= set(value.split())
        elif field and found[field] is None:
            number = field in ("family", "model", "stepping")
            found[field] = (int(value) if value.isdigit() else None) if number else value
    return found


def cpu_identity(cpuinfo_path: Path | str = PROC_CPUINFO) -> dict[str, Any]:
    """:func:`parse_identity` of the file (without the flags), all None when it cannot be read."""
    try:
        text = Path(cpuinfo_path).read_text(errors="replace")
    except OSError:
        text = ""
    return {k: v for k, v in parse_identity(text).items() if k != "flags"}


def identify(text: str) -> Microarchitecture:
    """The microarchitecture of the first CPU of a ``/proc/cpuinfo`` text."""
    cpu = parse_identity(text)
    return microarchitecture(cpu["flags"], cpu["vendor"], cpu["family"], cpu["model"], cpu["model_name"], cpu["stepping"])


def cpu_peaks(cores: int | None = None, cpuinfo_path: Path | str = PROC_CPUINFO,
              max_freq_path: Path | str = CPUFREQ_MAX) -> dict[str, Any]:
    """This machine's theoretical peaks (:func:`theoretical_peaks`) on ``cores`` cores (default: every CPU listed)."""
    try:
        text = Path(cpuinfo_path).read_text(errors="replace")
    except OSError:
        text = ""
    cpu = parse_identity(text)
    ghz, source = cpu_clock(max_freq_path, cpuinfo_path)
    cores = cores or len(re.findall(r"^processor\s*:", text, flags=re.M)) or os.cpu_count() or 1
    return theoretical_peaks(cpu["flags"], cores, ghz, cpu["vendor"], cpu["family"], model=cpu["model"],
                             model_name=cpu["model_name"], stepping=cpu["stepping"], clock_source=source)
