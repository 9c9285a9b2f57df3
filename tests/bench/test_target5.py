"""bench.target5: an earlier headline's target-5 sides timed again (the timing faked), judged, written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import bench.target5 as target5
from tests.bench.test_headline import MODELS, report, turns_report


def moved(value, root: Path):
    """The hand-made reports' model folders ("w/NAME") under ``root``."""
    return json.loads(json.dumps(value).replace('"w/', f'"{root.as_posix()}/'))


def headline(tmp_path: Path, made=("teacher", "teacher-ov", "s3-int8", "s3")) -> Path:
    """An earlier headline run's folder: bench.json with the hand-made table, and the model folders in ``made``."""
    work = tmp_path / "work"
    for name in made:
        (work / name).mkdir(parents=True)
        (work / name / "config.json").write_text("{}")
    folder = tmp_path / "headline"
    folder.mkdir()
    (folder / "bench.json").write_text(json.dumps({
        "latency": moved(report(), work), "models": moved(MODELS, work), "int8": {}, "base": "bert-base-shape"}))
    glue = tmp_path / "data" / "glue" / "SST-2"
    glue.mkdir(parents=True)
    (glue / "dev.tsv").write_text("sentence\tlabel\n")
    return folder


def test_the_sides_are_timed_again_and_target_5_judged_on_them(tmp_path, monkeypatch):
    folder, seen = headline(tmp_path), {}

    def fake_turns(latency, models, glue, runs):
        seen.update(glue=glue, runs=runs, rows=len(latency["rows"]), models=len(models))
        return moved(turns_report(), tmp_path / "work")

    monkeypatch.setattr(target5, "real_in_turns", fake_turns)
    monkeypatch.setattr(target5, "hardware", lambda: {"cpu": "AMD EPYC"})
    monkeypatch.setattr(target5, "package_versions", lambda: {"torch": "2"})
    out = tmp_path / "out"
    args = ["--headline", str(folder), "--data", str(tmp_path / "data"), "--out", str(out), "--runs", "2"]
    assert target5.main(args) == 0
    assert seen == {"glue": (tmp_path / "data" / "glue").absolute(), "runs": 2, "rows": len(report()["rows"]),
                    "models": len(MODELS)}
    record = json.loads((out / "turns.json").read_text())
    assert record["source"] == str(folder) and record["hardware"] == {"cpu": "AMD EPYC"}
    t = record["target_5"]  # per run: best teacher 200, 210, 190; the student 2500, 2400, 2000
    assert t["met"] and t["model"] == str(tmp_path / "work" / "s3-int8") and t["teacher_backend"] == "openvino"
    assert t["speedup"] == pytest.approx(2400 / 200) and t["speedup_min"] == pytest.approx(2000 / 190)
    text = (out / "turns.md").read_text().splitlines()
    assert text[0] == f"# Target 5 timed again in turns, on the models of {folder}"
    assert text[2].startswith("5. MET: real SST-2 dev sentences at batch 1") and text[2].endswith("taking turns)")
    assert json.loads(text[3]) == {k: v for k, v in t.items() if k != "target"}
    assert "| 3L int8 | onnxruntime-int8 | 2400 | 2500, 2400, 2000 | 41, 40, 38 |" in text


def test_a_headline_whose_models_are_gone_or_without_bench_json_is_refused_before_timing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(target5, "real_in_turns", lambda *a: pytest.fail("nothing is timed"))
    folder = headline(tmp_path, made=("teacher", "teacher-ov", "s3"))  # the fastest student's folder is gone
    args = ["--headline", str(folder), "--data", str(tmp_path / "data"), "--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit):
        target5.main(args)
    assert f"{tmp_path / 'work' / 's3-int8'}, a side of target 5, is not a model folder any more" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        target5.main(["--headline", str(tmp_path), "--data", str(tmp_path / "data"), "--out", str(tmp_path / "out")])
    assert "no bench.json in" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_table_without_both_sides_is_refused():
    old = {"latency": report(), "models": [m for m in MODELS if m["group"] != "teacher"]}
    assert "no teacher fp32 row or no student" in target5.check_sides(old)
