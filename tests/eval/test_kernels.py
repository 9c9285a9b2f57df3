"""compress.eval.latency.kernels: what each backend's matrix multiplications ran on, from the libraries' own reporting.

The parsers are checked on hand-written verbose lines of CPUs this machine is not (AMX,
AVX-512); the probes run for real on tiny products here (AVX2), and on made-up OpenVINO
runtime graphs for what an AMX machine would report.
"""

from __future__ import annotations

import time
import warnings

import numpy as np
import pytest
import torch

from compress.eval.latency import kernels

AMX_FLAGS = ["avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"]
ZEN4_FLAGS = ["avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16"]

# oneDNN 3.x verbose (as torch 2.x prints it) on a Sapphire Rapids running a bf16 Linear, and 2.x lines on AVX2.
ONEDNN_V3 = """onednn_verbose,v1,info,oneDNN v3.5.3 (commit 66f0cb9eb66affd2da3bf5f8d897376f04aae6af)
onednn_verbose,v1,info,cpu,isa:Intel AVX-512 with float16, Intel DL Boost and bfloat16 support and Intel AMX with bfloat16 and 8-bit integer support
onednn_verbose,v1,primitive,exec,cpu,reorder,jit:uni,undef,src:bf16::blocked:ab::f0 dst:bf16::blocked:AB16b32a2b::f0,,,64x64,0.02
onednn_verbose,v1,primitive,exec,cpu,matmul,brg:avx512_core_amx,undef,src:bf16::blocked:ab::f0 wei:bf16:a:blocked:AB16b32a2b::f0 dst:bf16::blocked:ab::f0,,,16x64:64x64,0.05
onednn_verbose,v1,primitive,exec,cpu,matmul,brg:avx512_core_amx,undef,src:bf16::blocked:ab::f0 wei:bf16:a:blocked:AB16b32a2b::f0 dst:bf16::blocked:ab::f0,,,16x64:64x64,0.04
"""
ONEDNN_V2 = """dnnl_verbose,info,cpu,isa:Intel AVX2
onednn_verbose,exec,cpu,inner_product,gemm:jit,forward_inference,src_f32::blocked:ab:f0 wei_f32::blocked:ab:f0,,,mb16ic64oc64,0.1
onednn_verbose,exec,cpu,convolution,jit:avx2,forward_training,src_f32::blocked:aBcd8b:f0,,alg:convolution_direct,mb1_ic64oc64,6.0
"""
MKL_INTEL = """MKL_VERBOSE oneMKL 2024.0 Update 2 Product build 20240605 for Intel(R) 64 architecture Intel(R) Advanced Vector Extensions 512 (Intel(R) AVX-512) with support of Intel(R) Deep Learning Boost (Intel(R) DL Boost), EVEX-encoded AES and Carry-Less Multiplication Quadword instructions, Lnx 2.10GHz lp64 gnu_thread
MKL_VERBOSE SGEMM(T,N,64,16,64,0x7ffd,0x55,64,0x55,64,0x7ffd,0x55,64) 12.1us CNR:OFF Dyn:1 FastMM:1 TID:0  NThr:2
MKL_VERBOSE SGEMM(T,N,64,16,64,0x7ffd,0x55,64,0x55,64,0x7ffd,0x55,64) 11.9us CNR:OFF Dyn:1 FastMM:1 TID:0  NThr:2
"""
MKL_AMD = """MKL_VERBOSE oneMKL 2024.0 Update 2 Product build 20240605 for Intel(R) 64 architecture Intel(R) Architecture processors, Lnx 2.00GHz lp64 gnu_thread
MKL_VERBOSE SGEMM(N,N,64,64,64,0x7ffc,0x55,64,0x55,64,0x7ffc,0x55,64) 28.27us CNR:OFF Dyn:1 FastMM:1 TID:0  NThr:1
"""


def test_onednn_verbose_lines_of_both_layouts_give_each_primitive_and_implementation():
    assert kernels.parse_onednn_verbose(ONEDNN_V3) == {("reorder", "jit:uni"): 1, ("matmul", "brg:avx512_core_amx"): 2}
    assert kernels.parse_onednn_verbose(ONEDNN_V2) == {("inner_product", "gemm:jit"): 1, ("convolution", "jit:avx2"): 1}
    assert kernels.parse_onednn_verbose("some other output\nonednn_verbose,v1,info,cpu,runtime:OpenMP\n") == {}


