"""A user's own task of every kind (text-classification, multi-label, regression, token-classification).

End to end through the command line on tiny models (fine-tune -> distill -> prune -> quantize ->
export -> eval, the task given once), the metrics against hand computations and seqeval, label
order round trips, stock loaders on the folders, one-line refusals of bad data, and the
distillation losses of the new kinds against hand-written formulas.

Expected values are written out here (label lists, task records, hand-counted scores), never
produced by the code under test.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from compress.cli import main
from compress.core.data.features import tokenize_classification
from compress.core.data.sources import DataSource, TaskOptions, load_split
from compress.core.errors import CompressError
from compress.core.data.resolve import check_label_set, resolve_task, task_of_model
from compress.core.data.tasks import CLASSIFICATION, MULTI_LABEL, REGRESSION, TOKEN, user_task
from compress.core.data.token_data import token_features
from compress.eval.metrics import entity_metrics, multi_label_metrics, task_metrics
from compress.distill.losses import hard_label_bce, sigmoid_kd, token_ce, token_kd
from tests.conftest import make_tiny_model, make_tokenizer, save_tiny
from tests.own_data import own_task_files, read_conll_file, write_conll, write_jsonl

# ---------------------------------------------------------------------------- what each kind should make


@dataclass(frozen=True)
class Expected:
    """What a model folder made for one kind of the generated data must record, written out by hand."""

    args: tuple[str, ...]  # the own-task options the first stage needs for the generated files
    spec: dict  # compression.json's "task_spec"
    problem_type: str | None  # config.json's problem_type (token classification has none)
    architecture: str
    primary: str


def _spec(kind, fields, labels, columns, metrics, threshold=None):
    return {"name": kind, "kind": kind, "text_fields": fields, "labels": labels, "columns": columns,
            "metric": metrics[0], "metrics": metrics, "label_sep": None, "threshold": threshold}


SEQ, TOK = "BertForSequenceClassification", "BertForTokenClassification"
EXPECTED = {
    "text-classification": Expected(
        ("--label-column", "category"),
        _spec("text-classification", ["text"], ["films", "people", "pets", "travel"], {"label": "category"},
              ["accuracy", "macro_f1"]),
        "single_label_classification", SEQ, "accuracy"),
    "multi-label": Expected(
        ("--label-column", "tags"),
        _spec("multi-label", ["text"], ["animal", "feeling", "place"], {"label": "tags"},
              ["micro_f1", "macro_f1", "subset_accuracy"], threshold=0.5),
        "multi_label_classification", SEQ, "micro_f1"),
    "regression": Expected(
        ("--label-column", "score"),
        _spec("regression", ["text"], [], {"label": "score"}, ["pearson", "spearmanr", "mse"]),
        "regression", SEQ, "pearson"),
    # The generated sentences have one-word animals and one- or two-word places: no I-animal tag occurs.
    "token-classification": Expected(
        (),
        _spec("token-classification", ["tokens"], ["O", "B-animal", "B-place", "I-place"],
              {"tokens": "tokens", "label": "tags"},
              ["entity_f1", "entity_precision", "entity_recall", "f1_animal", "f1_place"]),
        None, TOK, "entity_f1"),
}


# ---------------------------------------------------------------------------- shared tiny set-up


@dataclass(frozen=True)
class Work:
    root: Path
    base: Path  # a 2-layer hidden-32 BERT without a head, and the test tokenizer
    files: dict  # {kind: {"train" | "dev" | "test": path}}


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Work:
    root = tmp_path_factory.mktemp("own")
    tokenizer = make_tokenizer(root / "tok")
    base = save_tiny(make_tiny_model(head="base"), tokenizer, root / "base")
    return Work(root, base, own_task_files(root / "data", n_train=160, n_dev=48))


def cli(*args) -> int:
    return main([str(a) for a in args])


@pytest.fixture(scope="module")
def teachers(work) -> dict[str, Path]:
    """Each kind's teacher, fine-tuned from the bare encoder through the CLI (the only stage given --task)."""
    out = {}
    for kind, expected in EXPECTED.items():
        files = work.files[kind]
        out[kind] = work.root / f"teacher-{kind}"
        assert cli("teacher", "finetune", "--model", work.base, "--task", kind, "--train-file", files["train"],
                   "--dev-file", files["dev"], "--test-file", files["test"], *expected.args,
                   "--epochs", 20, "--batch-size", 16, "--lr", 3e-3, "--out", out[kind]) == 0
    return out


def records(folder: Path, split: str) -> list[dict]:
    """The folder's eval records of ``split``, oldest first (metrics.json read as JSON)."""
    rows = json.loads((folder / "metrics.json").read_text())["results"]
    return [r for r in rows if r.get("kind") == "eval" and r.get("split") == split]


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


# ---------------------------------------------------------------------------- gold data, read by hand


def csv_column(path: Path, column: str) -> list[str]:
    with path.open(newline="", encoding="utf-8") as f:
        return [row[column] for row in csv.DictReader(f)]


def jsonl_column(path: Path, column: str) -> list:
    return [json.loads(line)[column] for line in path.read_text().splitlines() if line.strip()]


def entities(tags: list[str]) -> list[tuple[str, int, int]]:
    """(type, first word, last word + 1) of IOB2 tags by CoNLL's rules: an I- that continues nothing starts one."""
    found, current = [], None
    for i, tag in enumerate([*tags, "O"]):
        kind = tag[2:] if tag != "O" else None
        if current and (tag == "O" or tag.startswith("B-") or kind != current[0]):
            found.append((current[0], current[1], i))
            current = None
        if kind and current is None:
            current = (kind, i)
    return found


def chance_threshold(kind: str, path: Path) -> float:
    """The score a model must beat to be above chance on the examples in ``path``, by hand: the majority class plus
    10 points (classification), predicting every label plus 5 (multi-label micro F1 = 2d / (1 + d) at density d),
    or 50 (a correlation or an entity F1 at chance is near 0)."""
    if kind == CLASSIFICATION:
        labels = csv_column(path, "category")
        return 100 * max(labels.count(x) for x in set(labels)) / len(labels) + 10
    if kind == MULTI_LABEL:
        rows = jsonl_column(path, "tags")
        density = sum(len(r) for r in rows) / (3 * len(rows))
        return 100 * 2 * density / (1 + density) + 5
    return 50.0


