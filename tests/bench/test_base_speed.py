"""bench.base.speed: the fastest folder per model, speed-ups by hand, the verdicts, the report's goals, the commands."""

from __future__ import annotations

import json
import shlex
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from bench.base import report, speed
from compress.core import hardware
from compress.core.errors import CompressError

# p50 ms on the real inputs at batch 1 and 32 per (model, form); the teacher's and 6L-768's CTranslate2 are refused.
P50 = {
    ("teacher", "torch"): (100.0, 2000.0), ("teacher", "onnx"): (80.0, 2100.0), ("teacher", "openvino"): (90.0, 1900.0),
    ("6L-768", "torch"): (45.0, 1000.0), ("6L-768", "onnx"): (40.0, 1050.0), ("6L-768", "openvino"): (42.0, 990.0),
    ("6L-384", "torch"): (20.0, 400.0), ("6L-384", "onnx"): (16.0, 380.0), ("6L-384", "openvino"): (18.0, 370.0),
    ("6L-384", "ctranslate2"): (15.0, 420.0),
    ("3L-384", "torch"): (10.0, 220.0), ("3L-384", "onnx"): (8.5, 205.0), ("3L-384", "openvino"): (9.0, 200.0),
    ("3L-384", "ctranslate2"): (8.0, 230.0),
    ("6L-768 int8", "int8"): (25.0, 600.0), ("6L-384 int8", "int8"): (8.0, 190.0), ("3L-384 int8", "int8"): (4.0, 100.0),
}
BACKENDS = {"torch": "torch", "onnx": "onnxruntime", "openvino": "openvino", "ctranslate2": "ctranslate2",
            "int8": "openvino-int8"}
TIMED_ON = "(timed on wnli's models, AMD EPYC (Zen 4))"
REFUSED = ("CTranslate2 has no converter for mpnet models (x); it converts bert, distilbert, roberta, xlm-roberta: "
           "export this one with --format onnx or --format openvino")


def _latency(folders: list[speed.Timed]) -> dict:
    """A latency.json holding the real-input rows of ``folders`` with the p50s of :data:`P50`."""
    rows = [{"model": str(t.folder), "name": t.folder.name, "backend": BACKENDS[t.form], "batch": b, "p50_ms": p,
             "sentences_per_s": b * 1000.0 / p}
            for t in folders for b, p in zip((1, 32), P50[(t.role, t.form)])]
    return {"kind": "latency", "when": "2026-12-08T03:00:00+00:00", "rows": [], "real_rows": rows,
            "hardware": {"cpu": "AMD EPYC", "microarchitecture": "Zen 4", "flags": ["avx2", "avx512_vnni"]},
            "real_inputs": {"source": "WNLI dev (../shared/data/glue)", "n": 71}}


def _timed(work: Path) -> list[speed.Timed]:
    return [t for t in speed.plan(work, "wnli") if (t.role, t.form) in P50]


def _speed(work: Path, vnni: bool = True) -> dict:
    timed = _timed(work)
    return speed.summarize(_latency(timed), timed, [], vnni=vnni, task="wnli", command="python -m bench.base.speed")


def test_the_fastest_folder_is_chosen_per_model_and_batch_size(tmp_path):
    roles = _speed(tmp_path)["roles"]
    assert roles["teacher"]["fastest"]["1"] == {"form": "onnx", "backend": "onnxruntime", "p50_ms": 80.0,
                                                "folder": str(tmp_path / "wnli" / "speed" / "teacher-onnx")}
    assert roles["teacher"]["fastest"]["32"]["form"] == "openvino"
    assert [roles["6L-384"]["fastest"][b]["form"] for b in ("1", "32")] == ["ctranslate2", "openvino"]
    assert roles["6L-768 int8"]["fastest"]["32"]["backend"] == "openvino-int8"
    assert "speedup" not in roles["teacher"]


