"""A wrong path, task, budget or --out is said at once: before the stage's heavy imports, in the stage's own words.

Each case runs ``compress`` in a fresh process, as a user does: exit status 2, one line on
stderr, and well within seconds (importing a stage's module alone takes 5-40 s here).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
import typing
from pathlib import Path

import pytest

from compress.cli import early_check
from compress.core.errors import CompressError
from compress.core.preflight import EARLY_OPTIONS
from compress.stages import COMMANDS, Stage

WALL_S = 10.0  # generous: the checks take well under a second; a stage's imports alone take longer than this on 2 busy cores
HEAVY = ("torch", "transformers", "datasets", "onnx", "onnxruntime", "openvino")


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    """A model folder (config.json is all the early checks read), a non-empty folder, a file and a train file."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "train.csv").write_text("text,label\ngood,pos\n")
    (tmp_path / "bad-task.yaml").write_text("task: sst3\n")
    (tmp_path / "nested.yaml").write_text("data:\n  train_file: gone.csv\n  dev_file: train.csv\n")
    return tmp_path


CASES = [
    (["eval", "--model", "/no/such/dir", "--task", "sst2"], "model directory /no/such/dir does not exist"),
    (["eval", "--model", "model", "--task", "sst3"], "argument --task: invalid choice: 'sst3'"),
    (["eval", "--model", "model", "--config", "bad-task.yaml"], "unknown task 'sst3'"),
    (["eval", "--model", "model", "--task", "sst2", "--data-file", "gone.csv"], "data file gone.csv does not exist"),
    (["latency", "--model", "model", "no-such-model"], "model directory no-such-model does not exist"),
    (["distill", "--teacher", "./no/such", "--task", "sst2", "--out", "new"],
     "model './no/such' is neither a directory nor a known hub model"),
    (["teacher", "finetune", "--model", "~/no/such/dir", "--task", "sst2", "--out", "new"],
     "model '~/no/such/dir' is neither a directory nor a known hub model"),
    (["auto", "--teacher", "model", "--budget", "p50<6ms", "--out", "new"], "bad budget 'p50<6ms': operator '<' is wrong"),
    (["auto", "--teacher", "model", "--out", "new"], "no budget given; pass e.g. --budget"),
    (["export", "--model", "model", "--out", "full"], "output directory full is not empty; pass --overwrite"),
    (["distill", "--teacher", "model", "--resume", "--out", "full"], "output directory full is not empty, so there is no "
                                                                     "interrupted run of its own to resume"),
    (["quantize", "--model", "model", "--out", "a-file"], "output a-file exists and is not a directory"),
    (["prune", "--model", "model", "--remove-heads", "0.5", "--out", "model"], "--out model is the input model"),
    (["teacher", "finetune", "--model", "model", "--task", "text-classification", "--train-file", "gone.csv",
      "--dev-file", "train.csv", "--out", "new"], "data file gone.csv does not exist"),
    (["heads", "--model", "model", "--config", "nested.yaml", "--out", "new"], "data file gone.csv does not exist"),
]


def _compress(argv: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "compress.cli", *argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)
    return proc, time.perf_counter() - started


@pytest.mark.e2e
@pytest.mark.parametrize("argv,said", CASES, ids=[" ".join(a)[:60] for a, _ in CASES])
def test_a_bad_input_is_refused_at_once_in_one_line(ws, argv, said):
    proc, wall = _compress(argv, ws)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and said in lines[0] and lines[0].startswith("compress "), proc.stderr
    assert wall < WALL_S, f"{wall:.1f} s"
    assert not (ws / "new").exists()


def test_the_refusal_imports_no_heavy_library(ws):
    code = ("import sys\nfrom compress.cli import main\ncode = main(['eval', '--model', '/no/such/dir', '--task', 'sst2'])\n"
            f"print(code, [m for m in {HEAVY!r} if m in sys.modules])")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ws, capture_output=True, text=True, timeout=300)
    assert proc.stdout.split("\n")[0] == "2 []", proc.stdout + proc.stderr


def test_what_the_stage_decides_is_left_to_it(ws):
    distill, export = COMMANDS.get("distill"), COMMANDS.get("export")
    for teacher in ("bert-base", "google-bert/bert-base-uncased", str(ws / "model")):  # a hub name is the stage's to fetch
        early_check(distill, ["--teacher", teacher, "--out", str(ws / "new")])
    early_check(export, ["--model", str(ws / "model"), "--out", str(ws / "full"), "--overwrite"])
    # A flag that argparse may read as an abbreviation of one the checks read: the full parser decides.
    early_check(export, ["--model", str(ws / "model"), "--out", str(ws / "full"), "--overw"])
    early_check(export, ["--mod", "/no/such/dir", "--out", str(ws / "new")])
    for asks in ("--help", "--he", "-h", "-qh"):  # help first
        early_check(export, ["--model", "/no/such/dir", "--out", str(ws / "new"), asks])
    with pytest.raises(CompressError, match="is not empty"):
        early_check(export, ["--model", str(ws / "model"), "--out", str(ws / "full")])


def test_each_stage_lists_the_early_options_its_config_has():
    from compress.core.config import choices_of, field_names, flag_name
    from compress.core.data.tasks import task_choices

    for name, entry in COMMANDS.items():
        if not isinstance(entry, Stage):
            continue
        cls = entry.config_class()
        assert sorted(entry.early) == sorted(n for n in field_names(cls) if n in EARLY_OPTIONS), name
        for option in entry.early:  # early_check declares the flags from their names: the config must not rename them
            f = _field(cls, option)
            assert flag_name(f) == "--" + option.replace("_", "-"), (name, option)
            if option == "task":
                assert choices_of(f) == task_choices(), name


def _field(cls, name: str) -> dataclasses.Field:
    """The field ``name`` of ``cls`` or of a config it nests."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name == name:
            return f
        if dataclasses.is_dataclass(hints[f.name]):
            try:
                return _field(hints[f.name], name)
            except LookupError:
                pass
    raise LookupError(name)
