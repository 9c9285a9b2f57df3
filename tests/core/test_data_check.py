"""A data error is said before any model library is imported or model file opened, and the data is read once.

* ``compress teacher finetune`` with a wrong --text-column, a dev label the training data lacks or a TSV named .csv:
  a fresh process says the one line, exit status 2, and never imports torch or transformers (``-X importtime`` lists
  every module it imports).
* ``compress eval``, ``compress heads`` and ``compress distill`` read and check their data before they open the
  model's weights or tokenizer: their loaders raise here, and the data error still comes.
* One command reads each split, and the labels of a training file, once: the command line's check and the stage
  share what was read.
* The data check's view of a model folder (its JSON files) gives the task the stage's opened folder gives.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from compress.cli import main
from compress.core.data import check, resolve, sources
from compress.core.data.check import FolderJson, Reads, checked_data, resolved_task
from compress.core.data.config import DataSource, TaskData, TaskOptions
from compress.core.data.resolve import task_of_folder
from compress.core.errors import CompressError
from compress.core.formats import artifacts, folder
from compress.core.formats.folder import open_folder
from tests.conftest import make_tiny_model, make_tokenizer, save_tiny
from tests.own_data import classification_rows, write_csv

ROOT = Path(__file__).resolve().parents[2]
WALL_S = 5.0  # loose: the check takes about a second; importing torch and transformers alone takes longer here
NEVER = ("torch", "transformers")
LABELS = "films, people, pets, travel"  # classification_rows' categories, sorted


def own_data(tmp_path: Path) -> tuple[Path, Path]:
    """Train and dev files of a text-classification task named "data" (its folder), labels in column "category"."""
    train = write_csv(tmp_path / "data" / "train.csv", classification_rows(24, seed=0), ["text", "category"])
    dev = write_csv(tmp_path / "data" / "dev.csv", classification_rows(8, seed=1), ["text", "category"])
    return train, dev


def bare_folder(tmp_path: Path) -> Path:
    """A bare encoder's folder as the data check sees it: config.json only (no task of its own)."""
    path = tmp_path / "bare"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"]}))
    return path


def imported(importtime: str) -> set[str]:
    """The top-level packages an ``-X importtime`` report lists."""
    names = set()
    for line in importtime.splitlines():
        if line.startswith("import time:") and line.count("|") == 2:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return names


def finetune_in_fresh_process(tmp_path: Path, *flags: str) -> tuple[int, list[str], set[str], float]:
    """``compress teacher finetune`` on the bare folder with ``flags``: (status, error lines, packages imported, seconds)."""
    argv = [sys.executable, "-X", "importtime", "-m", "compress.cli", "teacher", "finetune", "--model",
            str(bare_folder(tmp_path)), "--task", "text-classification", "--label-column", "category", *flags,
            "--out", str(tmp_path / "out")]
    started = time.perf_counter()
    run = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, timeout=300,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    wall = time.perf_counter() - started
    said = [line for line in run.stderr.splitlines() if not line.startswith("import time:")]
    return run.returncode, said, imported(run.stderr), wall


# ---------------------------------------------------------------------------- the command line, in a fresh process


def test_a_wrong_text_column_is_said_before_torch_is_imported(tmp_path):
    train, dev = own_data(tmp_path)
    status, said, modules, wall = finetune_in_fresh_process(
        tmp_path, "--train-file", str(train), "--dev-file", str(dev), "--text-column", "sentence")
    assert (status, said) == (2, [f"compress teacher finetune: error: {train}: no column 'sentence' for data's text "
                                  "(columns here: text, category); name it with --text-column COLUMN"])
    assert "compress" in modules and not modules & set(NEVER), sorted(modules & set(NEVER))
    assert wall < WALL_S, f"{wall:.1f} s"
    assert not (tmp_path / "out").exists()


def test_a_dev_label_absent_from_training_is_said_before_torch_is_imported(tmp_path):
    train, _ = own_data(tmp_path)
    rows = classification_rows(8, seed=1)
    rows[3]["category"] = "zebras"
    dev = write_csv(tmp_path / "data" / "dev_zebras.csv", rows, ["text", "category"])
    status, said, modules, wall = finetune_in_fresh_process(tmp_path, "--train-file", str(train), "--dev-file", str(dev))
    assert status == 2 and len(said) == 1, said
    assert said[0].startswith(f"compress teacher finetune: error: {dev}:5: label 'zebras' is not one of data's labels "
                              f"({LABELS})"), said
    assert "compress" in modules and not modules & set(NEVER), sorted(modules & set(NEVER))
    assert wall < WALL_S, f"{wall:.1f} s"


