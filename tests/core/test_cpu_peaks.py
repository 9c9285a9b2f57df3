"""compress.core.cpu_peaks: the microarchitecture named from /proc/cpuinfo, and the paper peaks per precision.

Every figure is checked against arithmetic done by hand (cores x GHz x ops per cycle), on
hand-written cpuinfo texts of the CPUs this toolkit has met or is likely to meet.
"""

from __future__ import annotations

import pytest

from compress.core import cpu_peaks
from compress.core.hardware import cpu_info

AVX512_FLAGS = ["avx2", "fma", "avx512f", "avx512bw"]
AMX_FLAGS = AVX512_FLAGS + ["avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"]


def approx(x):
    return pytest.approx(x, rel=1e-9)


def cpuinfo(vendor: str, family: int, model: int, name: str, flags: list[str], *, stepping: int = 1, cpus: int = 2,
            mhz: float = 2000.0) -> str:
    """A /proc/cpuinfo text of ``cpus`` identical processors."""
    block = (f"processor\t: {{i}}\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\n"
             f"model name\t: {name}\nstepping\t: {stepping}\ncpu MHz\t\t: {mhz}\nflags\t\t: fpu sse2 {' '.join(flags)}\n")
    return "\n".join(block.format(i=i) for i in range(cpus))


# (cpuinfo, microarchitecture, fp32 / bf16 / int8 ops per cycle per core)
SAMPLES = [
    (cpuinfo("AuthenticAMD", 23, 1, "AMD EPYC", ["avx2", "fma"], stepping=2), "Zen 1", (16, None, 32)),  # this machine
    (cpuinfo("AuthenticAMD", 23, 8, "AMD Ryzen 7 2700X Eight-Core Processor", ["avx2", "fma"]), "Zen+", (16, None, 32)),
    (cpuinfo("AuthenticAMD", 23, 49, "AMD EPYC 7R32", ["avx2", "fma"]), "Zen 2", (32, None, 64)),
    (cpuinfo("AuthenticAMD", 25, 1, "AMD EPYC 7R13 Processor", ["avx2", "fma"]), "Zen 3", (32, None, 64)),
    (cpuinfo("AuthenticAMD", 25, 17, "AMD EPYC 9R14", AVX512_FLAGS + ["avx512_vnni", "avx512_bf16"]), "Zen 4",
     (32, 64, 128)),
    (cpuinfo("AuthenticAMD", 26, 2, "AMD EPYC", AVX512_FLAGS + ["avx512_vnni", "avx512_bf16"]), "Zen 5", (64, 128, 256)),
    (cpuinfo("AuthenticAMD", 26, 36, "AMD Ryzen AI 9 HX 370", AVX512_FLAGS + ["avx512_vnni", "avx512_bf16"]), "Zen 5",
     (32, 64, 128)),
    (cpuinfo("GenuineIntel", 6, 85, "Intel(R) Xeon(R) Platinum 8175M CPU @ 2.50GHz", AVX512_FLAGS, stepping=4),
     "Skylake-SP", (64, None, 128)),
    (cpuinfo("GenuineIntel", 6, 85, "Intel(R) Xeon(R) Silver 4214 CPU @ 2.20GHz", AVX512_FLAGS + ["avx512_vnni"],
             stepping=7), "Cascade Lake", (32, None, 128)),
    (cpuinfo("GenuineIntel", 6, 106, "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz", AVX512_FLAGS + ["avx512_vnni"]),
     "Ice Lake-SP", (64, None, 256)),
    (cpuinfo("GenuineIntel", 6, 143, "Intel(R) Xeon(R) Platinum 8488C", AMX_FLAGS), "Sapphire Rapids", (64, 1024, 2048)),
    (cpuinfo("GenuineIntel", 6, 207, "INTEL(R) XEON(R) PLATINUM 8581C", AMX_FLAGS), "Emerald Rapids", (64, 1024, 2048)),
    (cpuinfo("GenuineIntel", 6, 173, "Intel(R) Xeon(R) 6975P-C", AMX_FLAGS), "Granite Rapids", (64, 1024, 2048)),
    (cpuinfo("GenuineIntel", 6, 60, "Intel(R) Core(TM) i7-4770 CPU @ 3.40GHz", ["avx2", "fma"]), "unknown", (32, None, 64)),
    (cpuinfo("CentaurHauls", 7, 59, "some x86", ["avx2", "fma"]), "unknown", (16, None, 32)),
]


