"""compress.eval.latency.peak: measured GEMM peaks per precision and engine, paper peaks, floors.

The paper figures themselves are tested in tests/core/test_cpu_peaks.py; measurement runs every real engine on tiny sizes, and made-up engines check the
bookkeeping (best, errors, skipped sizes) without timing anything real.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from compress.core.cpu_peaks import theoretical_peaks
from compress.eval.latency import peak

AVX512_FLAGS = ["avx2", "fma", "avx512f", "avx512bw"]


def approx(x):
    return pytest.approx(x, rel=1e-9)


# ---------------------------------------------------------------------------- on paper (tests/core/test_cpu_peaks.py)


def test_this_machine_gets_a_figure_with_a_basis():
    got = peak.cpu_theoretical_peaks(cores=1)
    assert got["cores"] == 1 and got["basis"]
    assert set(peak.PRECISIONS) <= set(got)
    assert all(got[p]["basis"] for p in peak.PRECISIONS)


# ---------------------------------------------------------------------------- measure_peaks


EXPECTED_ENGINES = {"fp32": {"torch", "numpy", "onnxruntime", "openvino"}, "bf16": {"torch", "openvino"},
                    "int8": {"torch", "onnxruntime", "openvino"}}


def test_measure_peaks_on_every_real_engine_at_tiny_sizes():
    threads = torch.get_num_threads()
    report = peak.measure_peaks(threads, sizes=(64, 128), min_seconds=0)
    assert set(report) == {"fp32", "bf16", "int8", "threads", "sizes"} and report["threads"] == threads
    for precision in peak.PRECISIONS:
        section = report[precision]
        assert set(section["engines"]) == EXPECTED_ENGINES[precision]
        rates = {}
        for name, record in section["engines"].items():
            if "error" in record:
                assert isinstance(record["error"], str) and "\n" not in record["error"], (precision, name)
                continue
            assert record["gflops"] > 0 and record["n"] in (64, 128), (precision, name, record)
            rates[name] = record["gflops"]
        if rates:
            assert section["best"] == max(rates, key=rates.get)
            assert section["gflops"] == rates[section["best"]]
        else:
            assert section["best"] is None and section["gflops"] is None
        assert section["unit"] == ("GOP/s" if precision == "int8" else "GFLOP/s")
    # torch fp32 runs everywhere; an OpenVINO record names what really ran, never another precision.
    assert "gflops" in report["fp32"]["engines"]["torch"]
    ran = {p: report[p]["engines"]["openvino"].get("precision") for p in peak.PRECISIONS}
    if "gflops" in report["fp32"]["engines"]["openvino"]:
        assert ran["fp32"] == "f32"
    if "gflops" in report["bf16"]["engines"]["openvino"]:
        assert ran["bf16"] == "bf16"
    if "gflops" in report["int8"]["engines"]["openvino"]:
        assert set(ran["int8"].split(", ")) <= {"u8", "i8"}
    # Each engine that ran says what its kernels were (compress.eval.latency.kernels): numpy's BLAS is named by its own record.
    engines = report["fp32"]["engines"]
    assert engines["torch"]["kernels"]["runtime"] == "torch" and "kernels" not in engines["numpy"]
    if "gflops" in engines["onnxruntime"]:
        assert engines["onnxruntime"]["kernels"]["summary"].startswith("MLAS SGEMM")
    if "gflops" in engines["openvino"]:
        assert engines["openvino"]["kernels"]["reported"] and engines["openvino"]["kernels"]["inference_precision"] == "f32"


def fake(seconds: float = 0.0, fail_at: int | None = None, error: Exception | None = None):
    """A made-up engine: a product takes ``seconds``; it raises ``error`` (at size ``fail_at``, or always)."""

    def make(n: int, threads: int) -> peak.Product:
        if error is not None and (fail_at is None or n == fail_at):
            raise error
        return peak.Product(lambda: time.sleep(seconds) if seconds else np.zeros(1), {"op": f"fake {seconds}"})

    return make


def fake_engines(monkeypatch, **by_precision):
    engines = {p: {} for p in peak.PRECISIONS}
    engines.update(by_precision)
    monkeypatch.setattr(peak, "ENGINES", engines)


def test_best_is_the_fastest_engine_and_a_failure_is_a_one_line_record(monkeypatch):
    fake_engines(monkeypatch, fp32={"slow": fake(0.002), "fast": fake(0.0),
                                    "broken": fake(error=RuntimeError("no kernel\n  at some.cpp:12\n"))})
    report = peak.measure_peaks(1, sizes=(8,), min_seconds=0)
    fp32 = report["fp32"]
    assert fp32["best"] == "fast" and fp32["gflops"] == fp32["engines"]["fast"]["gflops"]
    assert fp32["engines"]["fast"]["gflops"] > fp32["engines"]["slow"]["gflops"]
    assert fp32["engines"]["broken"] == {"error": "RuntimeError: no kernel at some.cpp:12"}  # the message whole, on one line
    assert report["bf16"] == {"engines": {}, "best": None, "gflops": None, "unit": "GFLOP/s"}


def test_a_precision_whose_engines_all_fail_has_no_best(monkeypatch):
    fake_engines(monkeypatch, int8={"a": fake(error=ImportError("No module named 'x'")), "b": fake(error=ValueError())})
    int8 = peak.measure_peaks(1, sizes=(8,), min_seconds=0)["int8"]
    assert int8["best"] is None and int8["gflops"] is None
    assert int8["engines"] == {"a": {"error": "ImportError: No module named 'x'"}, "b": {"error": "ValueError"}}


def test_a_run_in_the_wrong_precision_is_not_counted(monkeypatch):
    wrong = peak.WrongPrecision("OpenVINO ran the int8 product in f32, not int8", "f32")
    fake_engines(monkeypatch, int8={"emulated": fake(error=wrong), "real": fake(0.001)})
    int8 = peak.measure_peaks(1, sizes=(8,), min_seconds=0)["int8"]
    assert int8["engines"]["emulated"] == {"error": "WrongPrecision: OpenVINO ran the int8 product in f32, not int8", "precision": "f32"}
    assert int8["best"] == "real"


def test_a_slow_engine_skips_the_larger_sizes_and_a_late_failure_keeps_the_early_sizes(monkeypatch):
    monkeypatch.setattr(peak, "SLOW_SECONDS", 0.0)
    fake_engines(monkeypatch, fp32={"slow": fake(0.0), "late": fake(error=MemoryError("out of memory"), fail_at=16)})
    report = peak.measure_peaks(1, sizes=(16, 8), min_seconds=0)
    slow = report["fp32"]["engines"]["slow"]
    assert slow["n"] == 8 and slow["skipped"] == [16]
    monkeypatch.setattr(peak, "SLOW_SECONDS", 60.0)
    late = peak.measure_peaks(1, sizes=(8, 16), min_seconds=0)["fp32"]["engines"]["late"]
    assert late["n"] == 8 and late["gflops"] > 0
    assert late["error_at"] == {"n": 16, "error": "MemoryError: out of memory"}


def test_best_rate_counts_the_fastest_of_at_least_repeats_calls():
    calls = []
    rate = peak.best_rate(lambda: calls.append(1), 2e9, min_seconds=0)
    assert len(calls) == peak.WARMUP + peak.REPEATS and rate > 0


def test_torch_int8_falls_back_to_a_dynamically_quantized_linear(monkeypatch):
    def no_int_mm(*args, **kwargs):
        raise RuntimeError("_int_mm is not implemented for CPU")

    monkeypatch.setattr(torch, "_int_mm", no_int_mm)
    product = peak.torch_int8(32, 1)
    assert "quantize_dynamic" in product.info["op"]
    assert product.run().shape == (32, 32)


def test_engines_are_registered_once():
    with pytest.raises(ValueError, match="registered twice"):
        peak.engine("fp32", "torch")(peak.torch_fp32)


# ---------------------------------------------------------------------------- floors and precisions


def test_floor_ms_by_hand():
    assert peak.floor_ms(3e9, 150.0) == approx(20.0)  # 3 GFLOP at 150 GFLOP/s = 20 ms
    assert peak.floor_ms(2.87e9, 344.0) == approx(2.87 / 344 * 1e3)  # 8.34 ms
    for bad in (0.0, -1.0, None):
        with pytest.raises(ValueError):
            peak.floor_ms(1e9, bad)


@pytest.mark.parametrize("backend, precision", [
    ("torch", "fp32"), ("torch-int8", "int8"), ("torch-bf16", "bf16"), ("onnxruntime", "fp32"),
    ("onnxruntime-int8", "int8"), ("inc-int8", "int8"), ("openvino", "fp32"), ("openvino-int8", "int8"),
    ("openvino-bf16", "bf16"), ("openvino-int8-bf16", "int8"),
])
def test_precision_of_every_latency_backend(backend, precision):
    assert peak.precision_of_backend(backend, None) == precision
    assert set(peak.BACKEND_PRECISIONS) >= {backend}


def test_an_openvino_note_says_what_the_matmuls_really_ran_in():
    note = "m: OpenVINO inference precision {} (asked: f32); matrix multiplications in {}"
    assert peak.precision_of_backend("openvino-int8-bf16", note.format("bf16", "u8 x36, bf16 x12")) == "int8"
    assert peak.precision_of_backend("openvino", note.format("bf16", "bf16 x48")) == "bf16"
    # An int8 file whose integer ops the plugin only emulated ran in f32: no int8 peak bounds it.
    assert peak.precision_of_backend("openvino-int8", note.format("f32", "f32 x48")) == "fp32"
    # Notes without the list (torch-bf16's emulation caveat) leave the name to decide.
    assert peak.precision_of_backend("torch-bf16", "torch-bf16: this CPU has no avx512_bf16/amx_bf16") == "bf16"
    assert peak.precision_of_backend("someday-int8", None) == "int8"


def test_a_measured_peak_above_the_paper_one_is_pointed_out():
    theory = theoretical_peaks(AVX512_FLAGS, 2, 2.6, "AuthenticAMD", 25)  # fp32 166.4
    measured = {"fp32": {"gflops": 200.0, "best": "openvino"}, "int8": {"gflops": None, "best": None}}
    notes = peak.peak_notes(measured, theory)
    assert len(notes) == 1 and "fp32 200" in notes[0] and "openvino" in notes[0]
    assert peak.peak_notes({"fp32": {"gflops": 100.0, "best": "torch"}}, theory) == []
