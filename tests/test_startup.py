"""Start-up and absurd options: help and refused options cost no heavy import, data is checked before the model.

* ``compress CMD --help`` for every command, and an option its config refuses (a seed of 2**70, 100000 threads),
  import none of torch, transformers, datasets, ONNX, OpenVINO, scikit-learn or SciPy: each config lives in a light
  module (checked in a fresh interpreter, which the suite's own imports cannot hide).
* The names the light configs are checked against equal the registries that implement them.
* A training stage reads and checks every split of its data before it opens its model's weights or tokenizer: a
  folder whose ``model.safetensors`` and ``tokenizer.json`` are garbage, and whose loaders raise, still gives the
  data error; and a fine-tuning run loads its folder's config, tokenizer and weights once each.
"""

from __future__ import annotations

import builtins
import io
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st

from compress.core.config import SEEDS, THREADS, from_dict
from compress.core.errors import CompressError
from compress.core.formats import artifacts, folder
from compress.core.train_config import TrainConfig
from compress.eval.latency.config import LatencyConfig
from compress.teacher import finetune as finetune_module
from compress.teacher.config import FinetuneConfig
from tests.conftest import make_tiny_model, make_tokenizer, save_tiny
from tests.own_data import classification_rows, write_csv

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "datasets", "onnx", "onnxruntime", "openvino", "sklearn", "scipy")


def fresh(code: str) -> dict:
    """Run ``code`` in a new interpreter (it prints one JSON value); that value."""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------- no heavy import before a stage runs


def test_help_of_every_command_imports_no_heavy_library():
    # One interpreter parses --help of every command in turn: a heavy module any of them imports stays in sys.modules,
    # so the check after each names the first command that brought one in.
    found = fresh(f"""
import contextlib, io, json, sys
from compress.cli import main
from compress.stages import COMMANDS
found = {{}}
for name in COMMANDS:
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        try:
            main([*name.split(), "--help"])
            status = None
        except SystemExit as exit:
            status = exit.code
    found[name] = [status, "usage: compress " + name in text.getvalue(), sorted(m for m in {HEAVY!r} if m in sys.modules)]
print(json.dumps(found))
""")
    from compress.stages import COMMANDS

    assert set(found) == set(COMMANDS)
    assert {name: value for name, value in found.items() if value != [0, True, []]} == {}


def test_an_absurd_option_is_refused_in_one_line_before_any_heavy_import(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    train = write_csv(tmp_path / "train.csv", classification_rows(4), ["text", "category"])
    runs = {
        "threads": ["latency", "--model", str(model), "--threads", "100000"],
        "seed": ["teacher", "finetune", "--model", str(model), "--task", "text-classification", "--train-file", str(train),
                 "--dev-file", str(train), "--seed", str(2**70), "--out", str(tmp_path / "out")],
        "quantize seed": ["quantize", "--model", str(model), "--seed", "-1", "--out", str(tmp_path / "q")],
    }
    found = fresh(f"""
import contextlib, io, json, sys
from compress.cli import main
found = {{}}
for name, argv in {runs!r}.items():
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        status = main(argv)
    found[name] = [status, err.getvalue().strip().splitlines(), sorted(m for m in {HEAVY!r} if m in sys.modules)]
print(json.dumps(found))
""")
    assert found == {
        "threads": [2, ["compress latency: error: options: --threads must be from 1 to 1024, got 100000"], []],
        "seed": [2, [f"compress teacher finetune: error: options: --seed must be from 0 to 4294967295, got {2**70}"], []],
        "quantize seed": [2, ["compress quantize: error: options: --seed must be from 0 to 4294967295, got -1"], []],
    }


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(min_value=-(2**80), max_value=2**80))
def test_a_seed_is_accepted_exactly_within_numpys_range(seed):
    inside = 0 <= seed <= 2**32 - 1
    assert SEEDS == (0, 2**32 - 1)
    if inside:
        assert from_dict(TrainConfig, {"seed": seed}).seed == seed
        assert from_dict(FinetuneConfig, {"seed": seed}).train.seed == seed  # flat, as on the command line
    else:
        with pytest.raises(CompressError, match=rf"^config: --seed must be from 0 to 4294967295, got {seed}$"):
            from_dict(TrainConfig, {"seed": seed})


@pytest.mark.parametrize("threads, ok", [(1, True), (THREADS[1], True), (0, False), (THREADS[1] + 1, False),
                                         (100_000, False)])