def test_speed_ups_are_the_teachers_fastest_fp32_over_each_models_fastest(tmp_path):
    roles = _speed(tmp_path)["roles"]
    # batch 1: the teacher's onnx 80 ms; batch 32: its openvino 1900 ms
    assert roles["6L-768"]["speedup"] == pytest.approx({"1": 80 / 40, "32": 1900 / 990})
    assert roles["6L-384"]["speedup"] == pytest.approx({"1": 80 / 15, "32": 1900 / 370})
    assert roles["3L-384"]["speedup"] == pytest.approx({"1": 10.0, "32": 9.5})
    assert roles["6L-384 int8"]["speedup"] == pytest.approx({"1": 10.0, "32": 10.0})
    # each int8 over its own fp32's fastest: 6L-768's onnx 40 ms and openvino 990 ms
    assert roles["6L-768 int8"]["speedup_vs_fp32"] == pytest.approx({"1": 1.6, "32": 1.65})
    assert roles["6L-384 int8"]["speedup_vs_fp32"] == pytest.approx({"1": 15 / 8, "32": 370 / 190})
    assert roles["3L-384 int8"]["speedup_vs_fp32"] == pytest.approx({"1": 2.0, "32": 2.0})


def test_the_speed_clauses_are_met_at_both_batch_sizes_or_not_met(tmp_path):
    assert _speed(tmp_path)["goals"] == [
        f"- 6L-768 at >= 1.9x the teacher's fastest fp32: speed met: 2.00x at batch 1 and 1.92x at batch 32 "
        f"against >= 1.9x {TIMED_ON}",
        f"- 6L-384 at >= 5.0x the teacher's fastest fp32: speed met: 5.33x at batch 1 and 5.14x at batch 32 "
        f"against >= 5.0x {TIMED_ON}",
        f"- 3L-384 at >= 10.0x the teacher's fastest fp32: speed not met: 10.00x at batch 1 and 9.50x at batch 32 "
        f"against >= 10.0x {TIMED_ON}",
        f"- every int8 >= 1.8x over its own fp32 on a VNNI CPU: speed not met: lowest 1.60x (6L-768 int8 at batch 1) "
        f"against >= 1.8x {TIMED_ON}",
    ]


def test_without_vnni_the_int8_clause_gives_its_numbers_and_is_not_judged(tmp_path):
    line = _speed(tmp_path, vnni=False)["goals"][-1]
    assert line == ("- every int8 >= 1.8x over its own fp32 on a VNNI CPU: speed not judged: the CPU has no VNNI "
                    "(lowest 1.60x (6L-768 int8 at batch 1) against >= 1.8x; timed on wnli's models, AMD EPYC (Zen 4))")


def test_a_folder_without_real_input_rows_is_refused_in_one_line(tmp_path):
    timed = _timed(tmp_path)
    latency = _latency(timed)
    latency["real_rows"] = [r for r in latency["real_rows"] if not (r["model"].endswith("3L-384-onnx") and r["batch"] == 32)]
    with pytest.raises(CompressError, match=r"no real-input row of .*3L-384-onnx at batch 32: time the folders again"):
        speed.summarize(latency, timed, [], vnni=True, task="wnli", command="c")


def _state(per_role: dict[str, dict[str, float]]) -> dict:
    names = {"sst2": "accuracy", "mrpc": "accuracy", "stsb": "spearmanr", "cola": "matthews_correlation",
             "rte": "accuracy", "wnli": "accuracy"}
    return {"rows": {f"{task}/{role}": {"task": task, "role": role, "metrics": {names[task]: value}}
                     for role, scores in per_role.items() for task, value in scores.items()}}


TEACHER = {"sst2": 92.0, "mrpc": 86.0, "stsb": 88.0, "cola": 55.0, "rte": 66.0, "wnli": 56.0}  # average 73.8333


def _six_tasks() -> dict:
    fp32 = {"6L-768": {t: v - 1.0 for t, v in TEACHER.items()}, "6L-384": {t: v - 2.0 for t, v in TEACHER.items()},
            "3L-384": {t: v - 4.0 for t, v in TEACHER.items()}}
    int8 = {"6L-768 int8": {t: v - 0.5 for t, v in fp32["6L-768"].items()},
            "6L-384 int8": {t: v + 0.3 for t, v in fp32["6L-384"].items()},  # a gain is no drop
            "3L-384 int8": {**fp32["3L-384"], "cola": 49.75}}  # 51.00 - 49.75: the largest drop, 1.25
    return _state({"teacher": TEACHER, **fp32, **int8})


