"""The one answer to "which precisions run here": :class:`compress.core.hardware.Precisions` for known CPUs' flags."""

from __future__ import annotations

import dataclasses
import platform

import pytest

from compress.core.formats.openvino_runtime import openvino_bf16
from compress.core.hardware import Precisions, cpu_info, precisions

# /proc/cpuinfo flags (only those cpu_info keeps) of four CPUs, and the record written by hand for each.
ZEN1 = ("avx2", "fma")
ZEN4 = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16")
SAPPHIRE_RAPIDS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16",
                   "amx_tile", "amx_bf16", "amx_int8")
ARM = ("asimd", "asimddp", "bf16", "i8mm")  # e.g. Graviton 3 / Neoverse V1 ("Features" line)
ALDER_LAKE = ("avx2", "fma", "avx_vnni")  # AVX-VNNI without AVX-512


@pytest.mark.parametrize("flags, arch, expected", [
    (ZEN1, "x86_64", dict(bf16=False, amx_bf16=False, amx_int8=False, vnni=False, int8_preset="avx2")),
    (ZEN4, "x86_64", dict(bf16=True, amx_bf16=False, amx_int8=False, vnni=True, int8_preset="avx512_vnni")),
    (SAPPHIRE_RAPIDS, "x86_64", dict(bf16=True, amx_bf16=True, amx_int8=True, vnni=True, int8_preset="avx512_vnni")),
    (ARM, "aarch64", dict(bf16=True, amx_bf16=False, amx_int8=False, vnni=False, int8_preset="arm64")),
    # ONNX Runtime's preset follows AVX512-VNNI alone (as before the record): AVX-VNNI keeps avx2's uint8 weights.
    (ALDER_LAKE, "x86_64", dict(bf16=False, amx_bf16=False, amx_int8=False, vnni=True, int8_preset="avx2")),
], ids=["zen1", "zen4", "sapphire-rapids", "arm", "alder-lake"])
def test_the_record_of_each_cpus_flags_is_the_one_written_by_hand(flags, arch, expected):
    record = Precisions.from_flags(flags, arch)
    assert dataclasses.asdict(record) == {**expected, "arch": arch, "source": "given flags"}
    assert Precisions.from_flags(set(flags), arch) == record  # a list, tuple or set of flags alike


def test_arm_names_its_architecture_either_way_and_bf16_alone_is_no_x86_unit():
    assert Precisions.from_flags(ARM, "arm64").int8_preset == "arm64"  # macOS's platform.machine()
    assert not Precisions.from_flags(("avx2", "bf16"), "x86_64").bf16  # x86 spells its units avx512_bf16 / amx_bf16
    assert not Precisions.from_flags(("asimd", "asimddp", "i8mm"), "aarch64").bf16


def test_the_record_is_made_once_per_process_from_this_cpus_flags():
    record = precisions()
    assert precisions() is record
    info = cpu_info()
    assert record == Precisions.from_flags(info["flags"], info["arch"], record.source)
    assert record.arch == platform.machine() and record.source in ("/proc/cpuinfo flags", "no /proc/cpuinfo (no flags)")
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.bf16 = not record.bf16


def test_openvinos_bf16_capability_agrees_with_the_record_on_x86():
    """OpenVINO's OPTIMIZATION_CAPABILITIES decides what an OpenVINO folder runs; on x86 it has BF16 wherever the CPU
    has bf16 dot products (its check is oneDNN's avx512_core_bf16, which every AVX512_BF16 or AMX-BF16 CPU passes)."""
    pytest.importorskip("openvino")
    record = precisions()
    if record.arch.lower() in ("arm64", "aarch64"):
        pytest.skip("OpenVINO's ARM plugin reports no BF16 whatever the CPU's flags")
    if record.bf16:
        assert openvino_bf16()