def check_predictions(kind: str, path: Path, files: dict, reported: dict, labels: list[str]) -> list:
    """The prediction file's format, and its reported primary score recounted from it by hand; its predictions."""
    text = path.read_text(encoding="utf-8")
    if kind == TOKEN:
        gold = read_conll_file(files["test"])
        lines = text.split("\n")
        predicted, at = [], 0
        for words, _ in gold:  # each sentence: one "token<TAB>TAG" per input word, then one empty line
            block = [line.split("\t") for line in lines[at: at + len(words)]]
            assert [b[0] for b in block] == words and all(len(b) == 2 for b in block)
            assert lines[at + len(words)] == ""
            predicted.append([b[1] for b in block])
            at += len(words) + 1
        assert lines[at:] == [""]  # the file ends after the last sentence's empty line
        assert {t for row in predicted for t in row} <= set(labels)
        from seqeval.metrics import f1_score

        assert f1_score([t for _, t in gold], predicted) * 100 == pytest.approx(reported["entity_f1"], abs=1e-6)
        return predicted
    lines = text.splitlines()
    assert lines[0] == "index\tprediction"
    rows = [line.split("\t") for line in lines[1:]]
    assert [int(i) for i, _ in rows] == list(range(len(rows)))
    values = [v for _, v in rows]
    if kind == CLASSIFICATION:
        gold = csv_column(files["test"], "category")
        assert set(values) <= set(labels)
        right = sum(p == g for p, g in zip(values, gold))
        assert 100 * right / len(gold) == pytest.approx(reported["accuracy"], abs=1e-6)
        return values
    if kind == MULTI_LABEL:
        sets = [json.loads(v) for v in values]
        assert all(isinstance(s, list) and set(s) <= set(labels) for s in sets)
        gold = jsonl_column(files["test"], "tags")
        tp = sum(len(set(p) & set(g)) for p, g in zip(sets, gold))
        fp = sum(len(set(p) - set(g)) for p, g in zip(sets, gold))
        fn = sum(len(set(g) - set(p)) for p, g in zip(sets, gold))
        assert 100 * 2 * tp / (2 * tp + fp + fn) == pytest.approx(reported["micro_f1"], abs=1e-6)
        assert 100 * sum(set(p) == set(g) for p, g in zip(sets, gold)) / len(gold) == pytest.approx(
            reported["subset_accuracy"], abs=1e-6)
        return sets
    scores = [float(v) for v in values]
    gold = [float(g) for g in csv_column(files["test"], "score")]
    # The file keeps 3 decimals: the MSE of the written numbers is the reported one to within rounding.
    assert sum((p - g) ** 2 for p, g in zip(scores, gold)) / len(gold) == pytest.approx(reported["mse"], abs=5e-3)
    return scores


# ---------------------------------------------------------------------------- 1. every kind, end to end


@pytest.mark.versions
@pytest.mark.e2e
@pytest.mark.parametrize("kind", list(EXPECTED))
def test_every_kind_end_to_end_through_the_cli(kind, work, teachers, monkeypatch, tmp_path):
    monkeypatch.setenv("COMPRESS_CACHE", str(tmp_path / "cache"))  # teacher outputs of recovery distillation
    expected, files, teacher = EXPECTED[kind], work.files[kind], teachers[kind]
    data = ("--train-file", files["train"], "--dev-file", files["dev"])

    # The teacher learnt the task: above chance on dev (the rule worked out by hand from the dev file).
    threshold = chance_threshold(kind, files["dev"])
    assert records(teacher, "dev")[-1]["metrics"][expected.primary] > threshold

    folders = {"teacher": teacher}
    out = {name: tmp_path / name for name in ("student", "pruned", "int8", "int8-torch", "onnx", "openvino")}
    assert cli("distill", "--teacher", teacher, *data, "--test-file", files["test"], "--student", "1L-32-37",
               "--heads", 4, "--epochs", 6, "--batch-size", 16, "--lr", 3e-3, "--cache-dir", tmp_path / "cache",
               "--out", out["student"]) == 0
    assert cli("prune", "--model", teacher, *data, "--remove-heads", 0.5, "--recovery", "distill", "--epochs", 1,
               "--out", out["pruned"]) == 0
    assert cli("quantize", "--model", teacher, "--backend", "onnxruntime", "--scheme", "static", *data,
               "--out", out["int8"]) == 0
    assert cli("quantize", "--model", teacher, "--backend", "torch", "--scheme", "dynamic", *data,
               "--out", out["int8-torch"]) == 0
    assert cli("export", "--model", teacher, "--format", "onnx", "--out", out["onnx"]) == 0
    assert cli("export", "--model", teacher, "--format", "openvino", "--out", out["openvino"]) == 0
    folders.update(out)
    assert records(out["student"], "dev")[-1]["metrics"][expected.primary] > threshold  # distillation kept the task

    labels = expected.spec["labels"]
    for name, folder in folders.items():
        assert read_json(folder / "compression.json")["task_spec"] == expected.spec, name
        config = read_json(folder / "config.json")
        assert config["architectures"] == [expected.architecture], name
        assert config.get("problem_type") == expected.problem_type, name
        if labels:
            assert config["id2label"] == {str(i): label for i, label in enumerate(labels)}, name
            assert config["label2id"] == {label: i for i, label in enumerate(labels)}, name
        else:  # a regression head: one output, no label names
            assert len(config["id2label"]) == 1 and len(config["label2id"]) == 1, name

    scores, predictions = {}, {}
    for name, folder in folders.items():
        assert cli("eval", "--model", folder, "--data-file", files["test"], "--split", "test") == 0, name
        record = records(folder, "test")[-1]
        assert record["n"] == 48 and record["data"] == str(files["test"])
        scores[name] = record["metrics"]
        predictions[name] = check_predictions(kind, Path(record["predictions"]), files, record["metrics"], labels)

    # The teacher's --test-file score at the end of fine-tuning is what compress eval measures.
    assert records(teacher, "test")[0]["metrics"] == scores["teacher"]
    for name in ("onnx", "openvino"):  # the same network in another runtime: the same predictions
        for metric, value in scores["teacher"].items():
            assert scores[name][metric] == pytest.approx(value, abs=0.05), (name, metric)
        if kind == REGRESSION:
            assert predictions[name] == pytest.approx(predictions["teacher"], abs=2e-3)
        else:
            assert predictions[name] == predictions["teacher"], name
    for name in ("int8", "int8-torch"):  # int8: within a couple of points
        assert abs(scores[name][expected.primary] - scores["teacher"][expected.primary]) <= 3.0, (name, scores)

    if kind == MULTI_LABEL:  # --label-sep joins the predicted names instead of a JSON list
        assert cli("eval", "--model", out["int8"], "--data-file", files["test"], "--split", "test", "--label-sep", "|",
                   "--no-record", "--predictions", tmp_path / "joined") == 0
        lines = (tmp_path / "joined" / "multi-label_test.tsv").read_text().splitlines()
        assert lines[0] == "index\tprediction"
        joined = [line.split("\t")[1] for line in lines[1:]]
        assert joined == ["|".join(names) for names in predictions["int8"]]
        # --threshold moves every decision one way: a higher one predicts a subset of the labels, a lower a superset.
        for threshold, keeps in ((0.95, set.issubset), (0.05, set.issuperset)):
            where = tmp_path / f"t{threshold}"
            assert cli("eval", "--model", out["int8"], "--data-file", files["test"], "--split", "test",
                       "--threshold", threshold, "--no-record", "--predictions", where) == 0
            rows = (where / "multi-label_test.tsv").read_text().splitlines()[1:]
            moved = [set(json.loads(line.split("\t")[1])) for line in rows]
            assert all(keeps(m, set(p)) for m, p in zip(moved, predictions["int8"]))
            assert moved != [set(p) for p in predictions["int8"]]  # and some do move