@pytest.mark.parametrize("text, name, ops", SAMPLES, ids=[f"{s[1]}-{i}" for i, s in enumerate(SAMPLES)])
def test_the_microarchitecture_and_its_ops_per_cycle_from_cpuinfo(tmp_path, text, name, ops):
    (tmp_path / "cpuinfo").write_text(text)
    assert cpu_peaks.identify(text).name == name
    got = cpu_peaks.cpu_peaks(cpuinfo_path=tmp_path / "cpuinfo", max_freq_path=tmp_path / "absent")
    assert got["microarchitecture"] == name and got["cores"] == 2 and got["ghz"] == approx(2.0)
    assert tuple(got[p]["per_cycle"] for p in cpu_peaks.PRECISIONS) == ops
    for precision, per_cycle in zip(cpu_peaks.PRECISIONS, ops):  # 2 cores x 2.0 GHz x ops per cycle
        assert got[precision]["gflops"] == (approx(2 * 2.0 * per_cycle) if per_cycle else None)


def test_the_peak_uses_cpufreq_max_and_the_cores_asked_for(tmp_path):
    (tmp_path / "cpuinfo").write_text(SAMPLES[10][0])  # Sapphire Rapids at 2.0 GHz "cpu MHz"
    (tmp_path / "max").write_text("3800000\n")  # kHz
    got = cpu_peaks.cpu_peaks(4, tmp_path / "cpuinfo", tmp_path / "max")
    assert got["ghz"] == approx(3.8) and got["cores"] == 4
    assert got["bf16"]["gflops"] == approx(4 * 3.8 * 1024) and "AMX" in got["bf16"]["basis"]
    assert "cpuinfo_max_freq" not in got["basis"] and str(tmp_path / "max") in got["basis"]


def test_a_vm_that_hides_the_model_number_falls_back_on_the_flags():
    # Zen 3 and Zen 4 share family 25: without a model number, AVX-512 tells them apart.
    assert cpu_peaks.microarchitecture(set(AVX512_FLAGS), "AuthenticAMD", 25, None, "AMD EPYC").name == "Zen 4"
    assert cpu_peaks.microarchitecture({"avx2", "fma"}, "AuthenticAMD", 25, None, "AMD EPYC").name == "Zen 3"
    # An AMX Xeon of a model not listed is still a two-FMA AMX core, by its flags.
    amx = cpu_peaks.microarchitecture(set(AMX_FLAGS), "GenuineIntel", 6, 250, "Intel Xeon")
    assert amx.fma_bits == 1024 and amx.name == "unknown"


def test_skylake_sp_two_fma_units_by_sku():
    flags = set(AVX512_FLAGS)
    gold6 = cpu_peaks.microarchitecture(flags, "GenuineIntel", 6, 85, "Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz", 4)
    gold5 = cpu_peaks.microarchitecture(flags, "GenuineIntel", 6, 85, "Intel(R) Xeon(R) Gold 5118 CPU @ 2.30GHz", 4)
    cooper = cpu_peaks.microarchitecture(flags, "GenuineIntel", 6, 85, "", 11)
    assert (gold6.fma_bits, gold5.fma_bits) == (1024, 512) and "assumed one" in gold5.why
    assert cooper.name == "Cooper Lake"


def test_this_machine_names_its_microarchitecture_in_cpu_info():
    info = cpu_info()
    assert isinstance(info["microarchitecture"], str) and info["microarchitecture"]
    assert info["core"]


# ---------------------------------------------------------------------------- theoretical_peaks


def test_avx2_only_intel_core():
    # Haswell..Alder Lake P-core: 2 x 256-bit FMA = 16 fp32 lanes x 2 = 32 FLOP/cycle.
    # No VNNI: vpmaddubsw + vpmaddwd, 4 multiply-adds per lane in 2 instructions: 16 lanes x 4 = 64.
    got = cpu_peaks.theoretical_peaks(["avx2", "fma"], 4, 3.0, "GenuineIntel", 6, model=60)
    assert got["fp32"]["per_cycle"] == 32 and got["fp32"]["gflops"] == approx(4 * 3.0 * 32)  # 384
    assert got["int8"]["per_cycle"] == 64 and got["int8"]["gflops"] == approx(4 * 3.0 * 64)  # 768
    assert "vpmaddubsw" in got["int8"]["basis"]
    assert got["bf16"]["gflops"] is None and got["bf16"]["per_cycle"] is None
    assert "no native bf16" in got["bf16"]["basis"]