def test_the_reports_goal_lines_take_their_speed_clauses_from_speed_json(tmp_path):
    lines = report.goal_lines(_six_tasks(), _speed(tmp_path))
    assert lines[0] == "- teacher six-task average >= BERT-base's 74.9: accuracy not met: 73.83 against 74.90"
    assert lines[1] == ("- 6L-768 >= DistilBERT's 72.2 at >= 1.9x: accuracy met: 72.83 against 72.20; speed met: "
                        f"2.00x at batch 1 and 1.92x at batch 32 against >= 1.9x {TIMED_ON}")
    # 0.95 x 73.8333 = 70.1417 > 69.8333
    assert lines[3] == ("- 3L-384 >= 95% of the teacher at >= 10x: accuracy not met: 69.83 against 70.14; speed not met: "
                        f"10.00x at batch 1 and 9.50x at batch 32 against >= 10.0x {TIMED_ON}")
    assert lines[4] == ("- every int8 within 1 point of its fp32 and >= 1.8x faster on a VNNI CPU: accuracy not met: "
                        "largest drop 1.25 points (3L-384 on cola) against 1.00; speed not met: lowest 1.60x "
                        f"(6L-768 int8 at batch 1) against >= 1.8x {TIMED_ON}")
    assert len(lines) == 5


def test_without_speed_json_every_speed_clause_is_not_measured_yet():
    lines = report.goal_lines(_six_tasks())
    assert lines[2] == ("- 6L-384 >= 97% of the teacher at >= 5x: accuracy met: 71.83 against 71.62; "
                        "speed-up not measured yet (>= 5.0x wanted)")
    assert lines[4] == ("- every int8 within 1 point of its fp32 and >= 1.8x faster on a VNNI CPU: accuracy not met: "
                        "largest drop 1.25 points (3L-384 on cola) against 1.00; "
                        "speed-up not measured yet (>= 1.8x on a VNNI CPU wanted)")


def test_a_speed_clause_stands_beside_an_accuracy_not_measured_yet(tmp_path):
    lines = report.goal_lines(_state({"teacher": {"sst2": 92.0}}), _speed(tmp_path))
    assert lines[1] == ("- 6L-768 >= DistilBERT's 72.2 at >= 1.9x: accuracy not measured yet (no 6L-768 or teacher "
                        "score on sst2, mrpc, stsb, cola, rte, wnli); speed met: 2.00x at batch 1 and 1.92x at batch 32 "
                        f"against >= 1.9x {TIMED_ON}")
    assert lines[4].startswith("- every int8 within 1 point of its fp32 and >= 1.8x faster on a VNNI CPU: accuracy not "
                               "measured yet (no student or int8 score on sst2, mrpc, stsb, cola, rte, wnli); speed not met")


def _models(work: Path) -> None:
    """Finished model folders (compression.json only) as python -m bench.base leaves them for wnli."""
    for t in speed.plan(work, "wnli"):
        if t.form in ("torch", "int8"):
            t.folder.mkdir(parents=True)
            (t.folder / "compression.json").write_text("{}")


def test_dry_run_prints_the_missing_exports_and_one_latency_call_over_every_folder(tmp_path, capsys):
    work, out = tmp_path / "runs", tmp_path / "results"
    _models(work)
    kept = work / "wnli" / "speed" / "6L-384-onnx"  # an earlier run's export: kept, not made again
    kept.mkdir(parents=True)
    (kept / "compression.json").write_text("{}")
    assert speed.main(["--work", str(work), "--task", "wnli", "--out", str(out), "--dry-run",
                       "--repeats", "5", "--max-seconds", "4", "--bursts", "5"]) == 0
    commands = [shlex.split(line) for line in capsys.readouterr().out.splitlines()]
    exports, latency = commands[:-1], commands[-1]
    made = [(c[c.index("--model") + 1], c[c.index("--format") + 1]) for c in exports]
    assert len(made) == 11 and all(c[c.index("--quiet") + 1] == "export" for c in exports)
    assert made[:3] == [(str(work / "wnli" / "teacher"), f) for f in ("onnx", "openvino", "ctranslate2")]
    assert (str(work / "wnli" / "student-6L-384"), "onnx") not in made
    assert latency[latency.index("-m") + 2] == "latency"
    start = latency.index("--model") + 1
    folders = latency[start:latency.index("--batch")]
    assert folders == [str(t.folder) for t in speed.plan(work, "wnli")] and len(folders) == 19
    options = latency[latency.index("--batch"):]
    assert options == ["--batch", "1,32", "--seq", "128", "--lengths", "wnli", "--data-dir", "../shared/data/glue",
                       "--lengths-batch", "32", "--repeats", "5", "--max-seconds", "4", "--bursts", "5",
                       "--out", str(out / "speed-wnli")]
    assert not out.exists()


