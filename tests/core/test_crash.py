"""Crash safety: SIGKILL a training run at different steps, --resume, and end with identical weights."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from compress.core.data import synthetic
from compress.core.compat import wordpiece_tokenizer

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def _cli(args: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "compress.cli", *args], cwd=cwd, env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _finish(args: list[str], cwd: Path) -> None:
    proc = _cli(args, cwd)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-2000:]


def _checkpoint_steps(work: Path) -> list[int]:
    root = work / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(int(p.name.split("-")[1]) for p in root.iterdir() if p.name.startswith("step-"))


def _kill_after(args: list[str], cwd: Path, work: Path, step: int, delay: float) -> None:
    """Start a run, SIGKILL it ``delay`` seconds after its checkpoint for ``step`` appears."""
    proc = _cli(args, cwd)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if any(s >= step for s in _checkpoint_steps(work)):
            time.sleep(delay)  # somewhere in the following steps, maybe mid-way through the next save
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be killed; lower the kill step"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL


def _weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(path / "model.safetensors")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("crash")
    rows = synthetic.examples(1200, seed=1)
    docs = ["\n".join(t for t, _ in rows[i : i + 8]) for i in range(0, len(rows), 8)]
    (root / "corpus.txt").write_text("\n\n".join(docs) + "\n")
    synthetic.write_vocab(root / "vocab.txt")
    synthetic.write_sst2_layout(root / "data", n_train=400, n_dev=40, n_test=8)
    return root


PRETRAIN = ["teacher", "pretrain", "--corpus", "corpus.txt", "--tokenizer", "vocab.txt", "--shape", "2L-32-64-4H",
            "--max-positions", "64", "--phase1-length", "32", "--phase2-length", "64", "--phase1-fraction", "0.7",
            "--max-steps", "30", "--batch-size", "16", "--lr", "1e-3", "--save-every", "3", "--eval-every", "10",
            "--seed", "11"]


@pytest.mark.slow
def test_pretrain_killed_three_times_resumes_to_identical_weights(workspace):
    _finish([*PRETRAIN, "--out", "ref"], workspace)
    reference = _weights(workspace / "ref")
    rng = random.Random(0)
    work = workspace / ".run.work"
    for step in (3, 12, 21):  # phase 1 early, phase 1 late, phase 2
        _kill_after([*PRETRAIN, "--out", "run", *(["--resume"] if work.exists() else [])], workspace, work,
                    step, rng.uniform(0.0, 0.4))
        assert not (workspace / "run").exists()  # nothing published by a killed run
    _finish([*PRETRAIN, "--out", "run", "--resume"], workspace)
    got = _weights(workspace / "run")
    assert set(got) == set(reference)
    assert all(torch.equal(got[k], reference[k]) for k in reference)
    assert not work.exists()  # checkpoints are cleaned up after success


@pytest.mark.slow
def test_distill_killed_and_resumed_matches(workspace):

    from tests.conftest import make_tiny_model, save_tiny

    tok = wordpiece_tokenizer(workspace / "vocab.txt")
    save_tiny(make_tiny_model(vocab_size=len(tok), hidden_dropout_prob=0.1, seed=2), tok, workspace / "teacher")
    args = ["distill", "--teacher", "teacher", "--task", "sst2", "--data-dir", "data", "--student", "1L-32",
            "--heads", "4", "--init", "random", "--epochs", "3", "--batch-size", "16", "--lr", "1e-3",
            "--save-every", "5", "--cache-dir", "cache", "--seed", "5"]
    _finish([*args, "--out", "ref-distill"], workspace)
    work = workspace / ".student.work"
    for step in (5, 40):
        _kill_after([*args, "--out", "student", *(["--resume"] if work.exists() else [])], workspace,
                    work / "joint", step, 0.1)
    _finish([*args, "--out", "student", "--resume"], workspace)
    reference, got = _weights(workspace / "ref-distill"), _weights(workspace / "student")
    assert all(torch.equal(got[k], reference[k]) for k in reference)


@pytest.mark.slow
def test_a_bf16_finetune_killed_twice_resumes_to_identical_weights(workspace):
    """Benchmarks train in bf16 where the CPU has it: autocast, the optimizer's fp32 state and the data order all come
    back from the checkpoint (on a CPU without native bf16 the same path runs emulated, slower)."""
    from tests.conftest import make_tiny_model, save_tiny

    tok = wordpiece_tokenizer(workspace / "vocab.txt")
    save_tiny(make_tiny_model(vocab_size=len(tok), hidden_dropout_prob=0.1, seed=4), tok, workspace / "bf16-base")
    args = ["teacher", "finetune", "--model", "bf16-base", "--task", "sst2", "--data-dir", "data", "--epochs", "2",
            "--batch-size", "16", "--lr", "1e-3", "--save-every", "4", "--precision", "bf16", "--seed", "3"]
    _finish([*args, "--out", "ref-bf16"], workspace)
    work = workspace / ".tuned-bf16.work"
    for step in (4, 32):
        _kill_after([*args, "--out", "tuned-bf16", *(["--resume"] if work.exists() else [])], workspace, work, step, 0.1)
    _finish([*args, "--out", "tuned-bf16", "--resume"], workspace)
    reference, got = _weights(workspace / "ref-bf16"), _weights(workspace / "tuned-bf16")
    assert set(got) == set(reference) and all(torch.equal(got[k], reference[k]) for k in reference)
    record = json.loads((workspace / "tuned-bf16" / "compression.json").read_text())
    assert record["config"]["train"]["precision"] == "bf16"


def _with(args: list[str], flag: str, value: str) -> list[str]:
    """``args`` with ``flag``'s value replaced."""
    i = args.index(flag)
    return [*args[: i + 1], value, *args[i + 2 :]]


def _fail(args: list[str], cwd: Path) -> str:
    """Run a command that must fail with a CompressError; its last stderr line."""
    proc = _cli(args, cwd)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode not in (0, -signal.SIGKILL), err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    return err.strip().splitlines()[-1]


@pytest.mark.e2e
def test_fp16_on_a_cpu_leaves_no_work_dir(workspace):
    line = _fail([*PRETRAIN, "--out", "fp16", "--precision", "fp16", "--device", "cpu"], workspace)
    assert "fp16 needs a CUDA GPU" in line
    assert not (workspace / ".fp16.work").exists() and not (workspace / "fp16").exists()


@pytest.mark.slow
def test_diverged_resume_then_the_advised_lower_lr_finishes(workspace):
    """kill -9, resume with an overflowing --lr (a clean stop naming the checkpoint), then do what it says."""
    import json

    work = workspace / ".lr.work"
    _kill_after([*PRETRAIN, "--out", "lr"], workspace, work, 3, 0.0)
    line = _fail([*_with(PRETRAIN, "--lr", "1e39"), "--out", "lr", "--resume"], workspace)
    assert "the optimizer step overflowed" in line and "resume from it with the same options plus --resume and a lower --lr" in line
    checkpoint = int(line.split("/checkpoints/step-")[1][:8])
    assert checkpoint in _checkpoint_steps(work)  # named, and kept
    _finish([*_with(PRETRAIN, "--lr", "5e-4"), "--out", "lr", "--resume"], workspace)
    (training,) = [r for r in json.loads((workspace / "lr" / "metrics.json").read_text())["results"] if r["kind"] == "training"]
    changes = [h for h in training["history"] if "changed" in h]
    assert changes == [{"step": checkpoint, "changed": {"lr": {"from": 1e-3, "to": 5e-4}}}]
    assert training["steps"] == 30 and not work.exists()