def test_a_tsv_named_csv_is_said_before_torch_is_imported(tmp_path):
    _, dev = own_data(tmp_path)
    tsv = tmp_path / "data" / "tabs.csv"
    tsv.write_text("text\tcategory\n" + "".join(f"{r['text']}\t{r['category']}\n" for r in classification_rows(8)))
    status, said, modules, wall = finetune_in_fresh_process(tmp_path, "--train-file", str(tsv), "--dev-file", str(dev))
    assert status == 2 and len(said) == 1, said
    assert said[0].startswith(f"compress teacher finetune: error: {tsv}:1: "), said
    assert said[0].endswith("looks tab-separated: name it .tsv"), said
    assert "compress" in modules and not modules & set(NEVER), sorted(modules & set(NEVER))
    assert wall < WALL_S, f"{wall:.1f} s"


def test_the_data_modules_import_no_model_library():
    code = ("import json, sys\nimport compress.core.data.check, compress.core.data.resolve, compress.core.data.sources\n"
            f"print(json.dumps(sorted(m for m in {NEVER!r} if m in sys.modules)))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.splitlines()[-1]) == []


# ---------------------------------------------------------------------------- eval, heads, distill: data before the model


class ModelOpened(Exception):
    """A model file was opened: the data should have been refused first."""


def refuse(*args, **kwargs):
    raise ModelOpened


@pytest.fixture
def garbage_classifier(tmp_path, monkeypatch):
    """A sequence classifier whose config is sound, whose weights and tokenizer are garbage, and whose loaders raise."""
    path = save_tiny(make_tiny_model(head="sequence-classification"), make_tokenizer(tmp_path / "tok"), tmp_path / "sst2")
    (path / "model.safetensors").write_bytes(b"not a safetensors file")
    (path / "tokenizer.json").write_text("{broken")
    monkeypatch.setattr(folder, "_load_tokenizer", refuse)
    monkeypatch.setattr(artifacts, "load_file", refuse)
    return path


@pytest.fixture
def sst2_without_sentence(tmp_path):
    """An SST-2 file whose text column is "text", not SST-2's "sentence" (and no --columns to map it)."""
    rows = [{"text": r["text"], "label": i % 2} for i, r in enumerate(classification_rows(8))]
    return write_csv(tmp_path / "files" / "sst2.csv", rows, ["text", "label"])


def no_sentence(path: Path) -> str:
    return rf"^{path}: no column 'sentence' for SST-2's sentence"


def test_eval_reads_its_data_before_the_model(garbage_classifier, sst2_without_sentence, monkeypatch):
    from compress.eval import evaluate as evaluate_module
    from compress.eval.config import EvalConfig

    monkeypatch.setattr(evaluate_module, "load_folder_model", refuse)
    monkeypatch.setattr(evaluate_module, "load_model", refuse)
    cfg = EvalConfig(task="sst2", data_file=str(sst2_without_sentence), record=False)
    with pytest.raises(CompressError, match=no_sentence(sst2_without_sentence)):
        evaluate_module.evaluate(garbage_classifier, cfg)
    cfg = EvalConfig(task="stsb", data_file=str(sst2_without_sentence), embedding=True, record=False)
    with pytest.raises(CompressError, match=rf"^{sst2_without_sentence}: no column 'sentence1' for STS-B's sentence1"):
        evaluate_module.evaluate(garbage_classifier, cfg)  # --embedding too


def test_heads_reads_its_data_before_the_model(garbage_classifier, sst2_without_sentence, monkeypatch, tmp_path):
    from compress.eval import heads as heads_module
    from compress.eval.config import HeadsConfig

    for loader in ("load_tokenizer", "load_model", "load_model_for_task"):
        monkeypatch.setattr(heads_module, loader, refuse)
    data = TaskData(train_file=str(sst2_without_sentence), dev_file=str(sst2_without_sentence))
    with pytest.raises(CompressError, match=no_sentence(sst2_without_sentence)):
        heads_module.analyze_heads(garbage_classifier, tmp_path / "report", HeadsConfig(task="sst2", data=data))


def test_distill_reads_its_data_before_the_teacher(garbage_classifier, sst2_without_sentence, monkeypatch, tmp_path):
    from compress.distill import task as distill_module
    from compress.distill.config import DistillConfig

    monkeypatch.setattr(distill_module, "open_teacher", refuse)
    data = TaskData(train_file=str(sst2_without_sentence), dev_file=str(sst2_without_sentence))
    with pytest.raises(CompressError, match=no_sentence(sst2_without_sentence)):
        distill_module.distill(garbage_classifier, tmp_path / "student", DistillConfig(task="sst2", data=data))


# ---------------------------------------------------------------------------- read once per command


def test_a_command_reads_each_split_and_the_training_labels_once(tmp_path, monkeypatch):
    model = save_tiny(make_tiny_model(head="base"), make_tokenizer(tmp_path / "tok"), tmp_path / "encoder")
    train, dev = own_data(tmp_path)
    splits: Counter = Counter()
    labels: Counter = Counter()
    real_load_file, real_labels, real_check = sources.load_file, resolve.label_names_in, check.check_data

    def counting_load_file(task, split, path, columns):
        splits[(Path(path).name, split.name)] += 1
        return real_load_file(task, split, path, columns)

    def counting_labels(task, path):
        labels[Path(path).name] += 1
        return real_labels(task, path)

    monkeypatch.setattr(sources, "load_file", counting_load_file)
    monkeypatch.setattr(resolve, "label_names_in", counting_labels)
    monkeypatch.setattr(folder, "_load_tokenizer", refuse)  # the stage has read its data when it asks for the tokenizer
    checked = []
    monkeypatch.setattr(check, "check_data", lambda reads: checked.append(real_check(reads)) or checked[-1])
    status = main(["teacher", "finetune", "--model", str(model), "--task", "text-classification", "--train-file",
                   str(train), "--dev-file", str(dev), "--label-column", "category", "--out", str(tmp_path / "out")])
    assert status == 1  # ModelOpened, as an internal error: after every read
    assert [task.name for task in checked] == ["data"]  # the command line's check read them first
    assert splits == {("train.csv", "train"): 1, ("dev.csv", "dev"): 1}
    assert labels == {"train.csv": 1}


def test_outside_a_command_each_read_reads(tmp_path, monkeypatch):
    train, dev = own_data(tmp_path)
    reads: Counter = Counter()
    real_load_file = sources.load_file
    monkeypatch.setattr(sources, "load_file", lambda *a: reads.update([a[2].name]) or real_load_file(*a))
    task = resolve.resolve_task("text-classification", TaskOptions(label_column="category"), train_file=train)
    source = DataSource(data_file=str(dev))
    sources.load_split(task, "dev", source)
    sources.load_split(task, "dev", source)
    assert reads == {"dev.csv": 2}
    with sources.reading_once():
        first = sources.load_split(task, "dev", source)
        assert len(sources.load_split(task, "dev", source, max_examples=3)) == 3  # cut again, from what was read
        assert sources.load_split(task, "dev", source) is first
    assert reads == {"dev.csv": 3}


def test_the_check_reads_what_the_options_name_and_leaves_the_rest_to_the_stage(tmp_path):
    train, dev = own_data(tmp_path)
    data = TaskData(train_file=str(train), dev_file=str(dev), own=TaskOptions(label_column="category"))
    with checked_data(Reads.training("text-classification", data, bare_folder(tmp_path))):
        kept = dict(sources._kept)
    assert sorted(key[1] for key in kept if key[0] != "labels") == ["dev", "train"]
    assert sources._kept is None  # gone with the command
    hub = Reads.training("sst2", TaskData(), "google-bert/bert-base-uncased")
    with checked_data(hub):  # the hub's data is the stage's to fetch
        assert sources._kept is None
    # A kind and a hub model: the task may be the downloaded folder's, so the stage resolves it.
    assert resolved_task(Reads.training("text-classification", data, "org/model")) is None


# ---------------------------------------------------------------------------- a folder's task from its JSON


@pytest.mark.parametrize("head, overrides, kind, labels", [
    ("sequence-classification", {"num_labels": 3, "id2label": {0: "neg", 1: "neutral", 2: "pos"}}, "text-classification",
     ("neg", "neutral", "pos")),
    ("sequence-classification", {}, "text-classification", ("0", "1")),  # transformers' two generic labels
    ("sequence-classification", {"num_labels": 1}, "regression", ()),  # one output and no problem_type: a regressor
    ("sequence-classification", {"num_labels": 2, "problem_type": "multi_label_classification",
                                 "id2label": {0: "animal", 1: "place"}}, "multi-label", ("animal", "place")),
    ("token-classification", {"num_labels": 3, "id2label": {0: "O", 1: "B-place", 2: "I-place"}}, "token-classification",
     ("O", "B-place", "I-place")),
    ("base", {}, None, None),  # no task head: no task of its own
])
def test_a_folders_json_gives_the_task_its_opened_folder_gives(tmp_path, head, overrides, kind, labels):
    path = save_tiny(make_tiny_model(head=head, **overrides), make_tokenizer(tmp_path / "tok"), tmp_path / "model")
    light = task_of_folder(FolderJson.at(path))
    assert light == task_of_folder(open_folder(path))
    assert (light.kind, light.label_names, light.name) == (kind, labels, "model") if kind else light is None


def test_a_config_the_check_cannot_read_as_transformers_would_is_left_to_the_stage(tmp_path):
    path = tmp_path / "model"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertForSequenceClassification"],
                                                  "id2label": {"0": "a", "1": "b", "2": "c"}, "num_labels": 2}))
    train, dev = own_data(tmp_path)
    data = TaskData(train_file=str(train), dev_file=str(dev), own=TaskOptions(label_column="category"))
    assert resolved_task(Reads.training(None, data, path)) is None