# ---------------------------------------------------------------------------- 2. metrics by hand


def test_entity_scores_by_hand_and_as_seqeval_computes_them():
    # Gold: PER over words 0-1, LOC at word 3. Predicted: PER 0-1 (exact), ORG at 3 (a type mismatch with LOC)
    # and LOC at 4, begun by an I- tag that continues nothing: 3 predicted, 2 gold, 1 right.
    gold = [["B-PER", "I-PER", "O", "B-LOC", "O"], ["O", "O"]]
    pred = [["B-PER", "I-PER", "O", "B-ORG", "I-LOC"], ["O", "O"]]
    assert entities(pred[0]) == [("PER", 0, 2), ("ORG", 3, 4), ("LOC", 4, 5)]
    scores = entity_metrics(pred, gold)
    p, r = 1 / 3, 1 / 2
    assert scores["entity_precision"] == pytest.approx(100 * p)
    assert scores["entity_recall"] == pytest.approx(100 * r)
    assert scores["entity_f1"] == pytest.approx(100 * 2 * p * r / (p + r)) == pytest.approx(40.0)
    # Per type: PER 1 of 1 both ways; LOC's one prediction is at the wrong word; ORG is not in gold.
    assert {k: v for k, v in scores.items() if k.startswith("f1_")} == {
        "f1_PER": pytest.approx(100.0), "f1_LOC": pytest.approx(0.0), "f1_ORG": pytest.approx(0.0)}
    assert scores["n"] == 2

    # A task scores only its own types (ORG is not one), and the overall numbers are the same.
    task = user_task(TOKEN, "ner", ("O", "B-LOC", "I-LOC", "B-PER", "I-PER"))
    assert task_metrics(task, pred, gold) == {
        "entity_f1": pytest.approx(40.0), "entity_precision": pytest.approx(100 / 3),
        "entity_recall": pytest.approx(50.0), "f1_LOC": 0.0, "f1_PER": pytest.approx(100.0), "n": 2}


def test_entity_metrics_equal_seqeval_on_random_tags():
    from seqeval.metrics import classification_report, f1_score, precision_score, recall_score

    rng = np.random.default_rng(0)
    tags = ["O", "O", "O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"]
    lengths = rng.integers(1, 12, size=40)
    gold = [[tags[i] for i in rng.integers(0, len(tags), n)] for n in lengths]
    pred = [[t if rng.random() < 0.7 else tags[rng.integers(0, len(tags))] for t in row] for row in gold]
    scores = entity_metrics(pred, gold)
    assert scores["entity_f1"] == pytest.approx(100 * f1_score(gold, pred))
    assert scores["entity_precision"] == pytest.approx(100 * precision_score(gold, pred))
    assert scores["entity_recall"] == pytest.approx(100 * recall_score(gold, pred))
    report = classification_report(gold, pred, output_dict=True)
    for kind in ("PER", "LOC", "ORG"):
        assert scores[f"f1_{kind}"] == pytest.approx(100 * report[kind]["f1-score"])


def test_multi_label_scores_by_hand():
    refs = [[1, 0, 1], [0, 1, 0], [1, 1, 0]]
    preds = [[1, 0, 0], [0, 1, 0], [1, 0, 1]]
    # Per label (tp, fp, fn): a (2, 0, 0) F1 1; b (1, 0, 1) F1 2/3; c (0, 1, 1) F1 0. Pooled: (3, 1, 2) -> 6/9.
    scores = multi_label_metrics(preds, refs)
    assert scores["micro_f1"] == pytest.approx(100 * 6 / 9)
    assert scores["macro_f1"] == pytest.approx(100 * (1 + 2 / 3 + 0) / 3)
    assert scores["subset_accuracy"] == pytest.approx(100 / 3)  # only the second row is all right
    assert scores["n"] == 3
    task = user_task(MULTI_LABEL, "topics", ("a", "b", "c"))
    assert task_metrics(task, preds, refs) == scores