def test_missing_model_folders_are_refused_in_one_line(tmp_path, capsys):
    work = tmp_path / "runs"
    _models(work)
    (work / "wnli" / "student-3L-384-int8" / "compression.json").unlink()
    assert speed.main(["--work", str(work), "--task", "wnli", "--out", str(tmp_path / "out"), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"bench.base.speed: no finished model folder for 3L-384 int8 under {work / 'wnli'} (no "
                   "compression.json): run python -m bench.base --tasks wnli first, or time another --task")


def test_a_run_records_refused_exports_times_the_rest_once_and_judges_base_md(tmp_path, monkeypatch, capsys):
    work, out = tmp_path / "runs", tmp_path / "results"
    _models(work)
    out.mkdir()
    (out / "base.json").write_text(json.dumps(_six_tasks()))
    by_folder = {str(t.folder): t for t in speed.plan(work, "wnli")}
    latency_calls, real_run, vnni = [], subprocess.run, replace(hardware.precisions(), vnni=True)

    def run(command, **kwargs):
        if command[:3] != speed.CLI:  # not a toolkit command (the module is shared): run it
            return real_run(command, **kwargs)
        if "export" in command:
            target = Path(command[command.index("--out") + 1])
            if target.name in ("teacher-ctranslate2", "6L-768-ctranslate2"):
                return subprocess.CompletedProcess(command, 2, stderr=f"a warning\ncompress export: error: {REFUSED}\n")
            target.mkdir(parents=True)
            (target / "compression.json").write_text("{}")
            return subprocess.CompletedProcess(command, 0, stderr="")
        latency_calls.append(command)
        models = command[command.index("--model") + 1:command.index("--batch")]
        (out / "speed-wnli" / "latency.json").write_text(json.dumps(_latency([by_folder[m] for m in models])))
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(speed.subprocess, "run", run)
    monkeypatch.setattr(speed, "precisions", lambda: vnni)
    assert speed.main(["--work", str(work), "--task", "wnli", "--out", str(out)]) == 0
    assert len(latency_calls) == 1
    models = latency_calls[0][latency_calls[0].index("--model") + 1:latency_calls[0].index("--batch")]
    assert len(models) == 17 and not any(m.endswith("-ctranslate2") and ("teacher" in m or "6L-768" in m) for m in models)
    result = json.loads((out / "speed.json").read_text())
    refused = [(e["role"], e["reason"]) for e in result["exports"] if e["status"] == "refused"]
    assert refused == [("teacher", REFUSED), ("6L-768", REFUSED)]
    assert result["vnni"] is True and result["cpu"] == "AMD EPYC (Zen 4)" and result["flags"] == ["avx2", "avx512_vnni"]
    assert (out / "speed-wnli" / "command.txt").read_text().strip() == shlex.join(latency_calls[0])
    page = (out / "speed.md").read_text()
    assert f"- no ctranslate2 export of teacher: {REFUSED}" in page
    assert "| teacher | onnx | onnxruntime | **80.00** | 2100.00 |" in page
    assert "| 6L-768 int8 | 1 | int8 (openvino-int8) | 25.00 | 3.20x | 1.60x |" in page
    base = (out / "base.md").read_text()
    assert f"speed met: 2.00x at batch 1 and 1.92x at batch 32 against >= 1.9x {TIMED_ON}" in base
    assert "speed-up not measured yet" not in base
    assert "bench.base.speed: no ctranslate2 export of teacher: CTranslate2 has no converter" in capsys.readouterr().err
    # A second run keeps the exports and makes only the refused ones again.
    latency_calls.clear()
    assert speed.main(["--work", str(work), "--task", "wnli", "--out", str(out)]) == 0
    kept = [e["status"] for e in json.loads((out / "speed.json").read_text())["exports"]]
    assert kept.count("kept") == 10 and kept.count("refused") == 2 and len(latency_calls) == 1
