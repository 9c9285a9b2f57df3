"""Logs a person can read: plain lines when not on a terminal, --quiet, --log-level, the history while training."""

from __future__ import annotations

import io
import json
import logging
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from compress.cli import COMMANDS, main
from compress.core import logs
from compress.core.data import synthetic
from compress.core.checkpoints import PROGRESS_FILE
from compress.core.train import TrainConfig, train
from compress.core.model.shapes import resolve_shape
from compress.teacher.create import create_model
from tests.conftest import make_tiny_model
from tests.core.test_train import _collate

ROOT = Path(__file__).resolve().parents[2]
# step 6/8  loss 0.6931  lr 1.0e-03  812.5 ex/s  (the loss terms a stage logs come after the loss)
STEP_LINE = re.compile(r"^step (\d+)/(\d+)  loss \d+\.\d{4}(  \w+ -?\d+\.\d{4})*  lr \d\.\de[-+]\d\d  \d+\.\d ex/s$")
EVAL_LINE = re.compile(r"^step (\d+)/(\d+)  eval  accuracy \d+\.\d\d.*$")


@pytest.fixture
def generated(tmp_path):
    """A 2-layer classifier and an SST-2 folder of 128 training rows: 4 steps per epoch at batch 32."""
    data = synthetic.write_sst2_layout(tmp_path / "data", n_train=128, n_dev=32, n_test=8)
    vocab = synthetic.write_vocab(tmp_path / "vocab.txt")
    init = create_model(resolve_shape("2L-64"), tmp_path / "init", tokenizer=vocab, task="sst2", max_positions=64)
    return data, init


def _finetune_args(data, init, out, *extra):
    return ["teacher", "finetune", "--model", str(init), "--task", "sst2", "--data-dir", str(data), "--epochs", "2",
            "--batch-size", "32", "--lr", "2e-3", "--log-every", "2", "--out", str(out), *extra]


@pytest.mark.e2e
def test_redirected_run_prints_one_plain_line_per_log_step(generated, tmp_path):
    data, init = generated
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "compress.cli", *_finetune_args(data, init, tmp_path / "ft")],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    err = proc.stderr
    assert "\r" not in err and "%|" not in err and "it/s" not in err  # no bar of ours or of transformers
    steps = [STEP_LINE.match(line) for line in err.splitlines() if line.startswith("step ") and "eval" not in line]
    assert all(steps) and [int(m.group(1)) for m in steps] == [2, 4, 6, 8], err
    evals = [line for line in err.splitlines() if EVAL_LINE.match(line)]
    assert len(evals) == 2, err  # one per epoch
    assert "accuracy" in proc.stdout  # the result table
    # the history of the finished run is in the output's metrics.json
    history = next(r for r in json.loads((tmp_path / "ft" / "metrics.json").read_text())["results"]
                   if r["kind"] == "training")["history"]
    assert [h["step"] for h in history if "loss" in h] == [2, 4, 6, 8]
    assert all(h["examples_per_second"] > 0 for h in history if "loss" in h)


def test_quiet_prints_the_result_and_no_progress(generated, tmp_path, capsys):
    data, init = generated
    assert main(_finetune_args(data, init, tmp_path / "ft", "--quiet")) == 0
    captured = capsys.readouterr()
    assert "step " not in captured.err and "\r" not in captured.err
    assert "accuracy" in captured.out
    assert captured.err.strip().splitlines() == [f"wrote {tmp_path / 'ft'}"]  # where the output went, nothing else


def test_log_level_debug_is_accepted_by_every_command(capsys):
    for name in COMMANDS:
        for flags in (["--log-level", "debug"], ["--quiet"], ["-q", "--log-level", "error"]):
            with pytest.raises(SystemExit) as exit_info:
                main([*name.split(), *flags, "--help"])
            assert exit_info.value.code == 0, name
        text = capsys.readouterr().out
        assert "--log-level {debug,info,warning,error}" in text and "--quiet" in text, name
    assert main(["tasks", "--log-level", "debug"]) == 0 and "sst2" in capsys.readouterr().out
    assert main(["--quiet", "tasks"]) == 0 and "sst2" in capsys.readouterr().out  # before the command too
    with pytest.raises(SystemExit):
        main(["--log-level", "debug", "-q", "teacher", "finetune", "--help"])
    assert "--log-every" in capsys.readouterr().out  # the command's own options are still built
    with pytest.raises(SystemExit):
        main(["tasks", "--log-level", "verbose"])
    assert "invalid choice: 'verbose'" in capsys.readouterr().err