def test_text_classification_macro_f1_and_regression_mse_by_hand():
    task = user_task(CLASSIFICATION, "three", ("a", "b", "c"))
    refs, preds = [0, 0, 1, 1, 2, 2], [0, 1, 1, 1, 2, 0]
    # a: tp 1, fp 1, fn 1 -> 1/2; b: tp 2, fp 1, fn 0 -> 4/5; c: tp 1, fp 0, fn 1 -> 2/3.
    scores = task_metrics(task, preds, refs)
    assert scores["accuracy"] == pytest.approx(100 * 4 / 6)
    assert scores["macro_f1"] == pytest.approx(100 * (1 / 2 + 4 / 5 + 2 / 3) / 3)

    task = user_task(REGRESSION, "scores")
    preds, refs = [1.0, 2.5, 0.0, 4.0], [1.5, 2.0, 1.0, 4.0]
    scores = task_metrics(task, preds, refs)
    assert scores["mse"] == pytest.approx((0.25 + 0.25 + 1.0 + 0.0) / 4)
    x, y = np.array(preds) - np.mean(preds), np.array(refs) - np.mean(refs)
    assert scores["pearson"] == pytest.approx(100 * (x @ y) / math.sqrt((x @ x) * (y @ y)))
    # Ranks: preds 2, 3, 1, 4 and refs 2, 3, 1, 4 agree exactly.
    assert scores["spearmanr"] == pytest.approx(100.0)
    assert set(scores) == {"pearson", "spearmanr", "mse", "n"}


# ---------------------------------------------------------------------------- 3. label order


def _labels_of(tmp_path: Path, name: str, found: list[str], **options) -> tuple[str, ...]:
    """The label order of a task whose training file holds the labels ``found``, in that order."""
    path = tmp_path / name / "train.csv"
    path.parent.mkdir(parents=True)
    path.write_text("text,label\n" + "".join(f"the dog {i},{label}\n" for i, label in enumerate(found)))
    return resolve_task(CLASSIFICATION, TaskOptions(**options), train_file=path).label_names


def test_labels_are_sorted_numbers_numerically_and_labels_keeps_the_given_order(tmp_path):
    assert _labels_of(tmp_path, "names", ["pets", "films", "travel", "pets"]) == ("films", "pets", "travel")
    assert _labels_of(tmp_path, "numbers", ["10", "2", "1", "2"]) == ("1", "2", "10")
    assert _labels_of(tmp_path, "signed", ["3", "-1", "0"]) == ("-1", "0", "3")
    assert _labels_of(tmp_path, "mixed", ["2", "10", "x"]) == ("10", "2", "x")  # not all numbers: as text
    assert _labels_of(tmp_path, "given", ["pets", "films"], labels=("pets", "zoo", "films")) == ("pets", "zoo", "films")
    with pytest.raises(CompressError, match=r"holds label\(s\) films that --labels does not list"):
        _labels_of(tmp_path, "short", ["pets", "films"], labels=("pets", "zoo"))

    path = tmp_path / "multi.csv"
    path.write_text('text,label\nthe dog,"b;a"\nthe cat,c\nthe man,\n')
    task = resolve_task(MULTI_LABEL, TaskOptions(label_sep=";"), train_file=path)
    assert task.label_names == ("a", "b", "c") and task.label_sep == ";" and task.threshold == 0.5
    task = resolve_task(MULTI_LABEL, TaskOptions(label_sep=";", threshold=0.7), train_file=path)
    assert task.to_record()["threshold"] == 0.7


def test_bio_tags_are_ordered_o_first_then_b_and_i_per_type(tmp_path):
    path = write_conll(tmp_path / "tags.conll", [
        (["paris", "river", "is"], ["B-place", "I-place", "O"]),
        (["the", "dog", "cat"], ["O", "B-animal", "I-animal"]),
        (["a", "man"], ["O", "B-agent"]),
    ])
    task = resolve_task(TOKEN, TaskOptions(), train_file=path)
    assert task.label_names == ("O", "B-agent", "B-animal", "I-animal", "B-place", "I-place")
    assert task.metrics == ("entity_f1", "entity_precision", "entity_recall", "f1_agent", "f1_animal", "f1_place")


@pytest.mark.e2e
def test_given_label_order_survives_finetune_distill_quantize_export(work, tmp_path, monkeypatch):
    monkeypatch.setenv("COMPRESS_CACHE", str(tmp_path / "cache"))
    files = work.files[CLASSIFICATION]
    data = ("--train-file", files["train"], "--dev-file", files["dev"])
    order = ["travel", "pets", "people", "films"]  # reversed: not the sorted default
    folders = [tmp_path / name for name in ("teacher", "student", "int8", "onnx", "openvino")]
    teacher, student, int8, onnx, openvino = folders
    assert cli("teacher", "finetune", "--model", work.base, "--task", CLASSIFICATION, *data,
               "--label-column", "category", "--labels", ",".join(order), "--epochs", 20, "--batch-size", 16,
               "--lr", 3e-3, "--out", teacher) == 0
    assert cli("distill", "--teacher", teacher, *data, "--student", "1L-32-37", "--heads", 4, "--epochs", 6,
               "--batch-size", 16, "--lr", 3e-3, "--cache-dir", tmp_path / "cache", "--out", student) == 0
    assert cli("quantize", "--model", student, "--backend", "onnxruntime", "--scheme", "static", *data,
               "--out", int8) == 0
    assert cli("export", "--model", student, "--format", "onnx", "--out", onnx) == 0
    assert cli("export", "--model", int8, "--format", "openvino", "--out", openvino) == 0
    for folder in folders:
        config = read_json(folder / "config.json")
        assert config["id2label"] == {"0": "travel", "1": "pets", "2": "people", "3": "films"}, folder.name
        assert config["label2id"] == {"travel": 0, "pets": 1, "people": 2, "films": 3}, folder.name
        assert read_json(folder / "compression.json")["task_spec"]["labels"] == order, folder.name
    # Output i means order[i] in training as in every record: the last folder still predicts well, by the names.
    assert cli("eval", "--model", openvino, "--data-file", files["test"], "--split", "test") == 0
    record = records(openvino, "test")[-1]
    assert record["metrics"]["accuracy"] > chance_threshold(CLASSIFICATION, files["test"])
    check_predictions(CLASSIFICATION, Path(record["predictions"]), files, record["metrics"], order)