def test_mkl_verbose_gives_the_calls_and_the_code_path_only_where_the_banner_names_one():
    calls, isa = kernels.parse_mkl_verbose(MKL_INTEL)
    assert calls == {"SGEMM": 2} and isa == "avx512"
    calls, isa = kernels.parse_mkl_verbose(MKL_AMD)  # MKL on AMD names no code path: not guessed
    assert calls == {"SGEMM": 1} and isa is None


@pytest.mark.parametrize("name, isa", [
    ("brg:avx512_core_amx", "amx"), ("brgemm_avx512_amx_bf16", "amx"), ("jit:avx2", "avx2"), ("jit_avx2_f32", "avx2"),
    ("brg:avx512_core_vnni", "avx512"), ("brgemm_avx2_vnni_2", "avx_vnni"), ("gemm_mlas_f32", None), ("gemm:jit", None),
])
def test_the_isa_a_kernel_name_states(name, isa):
    assert kernels.isa_of(name) == isa


def test_best_isa_is_the_most_capable_named():
    assert kernels.best_isa(["gemm_mlas_f32", "brgemm_avx2_f32", "brgemm_avx512_amx_bf16"]) == "amx"
    assert kernels.best_isa(["gemm:jit"]) is None


@pytest.mark.parametrize("flags, precision, kernel", [
    (AMX_FLAGS, "int8", "U8S8 AMX"), (ZEN4_FLAGS, "int8", "U8S8 AVX512-VNNI"), (["avx2", "fma"], "int8", "U8S8 AVX2"),
    (["avx2", "fma", "avx_vnni"], "int8", "U8S8 AVX-VNNI"), (AMX_FLAGS, "fp32", "SGEMM AVX512F"),
    (["avx2", "fma"], "fp32", "SGEMM FMA3"), ([], "fp32", "SGEMM SSE"),
])
def test_mlas_kernels_follow_its_cpuid_dispatch(flags, precision, kernel):
    assert kernels.mlas_kernels(set(flags), precision)[0] == kernel


def test_fbgemm_kernels_by_flags():
    assert kernels.fbgemm_isa(set(ZEN4_FLAGS)) == "avx512_vnni"
    assert kernels.fbgemm_isa({"avx2", "fma"}) == "avx2"


def test_a_matrix_unit_the_kernels_left_unused_is_pointed_out():
    reported = {"reported": True, "isa": "avx512"}
    assert "amx_bf16" in kernels.missed_unit(AMX_FLAGS, "bf16", reported)
    assert kernels.missed_unit(AMX_FLAGS, "bf16", {**reported, "isa": "amx"}) is None
    assert kernels.missed_unit(AMX_FLAGS, "int8", {"reported": False, "isa": "avx2"}) is None  # inferred: nothing to say
    assert "avx512_vnni" in kernels.missed_unit(ZEN4_FLAGS, "int8", {**reported, "isa": "avx2"})
    assert kernels.missed_unit(ZEN4_FLAGS, "int8", reported) is None
    assert kernels.missed_unit(["avx2", "fma"], "bf16", {**reported, "isa": "avx2"}) is None  # no unit to miss
    assert kernels.missed_unit(AMX_FLAGS, "fp32", {**reported, "isa": "avx512"}) is None


# ---------------------------------------------------------------------------- the probes, for real here


def test_torch_probe_reads_what_the_libraries_print_and_leaves_stdout_as_it_was(capfd):
    linear, x = torch.nn.Linear(64, 64), torch.randn(16, 64)
    with torch.inference_mode():
        got = kernels.kernels_used("torch", lambda: linear(x), "fp32")
    assert got["runtime"] == "torch" and got["reported"]
    assert ("MKL" in got["summary"] or "oneDNN" in got["summary"]) and f"ATen {torch.backends.cpu.get_cpu_capability()}" in got["summary"]
    print("after the probe")
    out = capfd.readouterr().out
    assert "after the probe" in out and "MKL_VERBOSE" not in out and "onednn_verbose" not in out


def test_torch_dynamic_int8_is_fbgemm_inferred_from_the_flags():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao's deprecation: not this test's concern
        linear = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(torch.nn.Linear(64, 64)), {torch.nn.Linear},
                                                        dtype=torch.qint8)
    x = torch.randn(16, 64)
    got = kernels.kernels_used("torch-fbgemm", lambda: linear(x), "int8")
    assert got["summary"].startswith("fbgemm (by cpuid:") and not got["reported"] and got["runtime"] == "torch-fbgemm"