def test_library_loggers_and_bars_follow_the_level():
    import datasets
    import huggingface_hub.utils as hub
    import transformers.utils.logging as hf

    before = (hf.is_progress_bar_enabled(), datasets.is_progress_bar_enabled(), hub.are_progress_bars_disabled())
    with logs.configured(quiet=True):
        assert not logs.show_bars() and logs.LOGGER.level == logging.ERROR
        assert hf.get_verbosity() == logging.ERROR and logging.getLogger("torch").level == logging.ERROR
        assert not hf.is_progress_bar_enabled() and not datasets.is_progress_bar_enabled()
        assert hub.are_progress_bars_disabled()
        assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"  # for libraries imported later
    assert (hf.is_progress_bar_enabled(), datasets.is_progress_bar_enabled(), hub.are_progress_bars_disabled()) == before
    with logs.configured("info"):
        assert hf.get_verbosity() == logging.WARNING and logging.getLogger("nncf").level == logging.WARNING
    with logs.configured("debug"):
        assert hf.get_verbosity() == logging.DEBUG and logs.LOGGER.level == logging.DEBUG


def test_bars_show_on_a_terminal_only(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stderr", io.StringIO())
    with logs.progress(range(3)) as bar:
        assert not logs.show_bars() and bar.disable
    monkeypatch.setattr(sys, "stderr", Terminal())
    with logs.progress(range(3)) as bar:
        assert logs.show_bars() and not bar.disable
    with logs.configured(quiet=True):
        assert not logs.show_bars()
    with logs.configured("warning"):
        assert not logs.show_bars()


def _toy(n=32):
    g = torch.Generator().manual_seed(0)
    items = []
    for i in range(n):
        ids = torch.randint(11, 60, (8,), generator=g)
        items.append({"input_ids": torch.cat([torch.tensor([2]), ids]), "labels": i % 2})
    return items


def _loss(model, batch):
    out = model(**batch)
    return out.loss, {"loss_aux": out.loss * 0.5}


def test_history_file_grows_while_training(tmp_path, capsys, monkeypatch):
    # Tiny steps take microseconds: without this, a log step skips the write while writing costs more than 5%.
    monkeypatch.setattr("compress.core.train.PROGRESS_SHARE", math.inf)
    work = tmp_path / "w"
    seen = []

    def evaluate(model):  # called mid-run: what a person reading the file would see now
        record = json.loads((work / PROGRESS_FILE).read_text())["results"][0]
        seen.append((record["status"], record["step"], [h["step"] for h in record["history"] if "loss" in h]))
        return {"accuracy": 50.0}

    cfg = TrainConfig(epochs=3, batch_size=8, lr=1e-3, log_every=2, eval_every=4, seed=0, group_by_length=False)
    with logs.configured():
        train(make_tiny_model(), _toy(), _collate, cfg, loss_fn=_loss, work_dir=work, evaluate=evaluate,
              select="accuracy", desc="toy")
    assert seen == [("running", 4, [2, 4]), ("running", 8, [2, 4, 6, 8]), ("running", 12, [2, 4, 6, 8, 10, 12])]
    final = json.loads((work / PROGRESS_FILE).read_text())["results"][0]
    assert final["status"] == "done" and final["kind"] == "training" and final["best_step"] == 4
    assert [h["step"] for h in final["history"] if "eval" in h] == [4, 8, 12]
    lines = capsys.readouterr().err.splitlines()
    assert [line.split("  ")[0] for line in lines if STEP_LINE.match(line)] == [f"step {s}/12" for s in range(2, 13, 2)]
    assert all("  loss_aux " in line for line in lines if STEP_LINE.match(line))
    assert sum(bool(EVAL_LINE.match(line)) for line in lines) == 3
    assert lines.count("step 4/12  eval  accuracy 50.00  (best)") == 1