def test_a_folder_without_compression_json_resolves_its_task_from_config(work, teachers, tmp_path):
    for kind, expected in EXPECTED.items():
        copy = shutil.copytree(teachers[kind], tmp_path / kind)
        (copy / "compression.json").unlink()
        task = task_of_model(copy)
        assert task is not None and task.kind == kind
        assert list(task.label_names) == expected.spec["labels"]
    # Later stages still need no --task: eval of the copy predicts as the original (the csv's label column named again).
    files = work.files[CLASSIFICATION]
    assert cli("eval", "--model", teachers[CLASSIFICATION], "--data-file", files["test"], "--split", "test",
               "--no-record", "--predictions", tmp_path / "original") == 0
    assert cli("eval", "--model", tmp_path / CLASSIFICATION, "--data-file", files["test"], "--split", "test",
               "--label-column", "category", "--no-record", "--predictions", tmp_path / "copy") == 0
    assert (tmp_path / "copy" / f"{CLASSIFICATION}_test.tsv").read_text() == \
        (tmp_path / "original" / f"{CLASSIFICATION}_test.tsv").read_text()


# ---------------------------------------------------------------------------- 4. stock loaders


def test_stock_pipelines_read_the_fine_tuned_folders_with_the_users_labels(work, teachers, tmp_path):
    from transformers import pipeline

    # Text classification: the stock pipeline predicts what compress eval predicts, by the user's label names.
    tc, files = teachers[CLASSIFICATION], work.files[CLASSIFICATION]
    assert cli("eval", "--model", tc, "--data-file", files["test"], "--split", "test", "--no-record",
               "--predictions", tmp_path / "tc") == 0
    lines = (tmp_path / "tc" / f"{CLASSIFICATION}_test.tsv").read_text().splitlines()[1:]
    ours = [line.split("\t")[1] for line in lines]
    texts = csv_column(files["test"], "text")[:16]
    stock = [row["label"] for row in pipeline("text-classification", model=str(tc))(texts)]
    assert set(stock) <= {"films", "people", "pets", "travel"}
    assert stock == ours[:16]

    # Token classification: entity groups named by the user's types, at the right characters of the sentence.
    ner, files = teachers[TOKEN], work.files[TOKEN]
    assert cli("eval", "--model", ner, "--data-file", files["test"], "--split", "test", "--no-record",
               "--predictions", tmp_path / "ner") == 0
    predicted = [tags for _, tags in read_conll_file(tmp_path / "ner" / f"{TOKEN}_test.conll")]
    # A sentence the model tags right, with a two-word place in it (an I- tag to group).
    words, tags = next((w, t) for (w, t), p in zip(read_conll_file(files["test"]), predicted)
                       if p == t and "I-place" in t and "B-animal" in t)
    sentence = " ".join(words)
    starts = [sum(len(w) + 1 for w in words[:i]) for i in range(len(words))]
    want = [(kind, starts[a], starts[b - 1] + len(words[b - 1]), " ".join(words[a:b])) for kind, a, b in entities(tags)]
    groups = pipeline("token-classification", model=str(ner), aggregation_strategy="simple")(sentence)
    got = [(g["entity_group"], g["start"], g["end"], sentence[g["start"]:g["end"]]) for g in groups]
    assert got == want and {g["word"] for g in groups} == {w for *_, w in want}


@pytest.mark.e2e
def test_onnx_and_openvino_folders_carry_the_labels_and_per_token_logits(teachers, tmp_path):
    import onnxruntime as ort

    ner = teachers[TOKEN]
    assert cli("export", "--model", ner, "--format", "onnx", "--out", tmp_path / "onnx") == 0
    assert cli("export", "--model", ner, "--format", "openvino", "--out", tmp_path / "ov") == 0
    want = {"0": "O", "1": "B-animal", "2": "B-place", "3": "I-place"}
    for folder in (ner, tmp_path / "onnx", tmp_path / "ov"):
        assert read_json(folder / "config.json")["id2label"] == want
    session = ort.InferenceSession(str(tmp_path / "onnx" / "model.onnx"))
    (logits,) = session.get_outputs()
    assert logits.name == "logits" and len(logits.shape) == 3 and logits.shape[2] == 4  # (batch, seq, labels)
    ids = np.array([[2, 10, 11, 12, 13, 3], [2, 10, 11, 3, 0, 0]], dtype=np.int64)  # [CLS] ... [SEP], padded
    feeds = {"input_ids": ids, "attention_mask": (ids != 0).astype(np.int64), "token_type_ids": np.zeros_like(ids)}
    (out,) = session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})
    assert out.shape == (2, 6, 4)


# ---------------------------------------------------------------------------- 5. bad data: one line, nothing written


def _refused(capsys, tmp_path: Path, *args) -> str:
    """Run the CLI with ``args`` (``--out tmp_path/out``); it must fail in one line and write nothing."""
    before = sorted(p.name for p in tmp_path.iterdir())
    assert cli(*args, "--out", tmp_path / "out") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no work or temporary folder left either
    return err[0]


def _finetune(base: Path, kind: str, train: Path, dev: Path, *extra) -> tuple:
    return ("teacher", "finetune", "--model", base, "--task", kind, "--train-file", train, "--dev-file", dev, *extra,
            "--epochs", 1)


FINETUNE_ERROR = "compress teacher finetune: error: "
TC_GOOD = "text,category\nthe dog sat,pets\na film,films\n"


def _files(tmp_path: Path, **texts: str) -> dict[str, Path]:
    paths = {}
    for name, text in texts.items():
        paths[name] = tmp_path / name.replace("_", ".")
        paths[name].write_text(text, encoding="utf-8")
    return paths