def test_a_product_no_library_reports_ran_in_atens_own_kernels():
    a, out = torch.ones(64, 64, dtype=torch.int8), torch.empty(64, 64, dtype=torch.int32)
    got = kernels.kernels_used("torch", lambda: torch._int_mm(a, a, out=out), "int8")
    # a CPU where oneDNN or MKL multiplies (AVX512-VNNI, AMX): reported there; a reorder or other
    # non-matrix primitive oneDNN ran beside ATen's product does not count
    products = [key for key in got["detail"]["onednn"] if key.split(" ")[0] in kernels.ONEDNN_MATRIX]
    if products or got["detail"]["mkl"]:
        assert "oneDNN" in got["summary"] or "MKL" in got["summary"]
    else:
        capability = torch.backends.cpu.get_cpu_capability()
        assert got["summary"] == f"ATen's own kernels ({capability})" and got["reported"]


def test_onnxruntime_is_mlas_by_cpuid_and_marked_inferred():
    got = kernels.kernels_used("onnxruntime", lambda: None, "int8")
    assert got["summary"].startswith("MLAS U8S8") and "inferred" in got["summary"] and not got["reported"]


def test_openvino_probe_reads_the_runtime_graph_of_a_real_compiled_model():
    import openvino as ov
    import openvino.opset13 as ops

    from compress.core.formats.openvino_runtime import compile_openvino

    x = ops.parameter([16, 64], ov.Type.f32, name="a")
    model = ov.Model([ops.matmul(x, ops.constant(np.ones((64, 64), np.float32)), False, False)], [x], "gemm")
    compiled = compile_openvino(model, threads=1)
    request = compiled.create_infer_request()
    got = kernels.kernels_used("openvino", lambda: request.infer([np.ones((16, 64), np.float32)]), "fp32", compiled)
    assert got["reported"] and got["inference_precision"] == "f32"
    assert "FullyConnected" in got["summary"] and "FP32" in got["summary"]  # a layer and the CPU's capabilities


class _Value:
    def __init__(self, value):
        self.value = value

    def astype(self, _):
        return self.value

    def get_type_name(self):
        return self.value


class _Op:
    def __init__(self, layer, primitive, precision):
        self.info = {"layerType": _Value(layer), "primitiveType": _Value(primitive), "runtimePrecision": _Value(precision)}

    def get_rt_info(self):
        return self.info


class _Compiled:
    """What OpenVINO's compiled model on a Sapphire Rapids reports for an "f32" model the plugin ran in bf16."""

    def __init__(self, primitive: str):
        self.ops = [_Op("FullyConnected", primitive, "bf16")] * 6 + [_Op("MVN", "jit_avx512_bf16", "bf16")]

    def get_runtime_model(self):
        return self

    def get_ops(self):
        return self.ops

    def get_property(self, name):
        assert name == "INFERENCE_PRECISION_HINT"
        return _Value("bf16")


def test_an_openvino_row_that_ran_bf16_on_amx_says_so(monkeypatch):
    monkeypatch.setattr(kernels, "cpu_info", lambda: {"flags": AMX_FLAGS})
    got = kernels.kernels_used("openvino", lambda: None, "bf16", _Compiled("brgemm_avx512_amx_bf16"))
    assert got["inference_precision"] == "bf16" and "inference precision bf16" in got["summary"]
    assert got["isa"] == "amx" and got["note"] is None
    assert "FullyConnected brgemm_avx512_amx_bf16 (bf16) x6" in got["summary"]
    # The same on AVX-512 kernels, with AMX on the CPU: said.
    missed = kernels.kernels_used("openvino", lambda: None, "bf16", _Compiled("brgemm_avx512_bf16"))
    assert missed["note"] == "this CPU has amx_bf16 but the bf16 kernels ran on avx512"


def test_a_failing_probe_is_a_record_not_an_exception():
    def broken():
        raise RuntimeError("no such library")

    got = kernels.kernels_used("torch", broken, "fp32")
    assert "probe failed" in got["summary"] and not got["reported"]


# ---------------------------------------------------------------------------- in the latency worker


def test_the_worker_probes_once_after_the_timing(tiny_model_dir):
    from compress.eval.latency.config import LatencyConfig
    from compress.eval.latency.worker import Timing

    config = {**LatencyConfig().__dict__, "seq": (16,), "warmup": 1, "repeats": 3, "threads": 1, "peak": False}
    timing = Timing(tiny_model_dir, config)
    calls = []
    probe = timing.session.kernels
    timing.session.kernels = lambda run: calls.append(time.perf_counter()) or probe(run)
    timing.burst(1, 16, 3)
    first = timing.result()
    assert first["kernels"]["runtime"] == "torch" and first["kernels"]["summary"]
    assert timing.result()["kernels"] == first["kernels"] and len(calls) == 1  # once per model
    assert len(first["points"][0]["seconds"]) == 3  # the probe's forward is not a timed pass