def test_avx512_intel_xeon_with_two_fma_units_and_amx():
    # Sapphire Rapids (model 143): 2 x 512-bit FMA = 32 lanes x 2 = 64 FLOP/cycle; AMX tiles
    # give 1024 bf16 FLOPs and 2048 int8 ops per cycle per core.
    flags = AVX512_FLAGS + ["avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"]
    got = cpu_peaks.theoretical_peaks(flags, 8, 2.0, "GenuineIntel", 6, model=143)
    assert got["fp32"]["gflops"] == approx(8 * 2.0 * 64)  # 1024
    assert got["bf16"]["gflops"] == approx(8 * 2.0 * 1024)  # 16384
    assert got["int8"]["gflops"] == approx(8 * 2.0 * 2048)  # 32768
    assert "AMX" in got["int8"]["basis"]


def test_avx512_intel_ice_lake_sp_vnni_without_amx():
    # Ice Lake-SP (model 106): 2 x 512-bit; vpdpbusd at that rate: 32 lanes x 4 multiply-adds x 2 = 256.
    got = cpu_peaks.theoretical_peaks(AVX512_FLAGS + ["avx512_vnni"], 2, 2.5, "GenuineIntel", 6, model=106)
    assert got["fp32"]["per_cycle"] == 64 and got["int8"]["per_cycle"] == 256
    assert got["int8"]["gflops"] == approx(2 * 2.5 * 256)  # 1280
    assert got["bf16"]["gflops"] is None


def test_skylake_sp_and_client_avx512_assume_one_512_bit_fma():
    # Skylake-SP / Cascade Lake (model 85) has one or two FMA units by SKU: one is assumed, and said.
    sky = cpu_peaks.theoretical_peaks(AVX512_FLAGS + ["avx512_vnni"], 2, 2.0, "GenuineIntel", 6, model=85)
    assert sky["fp32"]["per_cycle"] == 32 and sky["int8"]["per_cycle"] == 128
    assert "assumed one" in sky["basis"]
    client = cpu_peaks.theoretical_peaks(AVX512_FLAGS, 4, 4.0, "GenuineIntel", 6, model=140)  # Tiger Lake
    assert client["fp32"]["gflops"] == approx(4 * 4.0 * 32)  # 512
    # No VNNI on a 512-bit core: vpmaddubsw path at 16 lanes x 4.
    assert client["int8"]["per_cycle"] == 64


def test_zen4_double_pumps_512_bit_ops():
    # Zen 4 (family 25 with AVX-512), this repository's 2-core EPYC at its nominal 2.6 GHz:
    # 2 x 256-bit FMA = 16 lanes: fp32 16 x 2 = 32, bf16 16 x 4 = 64, int8 16 x 8 = 128 per cycle.
    flags = AVX512_FLAGS + ["avx512_vnni", "avx512_bf16"]
    got = cpu_peaks.theoretical_peaks(flags, 2, 2.6, "AuthenticAMD", 25, model=17, model_name="AMD EPYC")
    assert got["core"] == "AMD Zen 4"
    assert got["fp32"]["gflops"] == approx(2 * 2.6 * 32)  # 166.4
    assert got["bf16"]["gflops"] == approx(2 * 2.6 * 64)  # 332.8
    assert got["int8"]["gflops"] == approx(2 * 2.6 * 128)  # 665.6
    assert "double-pumped" in got["basis"] and "2.60 GHz" in got["fp32"]["basis"]


def test_zen5_server_is_twice_zen4_and_mobile_zen5_is_not():
    flags = AVX512_FLAGS + ["avx512_vnni", "avx512_bf16"]
    server = cpu_peaks.theoretical_peaks(flags, 2, 2.6, "AuthenticAMD", 26, model_name="AMD EPYC 9555 64-Core Processor")
    assert server["fp32"]["per_cycle"] == 64 and server["int8"]["per_cycle"] == 256 and server["bf16"]["per_cycle"] == 128
    mobile = cpu_peaks.theoretical_peaks(flags, 2, 2.6, "AuthenticAMD", 26, model_name="AMD Ryzen AI 9 HX 370")
    assert mobile["fp32"]["per_cycle"] == 32
    unnamed = cpu_peaks.theoretical_peaks(flags, 2, 2.6, "AuthenticAMD", 26)
    assert unnamed["fp32"]["per_cycle"] == 32 and "conservative" in unnamed["basis"]