def test_a_dev_or_test_label_never_seen_in_training_is_refused(work, tmp_path, capsys):
    f = _files(tmp_path, train_csv=TC_GOOD, dev_csv="text,category\nthe dog,pets\nthe sun,weather\n")
    line = _refused(capsys, tmp_path, *_finetune(work.base, CLASSIFICATION, f["train_csv"], f["dev_csv"],
                                                 "--label-column", "category", "--task-name", "reviews"))
    assert line == (f"{FINETUNE_ERROR}{f['dev_csv']}:3: label 'weather' is not one of reviews's labels (films, pets); "
                    "the labels come from the training data, so a dev or test label must occur there "
                    "(or fix the label)")

    f = _files(tmp_path, train_conll="the\tO\ndog\tB-animal\n\nparis\tB-place\n",
               dev_conll="the\tO\ncat\tB-animal\n", test_conll="a\tO\ndog\tB-animal\n\nthe\tO\nman\tO\nbob\tB-person\n")
    line = _refused(capsys, tmp_path, *_finetune(work.base, TOKEN, f["train_conll"], f["dev_conll"],
                                                 "--test-file", f["test_conll"], "--task-name", "ner"))
    assert line == (f"{FINETUNE_ERROR}{f['test_conll']}:6: label 'B-person' is not one of ner's labels (O, B-animal, "
                    "B-place); the labels come from the training data, so a dev or test label must occur there (or fix "
                    "the label)")


def test_a_missing_column_is_refused_listing_the_columns_there(work, tmp_path, capsys):
    f = _files(tmp_path, train_csv=TC_GOOD, dev_csv=TC_GOOD)
    line = _refused(capsys, tmp_path, *_finetune(work.base, CLASSIFICATION, f["train_csv"], f["dev_csv"]))
    assert line == (f"{FINETUNE_ERROR}{f['train_csv']}: no label column 'label' (columns here: text, category); "
                    "name it with --label-column COLUMN")
    line = _refused(capsys, tmp_path, *_finetune(work.base, CLASSIFICATION, f["train_csv"], f["dev_csv"],
                                                 "--label-column", "category", "--text-column", "sentence",
                                                 "--task-name", "reviews"))
    assert line == (f"{FINETUNE_ERROR}{f['train_csv']}: no column 'sentence' for reviews's text (columns here: text, "
                    "category); name it with --text-column COLUMN")


def test_an_empty_text_is_refused_at_its_line(work, tmp_path, capsys):
    f = _files(tmp_path, train_csv="text,category\nthe dog,pets\n,films\na film,films\n", dev_csv=TC_GOOD)
    line = _refused(capsys, tmp_path, *_finetune(work.base, CLASSIFICATION, f["train_csv"], f["dev_csv"],
                                                 "--label-column", "category"))
    assert line == (f"{FINETUNE_ERROR}{f['train_csv']}:3: the text in column 'text' is empty; fill it in or remove the "
                    "row (a text broken over lines leaves an empty one beside its label)")


def test_a_csv_row_broken_by_a_line_break_is_refused_at_its_line(work, tmp_path, capsys):
    broken = "text,category\nmy card works,card_working\nI can't use my card\n\n,card_not_working\n"
    f = _files(tmp_path, train_csv=broken, dev_csv="text,category\nok,card_working\n")
    line = _refused(capsys, tmp_path, *_finetune(work.base, CLASSIFICATION, f["train_csv"], f["dev_csv"],
                                                 "--label-column", "category"))
    assert line == (f"{FINETUNE_ERROR}{f['train_csv']}:3: 1 field(s) where the header has 2 (text, category): this row "
                    "has no 'category'; a line break inside an unquoted text splits a row in two: join the lines or "
                    "quote the text")


def test_a_conll_line_without_a_tag_is_refused_at_its_line(work, tmp_path, capsys):
    f = _files(tmp_path, train_conll="the\tO\ndog\tB-animal\n\nthe\tO\ncat\n", dev_conll="a\tO\ndog\tB-animal\n")
    line = _refused(capsys, tmp_path, *_finetune(work.base, TOKEN, f["train_conll"], f["dev_conll"]))
    assert line == (f"{FINETUNE_ERROR}{f['train_conll']}:5: 'cat' has no tag; a CoNLL line holds a token and its tag "
                    "(token<TAB>tag), and sentences are separated by an empty line")


@pytest.mark.parametrize("bad", ["PER", "E-PER", "S-animal"])
@pytest.mark.parametrize("where", ["train", "dev"])
def test_a_tag_not_in_bio_form_is_refused_at_its_own_line(bad, where, work, tmp_path, capsys):
    good = "the\tO\ndog\tB-animal\n\nparis\tB-place\nriver\tI-place\n"
    wrong = f"the\tO\ndog\tB-animal\n\nthe\tO\nbob\t{bad}\n"  # the bad tag is on line 5, its sentence starts at 4
    f = _files(tmp_path, train_conll=wrong if where == "train" else good, dev_conll=wrong if where == "dev" else good)
    line = _refused(capsys, tmp_path, *_finetune(work.base, TOKEN, f["train_conll"], f["dev_conll"]))
    assert line == (f"{FINETUNE_ERROR}{f[where + '_conll']}:5: tag {bad!r} is not in BIO form (O, B-TYPE, I-TYPE); "
                    "convert the tags to IOB2")


LONG = "the dog sat on the mat in paris and the cat".split()  # 11 words, one word piece each
LONG_TAGS = ["O", "B-animal", "O", "O", "O", "O", "O", "B-place", "O", "O", "B-animal"]


