"""One decision on whether an output may be written (compress.core.preflight.check_output), and every
subcommand going through it: never over an input, never over a user's folder without --overwrite
(--resume included), never a traceback for a place that cannot be written."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from compress.cli import main
from compress.core.data import synthetic
from compress.core.preflight import check_output
from compress.core.errors import CompressError
from tests.conftest import make_tiny_model, make_tokenizer, save_tiny


def unwritable_place(tmp_path: Path) -> Path:
    """A folder this process cannot create anything in: a read-only folder, or sysfs when running as root."""
    if os.geteuid() == 0:
        return Path("/sys")
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    return folder


@pytest.fixture
def model(tmp_path):
    return save_tiny(make_tiny_model(), make_tokenizer(tmp_path / "tok"), tmp_path / "inputs" / "model")


def test_empty_missing_and_non_empty_outputs(tmp_path):
    assert check_output(tmp_path / "new") == tmp_path / "new"
    (tmp_path / "empty").mkdir()
    assert check_output(tmp_path / "empty") == tmp_path / "empty"
    full = tmp_path / "full"
    full.mkdir()
    (full / "mine.txt").write_text("keep")
    with pytest.raises(CompressError, match="not empty; pass --overwrite"):
        check_output(full)
    with pytest.raises(CompressError, match="no interrupted run of its own to resume"):
        check_output(full, resume=True)
    assert check_output(full, overwrite=True) == full and (full / "mine.txt").read_text() == "keep"  # checked, not touched
    (tmp_path / "file").write_text("x")
    with pytest.raises(CompressError, match="exists and is not a directory"):
        check_output(tmp_path / "file", overwrite=True)


def test_an_input_or_a_folder_holding_one_is_never_an_output(model, tmp_path):
    for out in (model, model.parent, tmp_path):
        with pytest.raises(CompressError, match="destroy it"):
            check_output(out, overwrite=True, inputs=model)
    link = tmp_path / "link"
    link.symlink_to(model)
    with pytest.raises(CompressError, match="is the input"):
        check_output(link, overwrite=True, inputs=model)  # a symlink to the input is the input
    inner = tmp_path / "elsewhere"
    inner.mkdir()
    (inner / "to-model").symlink_to(model)
    with pytest.raises(CompressError, match="is the input"):
        check_output(model, overwrite=True, inputs=inner / "to-model")  # an input reached through a symlink
    with pytest.raises(CompressError, match="contains the input"):
        check_output(model.parent, overwrite=True, inputs=inner / "to-model")

    class Cfg:  # a config naming paths in its fields (a dataclass, nested)
        pass

    from dataclasses import dataclass, field

    @dataclass(frozen=True)
    class Data:
        data_dir: str

    @dataclass(frozen=True)
    class Config:
        corpus: tuple[str, ...] = ()
        data: Data = field(default_factory=lambda: Data(""))
        out: str = ""

    data = tmp_path / "data"
    data.mkdir()
    with pytest.raises(CompressError, match="contains the input"):
        check_output(tmp_path, overwrite=True, inputs=Config(data=Data(str(data))))
    with pytest.raises(CompressError, match="contains the input"):
        check_output(tmp_path, overwrite=True, inputs=Config(corpus=(str(data),)))
    assert check_output(tmp_path / "new", inputs=Config(out=str(tmp_path)))  # a config's own out is no input
    assert check_output(tmp_path / "new", inputs=("bert-base", Cfg()))  # hub names and other objects are not paths


def test_unwritable_place_is_refused_before_any_work(tmp_path):
    place = unwritable_place(tmp_path)
    with pytest.raises(CompressError, match=f"{place} is not writable"):
        check_output(place / "new" / "out")


def test_leftovers_of_a_killed_run_are_removed(tmp_path):
    (tmp_path / ".out.tmp-abc123").mkdir()
    (tmp_path / ".out.tmp-abc123" / "model.onnx").write_bytes(b"x" * 100)
    (tmp_path / ".out.old-1234").mkdir()
    (tmp_path / ".other.tmp-abc").mkdir()
    check_output(tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.tmp-abc"]  # only what a run into out/ leaves


# ---------------------------------------------------------------------------- every subcommand


def _commands(model: Path, data: Path, corpus: Path) -> dict[str, list[str]]:
    """Each command writing --out, with inputs valid enough that only --out decides."""
    m = str(model)
    return {
        "auto": ["auto", "--teacher", m, "--task", "sst2", "--budget", "size<=100MB", "--data-dir", str(data)],
        "distill": ["distill", "--teacher", m, "--task", "sst2", "--data-dir", str(data)],
        "distill-embedding": ["distill-embedding", "--teacher", m, "--corpus", str(corpus)],
        "distill-general": ["distill-general", "--teacher", m, "--corpus", str(corpus)],
        "export": ["export", "--model", m],
        "heads": ["heads", "--model", m, "--task", "sst2", "--data-dir", str(data)],
        "leaderboard": ["leaderboard", "--runs", m],
        "prune": ["prune", "--model", m, "--task", "sst2", "--remove-heads", "0.5", "--data-dir", str(data)],
        "prune-embedding": ["prune-embedding", "--model", m, "--corpus", str(corpus), "--remove-heads", "0.5"],
        "quantize": ["quantize", "--model", m, "--backend", "torch"],
        "teacher finetune": ["teacher", "finetune", "--model", m, "--task", "sst2", "--data-dir", str(data)],
        "teacher pretrain": ["teacher", "pretrain", "--corpus", str(corpus)],
        "demo": ["demo"],
        "init": ["init", "--shape", "2L-128", "--tokenizer", m],
    }


RESUMABLE = {"auto", "distill", "distill-embedding", "distill-general", "teacher finetune", "teacher pretrain"}


@pytest.fixture
def inputs(model, tmp_path):
    data = synthetic.write_sst2_layout(tmp_path / "inputs" / "data", n_train=20, n_dev=8, n_test=4)
    corpus = tmp_path / "inputs" / "corpus.txt"
    corpus.write_text("the film was good . it was long .\n\nthe plot was thin .\n", encoding="utf-8")
    return _commands(model, data, corpus)


def _run(argv, capsys) -> tuple[int, list[str]]:
    code = main(argv)
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    return code, err


@pytest.mark.parametrize("name", sorted(_commands(Path("m"), Path("d"), Path("c"))))
def test_every_command_refuses_a_non_empty_out_with_one_line_and_keeps_it(name, inputs, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "canary.txt").write_text("precious")
    flags = [["--out", str(out)]]
    if name in RESUMABLE:
        flags.append(["--out", str(out), "--resume"])
    for extra in flags:
        code, err = _run(inputs[name] + extra, capsys)
        assert code != 0 and len(err) == 1 and "not empty" in err[0] and "Traceback" not in err[0], (name, extra, err)
        assert sorted(p.name for p in out.iterdir()) == ["canary.txt"] and (out / "canary.txt").read_text() == "precious"
    assert not any(p.name.startswith(".mine.") for p in tmp_path.iterdir())  # nothing staged beside it either


@pytest.mark.parametrize("name", sorted(_commands(Path("m"), Path("d"), Path("c"))))
def test_every_command_refuses_an_unwritable_out_with_one_line(name, inputs, tmp_path, capsys):
    place = unwritable_place(tmp_path)
    code, err = _run(inputs[name] + ["--out", str(place / "new-output")], capsys)
    assert code != 0 and len(err) == 1 and "not writable" in err[0], (name, err)


@pytest.mark.parametrize("name", sorted(set(_commands(Path("m"), Path("d"), Path("c"))) - {"demo", "teacher pretrain", "init"}))
def test_every_command_refuses_to_write_over_its_input_even_with_overwrite(name, inputs, model, capsys):
    before = sorted(p.name for p in model.iterdir())
    for out in (model, model.parent):
        code, err = _run(inputs[name] + ["--out", str(out), "--overwrite"], capsys)
        assert code != 0 and len(err) == 1 and "destroy it" in err[0], (name, out, err)
    assert sorted(p.name for p in model.iterdir()) == before


def test_resume_with_no_interrupted_run_starts_fresh_into_an_empty_out(model, tmp_path):
    assert check_output(tmp_path / "fresh", resume=True) == tmp_path / "fresh"


def test_a_probe_leaves_nothing(tmp_path):
    check_output(tmp_path / "out")
    assert list(tmp_path.iterdir()) == [] and tempfile.gettempdir()


# ---------------------------------------------------------------------------- malformed model folders


@pytest.mark.parametrize("key,value", [("vocab_size", 2_000_000_000), ("hidden_size", "32"), ("num_hidden_layers", 2.5),
                                       ("num_attention_heads", -4), ("max_position_embeddings", True)])
def test_a_malformed_config_is_refused_before_anything_is_allocated(model, tmp_path, capsys, key, value):
    import json

    config = json.loads((model / "config.json").read_text())
    config[key] = value
    (model / "config.json").write_text(json.dumps(config))
    for argv in (["quantize", "--model", str(model), "--backend", "torch", "--out", str(tmp_path / "q")],
                 ["latency", "--model", str(model), "--repeats", "1", "--warmup", "0", "--no-peak", "--no-record"]):
        code, err = _run(argv, capsys)
        assert code != 0 and len(err) == 1 and f"config.json: {key} is {value!r}" in err[0], (argv, err)


# ---------------------------------------------------------------------------- unusable models are not made


def test_init_refuses_a_vocabulary_without_unk_or_ordinary_tokens_and_zero_positions(tmp_path, capsys):
    no_unk = tmp_path / "no-unk.txt"
    no_unk.write_text("[PAD]\n[CLS]\n[SEP]\n[MASK]\nthe\nfilm\n", encoding="utf-8")
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    good = tmp_path / "vocab.txt"
    good.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\nfilm\n", encoding="utf-8")
    for argv, words in ((["--tokenizer", str(no_unk)], "no unknown token"), (["--tokenizer", str(empty)], "no ordinary tokens"),
                        (["--tokenizer", str(good), "--max-positions", "0"], "--max-positions 0 is too small")):
        code, err = _run(["init", "--shape", "2L-128", *argv, "--out", str(tmp_path / "m")], capsys)
        assert code != 0 and len(err) == 1 and words in err[0], (argv, err)
        assert not (tmp_path / "m").exists()
    assert _run(["init", "--shape", "2L-128", "--tokenizer", str(good), "--out", str(tmp_path / "m")], capsys)[0] == 0


def test_a_folder_whose_tokenizer_lost_unk_is_one_line_later(model, tmp_path, capsys):
    import json

    spec = json.loads((model / "tokenizer.json").read_text(encoding="utf-8"))
    spec["model"]["vocab"].pop("[UNK]")  # the word-piece model loses its unknown token
    (model / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    code, err = _run(["quantize", "--model", str(model), "--backend", "torch", "--out", str(tmp_path / "q")], capsys)
    assert code != 0 and len(err) == 1 and "no unknown token" in err[0], err


def test_head_analysis_of_an_int8_model_names_its_fp32_parent(model, tmp_path, capsys):
    assert _run(["quantize", "--model", str(model), "--backend", "torch", "--out", str(tmp_path / "q")], capsys)[0] == 0
    text = tmp_path / "text.txt"
    text.write_text("the film was good .\n", encoding="utf-8")
    code, err = _run(["heads", "--model", str(tmp_path / "q"), "--text", str(text), "--out", str(tmp_path / "h")], capsys)
    assert code != 0 and len(err) == 1 and "analyse the fp32 model" in err[0] and str(model) in err[0], err


# ---------------------------------------------------------------------------- other places a command writes


def test_eval_and_latency_say_when_they_cannot_write_before_any_work(model, tmp_path, capsys, monkeypatch):
    from compress.core.formats import writes

    data = synthetic.write_sst2_layout(tmp_path / "data", n_train=8, n_dev=8, n_test=4)
    eval_argv = ["eval", "--model", str(model), "--task", "sst2", "--data-dir", str(data)]
    (tmp_path / "a-file").write_text("x")
    code, err = _run(eval_argv + ["--predictions", str(tmp_path / "a-file")], capsys)
    assert code != 0 and len(err) == 1 and "is a file, not a directory" in err[0], err
    code, err = _run(["run", str(tmp_path / "a-file"), "--out", str(tmp_path / "a-file")], capsys)
    assert code != 0 and len(err) == 1 and "a-file" in err[0] and "Traceback" not in err[0], err

    real = writes._writable
    monkeypatch.setattr(writes, "_writable", lambda folder: real(folder) and Path(folder) != model)  # a read-only model folder
    before = sorted(p.name for p in model.iterdir())
    code, err = _run(eval_argv, capsys)
    assert code != 0 and len(err) == 1 and "--no-record" in err[0] and str(model) in err[0], err
    code, err = _run(["latency", "--model", str(model), "--seq", "16", "--repeats", "1", "--warmup", "0", "--no-peak"], capsys)
    assert code != 0 and len(err) == 1 and "--no-record" in err[0], err
    assert sorted(p.name for p in model.iterdir()) == before
    assert _run(eval_argv + ["--no-record"], capsys)[0] == 0  # what the message advises works


def test_device_cuda_without_cuda_is_refused_by_training_as_by_eval(model, tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    data = synthetic.write_sst2_layout(tmp_path / "data", n_train=8, n_dev=8, n_test=4)
    for argv in (["teacher", "finetune", "--model", str(model), "--out", str(tmp_path / "f")],
                 ["distill", "--teacher", str(model), "--out", str(tmp_path / "d")],
                 ["eval", "--model", str(model), "--no-record"]):
        code, err = _run(argv + ["--task", "sst2", "--data-dir", str(data), "--device", "cuda"], capsys)
        assert code != 0 and len(err) == 1 and "CUDA is not available" in err[0], (argv, err)
    assert not (tmp_path / "f").exists() and not (tmp_path / "d").exists()


def test_a_recipe_never_replaces_a_folder_it_did_not_make_or_an_input(model, tmp_path, capsys):
    import yaml

    run = tmp_path / "run"
    (run / "int8").mkdir(parents=True)
    (run / "int8" / "canary.txt").write_text("mine")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"name": "r", "report": False, "stages": [
        {"name": "int8", "run": "quantize", "model": str(model), "config": {"backend": "torch"}}]}))
    code, err = _run(["run", str(recipe), "--out", str(run)], capsys)
    assert code != 0 and len(err) == 1 and "was not made by this recipe" in err[0], err
    assert (run / "int8" / "canary.txt").read_text() == "mine"
    # A stage named like the folder of its own input, the run directory being that input's parent.
    recipe.write_text(yaml.safe_dump({"name": "r", "report": False, "stages": [
        {"name": "model", "run": "quantize", "model": str(model), "config": {"backend": "torch"}}]}))
    before = sorted(p.name for p in model.iterdir())
    code, err = _run(["run", str(recipe), "--out", str(model.parent), "--overwrite"], capsys)
    assert code != 0 and len(err) == 1 and "destroy it" in err[0], err
    assert sorted(p.name for p in model.iterdir()) == before