def test_threads_are_bounded_from_flags_and_from_a_config_built_in_code(threads, ok):
    if ok:
        assert from_dict(LatencyConfig, {"threads": threads}).threads == threads
        LatencyConfig(threads=threads).validate()
        return
    with pytest.raises(CompressError, match=f"^options: --threads must be from 1 to 1024, got {threads}$"):
        from_dict(LatencyConfig, {"threads": threads}, "options")
    with pytest.raises(CompressError, match=f"^--threads must be from 1 to 1024, got {threads}$"):
        LatencyConfig(threads=threads).validate()  # the latency stage validates what a caller built


def test_the_names_the_light_configs_check_equal_the_registries():
    from compress.core.model.shapes import TEACHER_METHODS
    from compress.distill.config import SENTENCE_TERMS, STUDENT_SENTENCE_TERMS, TASK_TERMS
    from compress.distill.embedding import EMBEDDING_TERMS, STUDENT_TERMS
    from compress.distill.terms import TERMS
    from compress.eval.latency.backends import BACKENDS
    from compress.export import EXPORTERS
    from compress.export_config import EXPORT_FORMATS
    from compress.eval.latency.config import LATENCY_BACKENDS
    from compress.students.init import INIT_METHODS

    assert sorted(TASK_TERMS) == TERMS.names()
    assert sorted(SENTENCE_TERMS) == EMBEDDING_TERMS.names()
    assert sorted(STUDENT_SENTENCE_TERMS) == STUDENT_TERMS.names()
    assert [name for name, _ in BACKENDS.items()] == list(LATENCY_BACKENDS)  # --help lists them in this order
    assert set(TEACHER_METHODS) < set(INIT_METHODS.names())
    assert sorted(EXPORT_FORMATS) == EXPORTERS.names()


# ---------------------------------------------------------------------------- data before the model


@pytest.fixture
def garbage_model(tmp_path):
    """A bare encoder whose config is sound but whose weights and tokenizer files are garbage."""
    path = save_tiny(make_tiny_model(head="base"), make_tokenizer(tmp_path / "tok"), tmp_path / "garbage")
    (path / "model.safetensors").write_bytes(b"not a safetensors file")
    (path / "tokenizer.json").write_text("{broken")
    return path