def test_a_sentence_longer_than_max_length_is_truncated_and_counted(tokenizer, tmp_path, caplog):
    path = write_conll(tmp_path / "long.conll", [(LONG, LONG_TAGS), (["a", "dog"], ["O", "B-animal"])])
    task = resolve_task(TOKEN, TaskOptions(), train_file=path)
    ds = load_split(task, "train", DataSource(data_file=str(path)))
    with caplog.at_level(logging.WARNING, logger="compress.core.data.token_data"):
        features = token_features(ds, tokenizer, max_length=8, what="long")
    # 8 pieces = [CLS] + the first 6 words + [SEP]: 11 - 6 = 5 words lost their tags.
    assert [r.getMessage() for r in caplog.records if r.name == "compress.core.data.token_data"] == [
        "long: 1 of 2 sentences are longer than --max-length 8 word pieces and were truncated: 5 words lost their tags "
        "(predicted O); raise --max-length to keep them"]
    ids = task.label_names.index
    assert features[0]["labels"] == [-100, ids("O"), ids("B-animal"), ids("O"), ids("O"), ids("O"), ids("O"), -100]
    assert features[1]["labels"] == [-100, ids("O"), ids("B-animal"), -100]

    sentences = tmp_path / "long.csv"
    sentences.write_text("text,label\n" + " ".join(LONG) + ",pets\nthe dog,films\n")
    task = resolve_task(CLASSIFICATION, TaskOptions(), train_file=sentences)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="compress.core.data.features"):
        ds = load_split(task, "train", DataSource(data_file=str(sentences)))
        features = tokenize_classification(ds, task, tokenizer, 8)
    assert [len(x) for x in features["input_ids"]] == [8, 4]
    assert [r.getMessage() for r in caplog.records if r.name == "compress.core.data.features"] == [
        "long: 1 of 2 examples are longer than --max-length 8 tokens and were truncated"]


def test_truncated_sentences_are_trained_and_scored_never_refused(work, teachers, tmp_path, caplog):
    path = write_conll(tmp_path / "long.conll", [(LONG, LONG_TAGS), (["a", "dog"], ["O", "B-animal"])])
    with caplog.at_level(logging.WARNING, logger="compress.core.data.token_data"):
        assert cli("teacher", "finetune", "--model", work.base, "--task", TOKEN, "--train-file", path,
                   "--dev-file", path, "--max-length", 8, "--epochs", 1, "--out", tmp_path / "m") == 0
    counted = [r.getMessage() for r in caplog.records if r.name == "compress.core.data.token_data"]
    assert {m.split(":")[0] for m in counted} == {"long training", "long eval"}  # the training and the dev features
    assert all("1 of 2 sentences are longer than --max-length 8 word pieces" in m and "5 words lost" in m
               for m in counted)
    assert cli("eval", "--model", teachers[TOKEN], "--data-file", path, "--max-length", 8, "--no-record",
               "--predictions", tmp_path / "p") == 0
    rows = read_conll_file(tmp_path / "p" / f"{TOKEN}_dev.conll")
    assert [words for words, _ in rows] == [LONG, ["a", "dog"]]
    assert rows[0][1][6:] == ["O"] * 5  # the words past the cut have no prediction: O


def _same_rows(task, first: Path, second: Path) -> None:
    a = load_split(task, "train", DataSource(data_file=str(first))).to_list()
    b = load_split(task, "train", DataSource(data_file=str(second))).to_list()
    assert a == b and len(a) > 1


