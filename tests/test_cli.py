"""The command line: help that teaches, one-line errors with non-zero exits, the eval path end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from compress.cli import COMMANDS, build_parser, main

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args, env=None):
    """The real console entry point in a subprocess: exit code, stdout, stderr."""
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "compress.cli", *map(str, args)],
        capture_output=True, text=True, cwd=ROOT, env=full_env, timeout=300,
    )
    return proc.returncode, proc.stdout, proc.stderr


def test_top_level_help_lists_commands():
    text = build_parser().format_help()
    for name in ("eval", "latency", "tasks", "init", "demo", "teacher"):
        assert name in text
    assert "examples:" in text


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_subcommand_help_has_examples(name, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*name.split(), "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "examples:" in out and f"compress {name}" in out
    examples = [line for line in out.split("examples:")[-1].splitlines() if line.strip().startswith("compress ")]
    assert 2 <= len(examples) <= 3, examples


def test_eval_help_documents_every_option(capsys):
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    out = capsys.readouterr().out
    for flag in ("--task", "--split", "--data-dir", "--data-file", "--columns", "--max-eval-examples", "--submission", "--eval-batch-size", "--doc-stride"):
        assert flag in out


def _one_line_error(code, out, err):
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.e2e
def test_usage_error_is_one_line():
    line = _one_line_error(*run_cli("eval", "--task", "sst2"))
    assert "the following arguments are required: --model" in line and "--help" in line


def test_missing_model_dir_is_one_line(tmp_path):
    line = _one_line_error(*run_cli("eval", "--model", tmp_path / "nope", "--task", "sst2"))
    assert line.startswith("compress eval: error: model directory") and "does not exist" in line


@pytest.mark.e2e
def test_offline_hub_is_one_line(tiny_model_dir):
    line = _one_line_error(*run_cli("eval", "--model", tiny_model_dir, "--task", "sst2"))
    assert "Hugging Face hub" in line and "--data-dir" in line


@pytest.mark.e2e
def test_bad_option_value_is_one_line(tiny_model_dir):
    line = _one_line_error(*run_cli("eval", "--model", tiny_model_dir, "--task", "sst2", "--eval-batch-size", "0"))
    assert "--eval-batch-size must be at least 1" in line
    line = _one_line_error(*run_cli("eval", "--model", tiny_model_dir, "--task", "sst9"))
    assert "invalid choice: 'sst9'" in line and "sst2" in line


def test_eval_cli_prints_table_and_appends_metrics(tiny_model_dir, tmp_path, capsys):
    glue = tmp_path / "glue" / "SST-2"
    glue.mkdir(parents=True)
    (glue / "dev.tsv").write_text("sentence\tlabel\nthe movie is good .\t1\nthe movie is bad .\t0\n")
    assert main(["eval", "--model", str(tiny_model_dir), "--task", "sst-2", "--data-dir", str(tmp_path / "glue")]) == 0
    out = capsys.readouterr().out
    assert "sst2" in out and "accuracy" in out
    results = json.loads((tiny_model_dir / "metrics.json").read_text())["results"]
    assert results[-1]["task"] == "sst2" and results[-1]["n"] == 2


def test_eval_with_config_file(tiny_model_dir, tmp_path, capsys):
    glue = tmp_path / "SST-2"
    glue.mkdir()
    (glue / "dev.tsv").write_text("sentence\tlabel\nthe movie is good .\t1\n")
    cfg = tmp_path / "eval.yaml"
    cfg.write_text(f"task: sst2\ndata_dir: {tmp_path}\neval_batch_size: 4\n")
    assert main(["eval", "--model", str(tiny_model_dir), "--config", str(cfg), "--no-record"]) == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("task: sst2\nbatchsize: 4\n")
    assert main(["eval", "--model", str(tiny_model_dir), "--config", str(bad)]) == 2
    assert "unknown option 'batchsize' (did you mean 'eval_batch_size'?)" in capsys.readouterr().err


def test_init_creates_a_loadable_model(tmp_path, tokenizer, capsys):
    from compress.core.formats.records import read_compression
    from compress.core.formats.runtime import load_model

    vocab = tmp_path / "tok" / "vocab.txt"
    out = tmp_path / "m"
    assert main(["init", "--shape", "2L-64", "--task", "mnli", "--tokenizer", str(vocab), "--max-positions", "64", "--out", str(out)]) == 0
    model = load_model(out)
    assert model.config.num_hidden_layers == 2 and model.config.hidden_size == 64
    assert model.config.id2label[2] == "contradiction"
    assert read_compression(out)["stage"] == "create"
    assert main(["init", "--shape", "2L-64", "--tokenizer", str(vocab), "--out", str(out)]) == 2
    assert "not empty; pass --overwrite" in capsys.readouterr().err
    assert main(["init", "--shape", "7X", "--tokenizer", str(vocab), "--out", str(tmp_path / "x")]) == 2
    assert "unknown shape '7X'" in capsys.readouterr().err


def test_tasks_lists_the_registry(capsys):
    assert main(["tasks"]) == 0
    out = capsys.readouterr().out
    assert "entailment, neutral, contradiction" in out and "squad_v2" in out


# ---------------------------------------------------------------------------- failures that are not CompressErrors


def _single_line(err):
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("exception, expected", [
    (ZeroDivisionError("division by zero"), "ZeroDivisionError: division by zero (an internal error; rerun with --debug"),
    (PermissionError(13, "Permission denied", "/x"), "PermissionError: [Errno 13] Permission denied: '/x' (rerun with --debug"),
])
def test_unexpected_exception_is_one_line(exception, expected, tiny_model_dir, monkeypatch, capsys):
    def boom(*args, **kwargs):
        raise exception

    monkeypatch.delenv("COMPRESS_DEBUG", raising=False)
    monkeypatch.setattr("compress.eval.evaluate.evaluate", boom)
    assert main(["eval", "--model", str(tiny_model_dir), "--task", "sst2"]) == 1
    line = _single_line(capsys.readouterr().err)
    assert line.startswith("compress eval: error: " + expected), line


def test_debug_flag_and_variable_show_the_traceback(tiny_model_dir, monkeypatch, capsys):
    def boom(*args, **kwargs):
        raise ZeroDivisionError("division by zero")

    monkeypatch.delenv("COMPRESS_DEBUG", raising=False)
    monkeypatch.setattr("compress.eval.evaluate.evaluate", boom)
    argv = ["eval", "--model", str(tiny_model_dir), "--task", "sst2"]
    for debug in ([*argv, "--debug"], ["--debug", *argv]):  # after the command or before it
        with pytest.raises(ZeroDivisionError):
            main(debug)
    monkeypatch.setenv("COMPRESS_DEBUG", "0")  # "0" is off
    assert main(argv) == 1
    monkeypatch.setenv("COMPRESS_DEBUG", "1")
    with pytest.raises(ZeroDivisionError):
        main(argv)


@pytest.mark.e2e
def test_unexpected_exception_in_a_real_process(tiny_model_dir):
    """The console entry point: one line and status 1; with COMPRESS_DEBUG=1 the traceback."""
    script = ("import sys, compress.eval.evaluate as e\n"
              "def boom(*a, **k): raise ZeroDivisionError('division by zero')\n"
              "e.evaluate = boom\n"
              "from compress.cli import main\n"
              f"sys.exit(main(['eval', '--model', {str(tiny_model_dir)!r}, '--task', 'sst2']))\n")
    env = {k: v for k, v in os.environ.items() if k != "COMPRESS_DEBUG"}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 1
    assert _single_line(proc.stderr).startswith("compress eval: error: ZeroDivisionError: division by zero")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT,
                          env={**env, "COMPRESS_DEBUG": "1"}, timeout=300)
    assert proc.returncode == 1
    assert "Traceback (most recent call last)" in proc.stderr and proc.stderr.strip().endswith("ZeroDivisionError: division by zero")


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_debug_is_offered_by_every_command(name, capsys):
    with pytest.raises(SystemExit):
        main([*name.split(), "--help"])
    assert "--debug" in capsys.readouterr().out


# ---------------------------------------------------------------------------- a command missing


GROUPS = sorted({name.split()[0] for name in COMMANDS if " " in name})


@pytest.mark.parametrize("group", GROUPS)
def test_group_without_subcommand_says_so(group, capsys):
    subcommands = [name.split()[1] for name in COMMANDS if name.split()[0] == group]
    assert main([group]) == 2
    out, err = capsys.readouterr()
    assert out.startswith(f"usage: compress {group}") and all(s in out for s in subcommands)
    line = _single_line(err)
    assert line == f"compress {group}: error: choose a subcommand: {', '.join(subcommands)} (see compress {group} --help)"


def test_teacher_without_subcommand_in_a_real_process():
    code, out, err = run_cli("teacher")
    assert code == 2 and "pretrain" in out and "finetune" in out
    assert _single_line(err).startswith("compress teacher: error: choose a subcommand: ")


def test_no_command_prints_usage_and_an_error():
    code, out, err = run_cli()
    assert code == 2 and out.startswith("usage: compress") and "COMMAND" in out
    assert _single_line(err) == "compress: error: choose a command (see compress --help)"
    code, out, err = run_cli("--quiet")
    assert code == 2 and _single_line(err) == "compress: error: choose a command (see compress --help)"


def test_repeated_flag_of_several_inputs_adds_to_them():
    """`--model A --model B` times both, as `--model A B` does (a repeated flag once kept only the last)."""
    parser = build_parser()
    spaced = parser.parse_args(["latency", "--model", "a", "b"])
    repeated = parser.parse_args(["latency", "--model", "a", "--model", "b"])
    assert spaced.models == repeated.models == ["a", "b"]
