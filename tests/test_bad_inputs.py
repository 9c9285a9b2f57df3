"""Bad input across subcommands: one line on stderr saying what is wrong and what to do,
exit status 2, no traceback, and no partial output left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from compress.cli import main
from compress.core.data import synthetic
from tests.conftest import make_tiny_model, make_tokenizer, save_tiny

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    """A workspace: a tiny classifier, its data in GLUE layout, and a few broken files."""
    root = tmp_path_factory.mktemp("bad")
    tok = make_tokenizer(root / "tok")
    save_tiny(make_tiny_model(), tok, root / "model")
    save_tiny(make_tiny_model(vocab_size=20), tok, root / "small-vocab")
    (root / "plainfile").write_text("x")
    (root / "notmodel").mkdir()
    (root / "notmodel" / "readme.txt").write_text("hi")
    corrupt = save_tiny(make_tiny_model(), tok, root / "corrupt")
    weights = corrupt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    badjson = save_tiny(make_tiny_model(), tok, root / "badconfig")
    (badjson / "config.json").write_text("{not json")
    glue = synthetic.write_sst2_layout(root / "glue", n_train=64, n_dev=16, n_test=4)
    (root / "malformed" / "RTE").mkdir(parents=True)
    (root / "malformed" / "RTE" / "dev.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\tonly one field\n")
    (root / "badlabel" / "SST-2").mkdir(parents=True)
    (root / "badlabel" / "SST-2" / "dev.tsv").write_text("sentence\tlabel\ngood .\t7\n")
    (root / "empty" / "SST-2").mkdir(parents=True)
    (root / "empty" / "SST-2" / "dev.tsv").write_text("sentence\tlabel\n")
    (root / "latin1" / "SST-2").mkdir(parents=True)
    (root / "latin1" / "SST-2" / "dev.tsv").write_bytes(b"sentence\tlabel\ncaf\xe9 .\t1\n")
    (root / "rows.jsonl").write_text('{"sentence": "fine", "label": 1}\n{oops\n')
    (root / "unknown.yaml").write_text("task: sst2\nbatchsize: 3\n")
    (root / "evil.yaml").write_text("task: !!python/object/apply:os.system ['echo pwned']\n")
    (root / "recipe.yaml").write_text("stages:\n  - {name: a, run: eval, models: [model], config: {task: sst2}}\nextra: 1\n")
    # the second stage's model is missing: found before the first stage runs or anything is written
    (root / "late.yaml").write_text("stages:\n  - {name: a, run: eval, models: [model], config: {task: sst2, data_dir: glue}}\n"
                                    "  - {name: b, run: quantize, model: no-such-model, config: {backend: torch}}\n")
    (root / "corpus-latin1.txt").write_bytes(b"one sentence.\n\ncaf\xe9 two.\n")
    (root / "runs-empty").mkdir()
    from compress.quantize.config import QuantizeConfig
    from compress.quantize.run import quantize

    quantize(root / "model", root / "int8", QuantizeConfig(backend="torch"))
    return root


def case(*args, where_not_created=None):
    return pytest.param(list(args), where_not_created, id=" ".join(str(a) for a in args)[:60])


CASES = [
    # eval: paths and model directories
    case("eval", "--model", "missing", "--task", "sst2", "--data-dir", "glue"),
    case("eval", "--model", "plainfile", "--task", "sst2", "--data-dir", "glue"),
    case("eval", "--model", "notmodel", "--task", "sst2", "--data-dir", "glue"),
    case("eval", "--model", "corrupt", "--task", "sst2", "--data-dir", "glue"),
    case("eval", "--model", "badconfig", "--task", "sst2", "--data-dir", "glue"),
    # eval: tasks and data
    case("eval", "--model", "model", "--task", "sst3", "--data-dir", "glue"),
    case("eval", "--model", "model", "--task", "rte", "--data-dir", "malformed"),
    case("eval", "--model", "model", "--task", "sst2", "--data-dir", "badlabel"),
    case("eval", "--model", "model", "--task", "sst2", "--data-dir", "empty"),
    case("eval", "--model", "model", "--task", "sst2", "--data-dir", "latin1"),
    case("eval", "--model", "model", "--task", "sst2", "--data-file", "rows.jsonl"),
    case("eval", "--model", "model", "--task", "sst2"),  # the hub, offline
    case("eval", "--model", "model", "--task", "sst2", "--split", "validation", "--data-dir", "glue"),
    case("eval", "--model", "model", "--task", "sst2", "--columns", "sentence=text", "--data-dir", "glue"),
    case("eval", "--model", "model", "--task", "mnli", "--data-dir", "glue"),
    case("eval", "--model", "small-vocab", "--task", "sst2", "--data-dir", "glue"),
    case("eval", "--model", "model", "--task", "sst2", "--data-dir", "glue", "--max-length", "1024"),
    case("eval", "--model", "model", "--config", "unknown.yaml", "--data-dir", "glue"),
    case("eval", "--model", "model", "--config", "evil.yaml", "--data-dir", "glue"),
    case("eval", "--model", "model", "--task", "sst2", "--data-dir", "nowhere"),
    # init / teacher
    case("init", "--shape", "9Q", "--tokenizer", "tok/vocab.txt", "--out", "new-init", where_not_created="new-init"),
    case("init", "--shape", "2L-32", "--tokenizer", "tok/vocab.txt", "--out", "model"),
    case("teacher", "finetune", "--model", "bert-base", "--task", "sst2", "--data-dir", "glue", "--out", "ft-hub",
         where_not_created="ft-hub"),
    case("teacher", "finetune", "--model", "model", "--data-dir", "glue", "--out", "ft-notask", where_not_created="ft-notask"),
    case("teacher", "finetune", "--model", "model", "--task", "sst2", "--data-dir", "glue", "--out", "model"),
    case("teacher", "finetune", "--model", "model", "--task", "sst2", "--data-dir", "glue", "--lr", "0", "--out", "ft-lr",
         where_not_created="ft-lr"),
    case("teacher", "pretrain", "--corpus", "missing.txt", "--out", "pt-missing", where_not_created="pt-missing"),
    case("teacher", "pretrain", "--corpus", "corpus-latin1.txt", "--vocab-size", "100", "--out", "pt-latin1",
         where_not_created="pt-latin1"),
    # distill
    case("distill", "--teacher", "model", "--task", "sst2", "--losses", "kl", "--out", "d-loss", where_not_created="d-loss"),
    case("distill", "--teacher", "model", "--task", "sst2", "--student", "2L-64", "--data-dir", "glue", "--out", "d-shape",
         where_not_created="d-shape"),
    case("distill", "--teacher", "model", "--task", "sst2", "--student", "12X", "--data-dir", "glue", "--out", "d-x",
         where_not_created="d-x"),
    # prune
    case("prune", "--model", "model", "--task", "sst2", "--remove-heads", "1.5", "--out", "p-ratio", where_not_created="p-ratio"),
    case("prune", "--model", "model", "--task", "sst2", "--remove-heads", "8", "--data-dir", "glue", "--out", "p-all",
         where_not_created="p-all"),
    case("prune", "--model", "model", "--task", "sst2", "--out", "p-nothing", where_not_created="p-nothing"),
    case("prune", "--model", "model", "--task", "sst2", "--remove-layers", "top:2", "--data-dir", "glue", "--out", "p-layers",
         where_not_created="p-layers"),
    # quantize
    case("quantize", "--model", "model", "--backend", "tensorrt", "--out", "q-backend", where_not_created="q-backend"),
    case("quantize", "--model", "model", "--backend", "torch", "--scheme", "static", "--out", "q-scheme",
         where_not_created="q-scheme"),
    case("quantize", "--model", "int8", "--backend", "torch", "--out", "q-again", where_not_created="q-again"),
    case("prune", "--model", "int8", "--task", "sst2", "--remove-heads", "0.5", "--data-dir", "glue", "--out", "p-int8",
         where_not_created="p-int8"),
    # latency
    case("latency", "--model", "model", "--seq", "512"),
    case("latency", "--model", "model", "--batch", "0"),
    case("latency", "--model", "missing"),
    # heads, leaderboard, recipes
    case("heads", "--model", "model", "--out", "h-none", where_not_created="h-none"),
    case("leaderboard", "--runs", "runs-empty", "--out", "lb", where_not_created="lb"),
    case("run", "recipe.yaml", "--out", "r-run", where_not_created="r-run"),
    case("run", "missing.yaml", "--out", "r-missing", where_not_created="r-missing"),
    case("run", "late.yaml", "--out", "r-late", where_not_created="r-late"),
]


@pytest.mark.parametrize("args,not_created", CASES)
def test_one_line_error(ws, args, not_created, capsys, monkeypatch):
    monkeypatch.chdir(ws)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    try:
        code = main(args)
    except SystemExit as usage:  # refused while parsing: a value outside a flag's choices (task, backend)
        code = usage.code
    err = capsys.readouterr().err.strip()
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1, err
    assert lines[0].startswith("compress ") and ": error: " in lines[0]
    assert "Traceback" not in err
    if not_created:
        assert not (ws / not_created).exists()
        assert not list(ws.glob(f".{not_created}*"))  # no temporary or work directories either


def test_cases_cover_at_least_30_inputs():
    assert len(CASES) >= 30


@pytest.mark.e2e
def test_usage_error_and_no_traceback_in_a_real_process(ws):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    for args in (["eval", "--task", "sst2"], ["eval", "--model", "missing", "--task", "sst2"], ["nosuchcommand"]):
        proc = subprocess.run([sys.executable, "-m", "compress.cli", *args], cwd=ws, env=env, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 2
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_existing_outputs_are_untouched(ws, capsys, monkeypatch):
    monkeypatch.chdir(ws)
    before = (ws / "model" / "model.safetensors").read_bytes()
    assert main(["init", "--shape", "2L-32", "--tokenizer", "tok/vocab.txt", "--out", "model"]) == 2
    assert (ws / "model" / "model.safetensors").read_bytes() == before
    assert json.loads((ws / "model" / "compression.json").read_text())["stage"] == "test"


def test_no_trust_remote_code_anywhere():
    """Nothing in the package enables remote code; loaders pass trust_remote_code=False."""
    for path in list((ROOT / "compress").rglob("*.py")) + list((ROOT / "eval").rglob("*.py")) + list((ROOT / "teacher").rglob("*.py")):
        assert "trust_remote_code=True" not in path.read_text(), path