def test_crlf_and_blank_lines_read_as_ordinary_csv_and_conll(tmp_path):
    rows = [("the dog sat", "pets"), ('a "fun" film, really', "films"), ("paris", "travel")]
    lf = tmp_path / "lf.csv"
    with lf.open("w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows([("text", "label"), *rows])
    crlf = tmp_path / "crlf.csv"
    with crlf.open("w", newline="") as f:
        f.write("text,label\r\n\r\n")
        writer = csv.writer(f, lineterminator="\r\n")
        for row in rows:
            writer.writerow(row)
            f.write("\r\n,\r\n" if row[1] == "pets" else "")  # an empty line and a row of blank fields
    task = resolve_task(CLASSIFICATION, TaskOptions(), train_file=lf)
    assert resolve_task(CLASSIFICATION, TaskOptions(), train_file=crlf).label_names == task.label_names == (
        "films", "pets", "travel")
    _same_rows(task, lf, crlf)
    assert load_split(task, "train", DataSource(data_file=str(crlf)))["text"] == [r[0] for r in rows]

    # Multi-label cells holding JSON lists (quoted, with commas inside), CRLF and blank lines again.
    sets = [("the dog in paris", ["animal", "place"]), ("boring", ["feeling"]), ("the a", [])]
    lf, crlf = tmp_path / "multi-lf.csv", tmp_path / "multi-crlf.csv"
    lf.write_text("text,label\n" + "".join(f'{t},"{json.dumps(x).replace(chr(34), 2 * chr(34))}"\n' for t, x in sets))
    crlf.write_bytes(lf.read_bytes().replace(b"\n", b"\r\n\r\n"))
    task = resolve_task(MULTI_LABEL, TaskOptions(), train_file=crlf)
    assert task.label_names == ("animal", "feeling", "place")
    _same_rows(task, lf, crlf)
    assert load_split(task, "train", DataSource(data_file=str(crlf)))["label"] == [[1, 0, 1], [0, 1, 0], [0, 0, 0]]

    sentences = [(["the", "dog"], ["O", "B-animal"]), (["paris", "river", "."], ["B-place", "I-place", "O"])]
    lf = write_conll(tmp_path / "lf.conll", sentences)
    crlf = tmp_path / "crlf.conll"
    # Blank lines before, between (one holding only a tab and spaces) and after the sentences.
    crlf.write_bytes(b"\r\n\r\nthe\tO\r\ndog\tB-animal\r\n \t \r\n\r\n"
                     b"paris\tB-place\r\nriver\tI-place\r\n.\tO\r\n\r\n\r\n")
    spaced = write_conll(tmp_path / "spaced.conll", sentences, sep=" ")
    jsonl = write_jsonl(tmp_path / "words.jsonl", [{"tokens": w, "tags": t} for w, t in sentences])
    task = resolve_task(TOKEN, TaskOptions(), train_file=lf)
    for other in (crlf, spaced, jsonl):
        assert resolve_task(TOKEN, TaskOptions(), train_file=other).label_names == task.label_names
        _same_rows(task, lf, other)
    assert read_conll_file(crlf) == sentences


def test_a_teacher_with_another_label_set_is_refused_listing_both_ways(work, teachers, tmp_path, capsys):
    teacher = teachers[CLASSIFICATION]
    train = tmp_path / "train.csv"
    train.write_text("text,category\nthe dog,pets\na film,films\na man,people\nthe sun,weather\n")
    line = _refused(capsys, tmp_path, "distill", "--teacher", teacher, "--train-file", train, "--dev-file", train)
    assert line == (f"compress distill: error: {train} does not have the label set of {teacher} (4 labels): "
                    "in the data but not the model: weather; in the model but not the data: travel; train on data "
                    "with the model's labels, or fine-tune a new model from its base encoder")
    task = task_of_model(teacher)
    with pytest.raises(CompressError) as err:  # the column comes from the task's record, the difference both ways
        check_label_set(task, train, teacher)
    assert "in the data but not the model: weather; in the model but not the data: travel" in str(err.value)
    check_label_set(task, work.files[CLASSIFICATION]["dev"], teacher)  # the same four labels: accepted


def test_a_kind_that_is_not_the_models_is_refused(work, teachers, tmp_path, capsys):
    teacher, files = teachers[CLASSIFICATION], work.files[CLASSIFICATION]
    line = _refused(capsys, tmp_path, "distill", "--teacher", teacher, "--task", MULTI_LABEL,
                    "--train-file", files["train"], "--dev-file", files["dev"])
    assert line == (f"compress distill: error: {teacher} was made for text-classification, a text-classification task; "
                    "--task multi-label does not fit it (leave --task out to use the model's own task)")


# ---------------------------------------------------------------------------- 6. distillation


def test_augmenting_a_token_task_is_refused_in_one_line(work, teachers, tmp_path, capsys):
    files = work.files[TOKEN]
    line = _refused(capsys, tmp_path, "distill", "--teacher", teachers[TOKEN], "--train-file", files["train"],
                    "--dev-file", files["dev"], "--augment", 2)
    assert line == ("compress distill: error: --augment/--transfer-text make sentence-task examples; "
                    "token-classification's tags belong to words that word replacement would change: pass --augment 0 "
                    "and no --transfer-text")


def _softmax(row: list[float]) -> list[float]:
    top = max(row)
    e = [math.exp(v - top) for v in row]
    return [v / sum(e) for v in e]


def test_token_kd_is_the_kl_over_real_tokens_times_t_squared():
    torch.manual_seed(0)
    student, teacher = torch.randn(2, 4, 3), torch.randn(2, 4, 3)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    t = 2.0
    kls = []
    for b in range(2):
        for s in range(4):
            if mask[b, s]:
                p = _softmax([v / t for v in teacher[b, s].tolist()])
                q = _softmax([v / t for v in student[b, s].tolist()])
                kls.append(sum(pi * math.log(pi / qi) for pi, qi in zip(p, q)))
    want = sum(kls) / len(kls) * t**2  # the mean over the 5 real tokens
    assert token_kd(student, teacher, mask, temperature=t).item() == pytest.approx(want, rel=1e-5)
    noisy = student.clone()
    noisy[mask == 0] = 100.0  # padding never counts
    assert token_kd(noisy, teacher, mask, temperature=t).item() == pytest.approx(want, rel=1e-5)
    assert token_kd(teacher, teacher, mask).item() == pytest.approx(0.0, abs=1e-6)


def test_sigmoid_kd_is_the_bernoulli_kl_times_t_squared():
    student = torch.tensor([[0.5, -1.0, 2.0], [3.0, 0.0, -2.5]])
    teacher = torch.tensor([[1.5, -0.5, -1.0], [2.0, 1.0, -3.0]])
    assert sigmoid_kd(teacher.clone(), teacher).item() == pytest.approx(0.0, abs=1e-6)
    t = 2.0
    terms = []
    for s_row, t_row in zip(student.tolist(), teacher.tolist()):
        for s, tt in zip(s_row, t_row):
            p, q = 1 / (1 + math.exp(-tt / t)), 1 / (1 + math.exp(-s / t))
            terms.append(p * math.log(p / q) + (1 - p) * math.log((1 - p) / (1 - q)))
    assert sigmoid_kd(student, teacher, temperature=t).item() == pytest.approx(sum(terms) / 6 * t**2, rel=1e-5)


def test_token_ce_ignores_unlabelled_positions():
    logits = torch.tensor([[[2.0, 0.0, -1.0], [0.5, 0.5, 3.0], [9.0, -9.0, 0.0]],
                           [[0.0, 1.0, 0.0], [5.0, 5.0, 5.0], [1.0, 2.0, 3.0]]])
    labels = torch.tensor([[0, -100, 2], [1, -100, -100]])  # 3 positions carry a tag
    want = -sum(math.log(_softmax(logits[b, s].tolist())[labels[b, s]]) for b, s in ((0, 0), (0, 2), (1, 0))) / 3
    assert token_ce(logits, labels).item() == pytest.approx(want, rel=1e-6)
    changed = logits.clone()
    changed[labels == -100] = torch.tensor([50.0, -50.0, 0.0])
    assert token_ce(changed, labels).item() == pytest.approx(want, rel=1e-6)
    assert token_ce(logits, torch.full((2, 3), -100)).item() == 0.0  # nothing tagged: 0, not NaN


def test_hard_label_bce_by_hand():
    logits = torch.tensor([[1.0, -2.0, 0.0], [0.5, 3.0, -1.0]])
    gold = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    terms = []
    for z_row, y_row in zip(logits.tolist(), gold.tolist()):
        for z, y in zip(z_row, y_row):
            p = 1 / (1 + math.exp(-z))
            terms.append(-(y * math.log(p) + (1 - y) * math.log(1 - p)))
    assert hard_label_bce(logits, gold).item() == pytest.approx(sum(terms) / 6, rel=1e-6)