@pytest.fixture
def no_model_loads(monkeypatch):
    """Loading a tokenizer or weights is a test failure (beside the garbage files, which would raise on their own)."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model file was opened before the data was checked")

    monkeypatch.setattr(folder, "_load_tokenizer", refuse)
    monkeypatch.setattr(finetune_module, "load_folder_for_task", refuse)
    monkeypatch.setattr(artifacts, "load_file", refuse)


def own_data(tmp_path):
    """Train and dev files of a text-classification task (labels films, people, pets, travel)."""
    train = write_csv(tmp_path / "data" / "train.csv", classification_rows(24, seed=0), ["text", "category"])
    dev = write_csv(tmp_path / "data" / "dev.csv", classification_rows(8, seed=1), ["text", "category"])
    return train, dev


def test_a_wrong_text_column_is_said_before_the_model_is_opened(garbage_model, no_model_loads, tmp_path):
    train, dev = own_data(tmp_path)
    cfg = FinetuneConfig(task="text-classification", train_file=str(train), dev_file=str(dev), label_column="category",
                         text_column="sentence")
    with pytest.raises(CompressError) as err:
        finetune_module.finetune(garbage_model, tmp_path / "out", cfg)
    assert str(err.value) == (f"{train}: no column 'sentence' for data's text (columns here: text, category); name it "
                              "with --text-column COLUMN")


def test_a_dev_label_absent_from_training_is_said_before_the_model_is_opened(garbage_model, no_model_loads, tmp_path):
    train, _ = own_data(tmp_path)
    rows = classification_rows(8, seed=1)
    rows[3]["category"] = "zebras"
    dev = write_csv(tmp_path / "data" / "dev_zebras.csv", rows, ["text", "category"])
    cfg = FinetuneConfig(task="text-classification", train_file=str(train), dev_file=str(dev), label_column="category")
    with pytest.raises(CompressError, match=rf"^{dev}:5: label 'zebras' is not one of data's labels \(films, people, "
                                            r"pets, travel\)"):
        finetune_module.finetune(garbage_model, tmp_path / "out", cfg)


def test_a_tsv_named_csv_is_said_before_the_model_is_opened(garbage_model, no_model_loads, tmp_path):
    _, dev = own_data(tmp_path)
    tsv = tmp_path / "data" / "tabs.csv"
    tsv.write_text("text\tcategory\n" + "".join(f"{r['text']}\t{r['category']}\n" for r in classification_rows(8)))
    cfg = FinetuneConfig(task="text-classification", train_file=str(tsv), dev_file=str(dev), label_column="category")
    with pytest.raises(CompressError, match=rf"^{tsv}:1: .*looks tab-separated: name it \.tsv$"):
        finetune_module.finetune(garbage_model, tmp_path / "out", cfg)


def test_a_bad_test_file_is_said_before_the_model_is_opened(garbage_model, no_model_loads, tmp_path):
    train, dev = own_data(tmp_path)
    rows = [{"body": r["text"], "category": r["category"]} for r in classification_rows(4, seed=2)]
    test = write_csv(tmp_path / "data" / "test.csv", rows, ["body", "category"])
    cfg = FinetuneConfig(task="text-classification", train_file=str(train), dev_file=str(dev), test_file=str(test),
                         label_column="category")
    with pytest.raises(CompressError, match=rf"^{test}: no column 'text' for data's text"):
        finetune_module.finetune(garbage_model, tmp_path / "out", cfg)


def test_pruning_reads_its_data_before_the_model(garbage_model, monkeypatch, tmp_path):
    from compress import prune as prune_module
    from compress.prune_config import PruneConfig

    def refuse(*args, **kwargs):
        raise AssertionError("a model file was opened before the data was checked")

    monkeypatch.setattr(folder, "_load_tokenizer", refuse)
    monkeypatch.setattr(prune_module, "load_folder_for_task", refuse)
    rows = [{"sentence": r["text"], "label": i % 2} for i, r in enumerate(classification_rows(8))]
    train = write_csv(tmp_path / "sst2" / "train.csv", rows, ["sentence", "label"])
    cfg = PruneConfig(task="sst2", train_file=str(train), dev_file=str(train), columns=("sentence=text",),
                      remove_heads=0.5)
    with pytest.raises(CompressError, match=rf"^{train}: no column 'text' for SST-2's sentence"):
        prune_module.prune(garbage_model, tmp_path / "out", cfg)


# ---------------------------------------------------------------------------- one folder, opened once


def opener(frame) -> str:
    """Who opens a file: the first frame up the stack in the package or in a library it calls."""
    while frame is not None:
        top = frame.f_globals.get("__name__", "").split(".")[0]
        if top in ("compress", "transformers", "tokenizers", "huggingface_hub", "safetensors", "torch"):
            return top
        frame = frame.f_back
    return "other"


@pytest.mark.e2e
def test_finetuning_loads_its_folders_config_tokenizer_and_weights_once(tmp_path, monkeypatch):
    model = save_tiny(make_tiny_model(head="base"), make_tokenizer(tmp_path / "tok"), tmp_path / "bare")
    target = str(model.resolve())
    train, dev = own_data(tmp_path)
    loads: Counter = Counter()
    opened: Counter = Counter()

    def counting(name, load):
        def wrapped(source, *args, **kwargs):
            if target in str(Path(source).resolve()):
                loads[name] += 1
            return load(source, *args, **kwargs)
        return wrapped

    real_open = io.open

    def counting_open(file, *args, **kwargs):
        if isinstance(file, (str, Path)) and str(Path(file).resolve().parent) == target:
            opened[(Path(file).name, opener(sys._getframe(1)))] += 1
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(artifacts, "load_file", counting("weights", artifacts.load_file))
    monkeypatch.setattr(folder.AutoTokenizer, "from_pretrained", counting("tokenizer", folder.AutoTokenizer.from_pretrained))
    monkeypatch.setattr(transformers.BertConfig, "from_pretrained", counting("config", transformers.BertConfig.from_pretrained))
    monkeypatch.setattr(io, "open", counting_open)
    monkeypatch.setattr(builtins, "open", counting_open)
    cfg = FinetuneConfig(task="text-classification", train_file=str(train), dev_file=str(dev), label_column="category",
                         epochs=1, batch_size=8)
    out = finetune_module.finetune(model, tmp_path / "out", cfg)

    assert (out / "model.safetensors").is_file()
    assert loads == {"config": 1, "tokenizer": 1, "weights": 1}
    ours = {name: n for (name, who), n in opened.items() if who == "compress"}
    # config.json's bytes once (parsed, and hashed with the weights as the parent's hash), compression.json once, the
    # weights once by the hash (their tensors once by safetensors, counted above)
    assert ours == {"config.json": 1, "compression.json": 1, "model.safetensors": 1}, opened