def test_zen3_has_no_avx512_bf16_or_vnni():
    got = cpu_peaks.theoretical_peaks(["avx2", "fma"], 8, 3.5, "AuthenticAMD", 25)
    assert got["core"] == "AMD Zen 3"
    assert got["fp32"]["gflops"] == approx(8 * 3.5 * 32)  # 896
    assert got["int8"]["per_cycle"] == 64 and got["bf16"]["gflops"] is None


def test_unknown_vendor_takes_the_narrowest_implementation_and_says_so():
    avx512 = cpu_peaks.theoretical_peaks(AVX512_FLAGS + ["avx512_vnni"], 2, 3.0, None, None)
    assert avx512["fp32"]["per_cycle"] == 32 and avx512["int8"]["per_cycle"] == 128
    assert "conservative" in avx512["basis"]
    avx2 = cpu_peaks.theoretical_peaks(["avx2", "fma"], 2, 3.0, "SomeVendor", 7)
    assert avx2["fp32"]["gflops"] == approx(2 * 3.0 * 16)  # 2 x 128-bit FMA pipes: 8 lanes x 2
    assert "conservative" in avx2["basis"]


def test_unknown_clock_gives_per_cycle_figures_only():
    got = cpu_peaks.theoretical_peaks(AVX512_FLAGS, 2, None, "AuthenticAMD", 25)
    assert got["fp32"]["gflops"] is None and got["fp32"]["per_cycle"] == 32
    assert "unknown" in got["basis"]


def test_the_clock_source_is_in_the_basis():
    got = cpu_peaks.theoretical_peaks(["avx2", "fma"], 1, 2.0, "GenuineIntel", 6, clock_source="/proc/cpuinfo 'cpu MHz'")
    assert "/proc/cpuinfo 'cpu MHz'" in got["basis"]


# ---------------------------------------------------------------------------- reading the CPU


CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC 9R14
cpu MHz\t\t: 2596.146
flags\t\t: fpu avx2 fma avx512f

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC 9R14
cpu MHz\t\t: 3100.000
"""


def test_clock_from_cpufreq_first(tmp_path):
    sysfs = tmp_path / "cpuinfo_max_freq"
    sysfs.write_text("3700000\n")  # kHz
    (tmp_path / "cpuinfo").write_text(CPUINFO)
    ghz, source = cpu_peaks.cpu_clock(sysfs, tmp_path / "cpuinfo")
    assert ghz == approx(3.7) and "cpuinfo_max_freq" in source
    assert cpu_peaks.cpu_clock_ghz(sysfs, tmp_path / "cpuinfo") == approx(3.7)


def test_clock_from_cpuinfo_mhz_without_cpufreq(tmp_path):
    (tmp_path / "cpuinfo").write_text(CPUINFO)
    ghz, source = cpu_peaks.cpu_clock(tmp_path / "absent", tmp_path / "cpuinfo")
    assert ghz == approx(3.1)  # the highest core's MHz
    assert "cpu MHz" in source and "nominal" in source


def test_clock_from_intel_model_name_then_none(tmp_path):
    (tmp_path / "intel").write_text("vendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz\n")
    assert cpu_peaks.cpu_clock_ghz(tmp_path / "absent", tmp_path / "intel") == approx(2.4)
    (tmp_path / "bare").write_text("processor\t: 0\n")
    ghz, source = cpu_peaks.cpu_clock(tmp_path / "absent", tmp_path / "bare")
    assert ghz is None and "nowhere" in source
    assert cpu_peaks.cpu_clock_ghz(tmp_path / "absent", tmp_path / "absent too") is None
    (tmp_path / "zero").write_text("0\n")  # some drivers report 0: fall through, not 0 GHz
    assert cpu_peaks.cpu_clock_ghz(tmp_path / "zero", tmp_path / "intel") == approx(2.4)


def test_cpu_identity_reads_the_first_processor(tmp_path):
    (tmp_path / "cpuinfo").write_text(CPUINFO)
    assert cpu_peaks.cpu_identity(tmp_path / "cpuinfo") == {
        "vendor": "AuthenticAMD", "family": 25, "model": 17, "stepping": None, "model_name": "AMD EPYC 9R14"}
    assert cpu_peaks.cpu_identity(tmp_path / "absent") == {
        "vendor": None, "family": None, "model": None, "stepping": None, "model_name": None}


