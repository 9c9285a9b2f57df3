"""bench.call_overhead: each way of calling runs every sentence, rows render their own arithmetic."""

from __future__ import annotations

import pytest

from bench.call_overhead import measure, render
from compress.core.formats.onnx import export_onnx


def test_an_onnx_folder_is_timed_both_ways_over_every_sentence(tiny_model_dir, tmp_path):
    onnx = export_onnx(tiny_model_dir, tmp_path / "onnx")
    texts = tmp_path / "texts.txt"
    texts.write_text("a short one\na somewhat longer sentence than the first\nthird\n")
    row = measure(str(onnx), None, str(texts), threads=1, rounds=2)
    assert row["sentences"] == 3 and row["format"] == "onnx" and row["compiled_shapes"] == 1
    assert set(row["ms_per_sentence"]) == {"module call", "runtime call"}  # grouping by shape is OpenVINO's only
    assert all(len(runs) == 2 and min(runs) > 0 for runs in row["ms_per_sentence_runs"].values())
    assert row["padded_tokens_mean"] == pytest.approx(row["mean_tokens"])  # ONNX Runtime: exact lengths, no padding


def test_a_pytorch_folder_is_refused(tiny_model_dir, tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text("one\n")
    with pytest.raises(SystemExit, match="times ONNX Runtime and OpenVINO folders"):
        measure(str(tiny_model_dir), None, str(texts), threads=1, rounds=1)


def test_rows_give_sentences_per_second_and_the_round_range():
    report = {"date": "d", "hardware": {"cpu": "cpu", "physical_cores": 2}, "threads": 2, "rounds": 2, "packages": {"torch": "x"},
              "command": "python -m bench.call_overhead", "rows": [{
                  "model": "/m/student", "format": "onnx", "sentences": 10, "mean_tokens": 25.0, "padded_tokens_mean": 25.0,
                  "compiled_shapes": 1, "ms_per_sentence": {"runtime call": 0.4},
                  "ms_per_sentence_runs": {"runtime call": [0.45, 0.35]}}]}
    line = render(report).splitlines()[-1]
    assert line == "| student | onnx | 10 | 25.0 | 25.0 | 1 | runtime call | 0.400 | 2500 | 0.350-0.450 |"
