"""The evaluate entry point: tokenisation, label mapping by name, metrics.json, predictions, submissions."""

from __future__ import annotations

import json
import zipfile

import pytest
import torch

from compress.core.formats.records import read_metrics
from compress.core.data.features import squad_eval_features, squad_train_features, tokenize_classification
from compress.core.data.sources import DataSource, load_split
from compress.core.errors import CompressError
from compress.core.data.tasks import get_task
from compress.eval.evaluate import EvalConfig, evaluate, output_to_task_labels
from tests.conftest import make_tiny_model, save_tiny


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _constant_classifier(num_labels, winner, **config):
    """A tiny model whose classifier always picks output ``winner`` (zero weights, one big bias)."""
    model = make_tiny_model(num_labels=num_labels, **config)
    with torch.no_grad():
        model.classifier.weight.zero_()
        model.classifier.bias.zero_()
        model.classifier.bias[winner] = 5.0
    return model


# ---------------------------------------------------------------------------- tokenisation


def test_pair_tokenisation_has_segments_and_truncates(tokenizer, tmp_path):
    _write(tmp_path / "RTE" / "dev.tsv", "index\tsentence1\tsentence2\tlabel\n0\tthe cat sat\tthe dog sat on the mat\tentailment\n")
    ds = load_split(get_task("rte"), "dev", DataSource(data_dir=str(tmp_path)))
    feats = tokenize_classification(ds, get_task("rte"), tokenizer, max_length=64)
    row = feats[0]
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    assert row["input_ids"][0] == cls and row["input_ids"].count(sep) == 2
    # [CLS] the cat sat [SEP] -> segment 0 (5 tokens); the rest segment 1
    assert row["token_type_ids"][:5] == [0] * 5 and set(row["token_type_ids"][5:]) == {1}
    assert row["labels"] == 0 and row["idx"] == 0
    short = tokenize_classification(ds, get_task("rte"), tokenizer, max_length=8)
    assert len(short[0]["input_ids"]) == 8


def test_squad_features_locate_the_answer(tokenizer):
    import datasets

    ds = datasets.Dataset.from_dict(
        {
            "id": ["q"],
            "title": ["t"],
            "context": ["the capital of france is paris . the river is big . the cat sat on the mat . the dog did not ."],
            "question": ["what is the capital"],
            "answers": [{"text": ["paris"], "answer_start": [25]}],
        }
    )
    train = squad_train_features(ds, tokenizer, max_length=24, doc_stride=8)
    assert len(train) >= 1
    first = train[0]
    span = first["input_ids"][first["start_positions"] : first["end_positions"] + 1]
    assert tokenizer.decode(span) == "paris"
    # A window that cannot contain the answer points at [CLS].
    windows = squad_train_features(ds, tokenizer, max_length=16, doc_stride=4)
    assert any(w["start_positions"] == 0 and w["end_positions"] == 0 for w in windows)
    assert any(tokenizer.decode(w["input_ids"][w["start_positions"] : w["end_positions"] + 1]) == "paris" for w in windows)
    feats = squad_eval_features(ds, tokenizer, max_length=16, doc_stride=4)
    assert len(feats) == len(windows) and set(feats["example_id"]) == {"q"}
    # Offsets survive only for context tokens.
    row = feats[0]
    assert row["offset_mapping"][0] is None and any(o is not None for o in row["offset_mapping"])
    with pytest.raises(CompressError, match="--doc-stride 16 must be positive and below --max-length 16"):
        squad_eval_features(ds, tokenizer, max_length=16, doc_stride=16)


# ---------------------------------------------------------------------------- label mapping


def test_labels_are_mapped_by_name_not_by_id(tmp_path, tokenizer):
    # A checkpoint with the legacy GLUE order (contradiction, entailment, neutral) that always
    # outputs index 0 = contradiction. The task's index for contradiction is 2.
    legacy = {0: "contradiction", 1: "entailment", 2: "neutral"}
    model = _constant_classifier(3, 0, id2label=legacy, label2id={v: k for k, v in legacy.items()})
    model_dir = save_tiny(model, tokenizer, tmp_path / "mnli")
    header = "index\tpromptID\tpairID\tgenre\tsentence1\tsentence2\tgold_label\n"
    rows = "".join(f"{i}\t1\t1\tfic\tthe cat\tthe dog\tcontradiction\n" for i in range(4))
    for name in ("dev_matched", "dev_mismatched"):
        _write(tmp_path / "glue" / "MNLI" / f"{name}.tsv", header + rows)
    records = evaluate(model_dir, EvalConfig(task="mnli", data_dir=str(tmp_path / "glue")))
    assert [r["split"] for r in records] == ["dev_matched", "dev_mismatched"]
    assert all(r["metrics"]["accuracy"] == 100.0 for r in records)
    assert [r["split"] for r in read_metrics(model_dir)] == ["dev_matched", "dev_mismatched"]
    preds = (model_dir / "predictions" / "mnli_dev_matched.tsv").read_text().splitlines()
    assert preds[0] == "index\tprediction" and preds[1] == "0\tcontradiction"


def test_label_mapping_errors():
    config = make_tiny_model(num_labels=3).config
    with pytest.raises(CompressError, match="has 3 outputs but SST-2 has 2 labels"):
        output_to_task_labels(config, get_task("sst2"))
    with pytest.raises(CompressError, match="regression task"):
        output_to_task_labels(config, get_task("stsb"))
    named = make_tiny_model(num_labels=2, id2label={0: "neg", 1: "pos"}, label2id={"neg": 0, "pos": 1}).config
    with pytest.raises(CompressError, match="are not SST-2's"):
        output_to_task_labels(named, get_task("sst2"))
    assert output_to_task_labels(make_tiny_model(num_labels=2).config, get_task("sst2")) == [0, 1]


# ---------------------------------------------------------------------------- metrics and outputs


def test_accuracy_against_hand_count(tmp_path, tokenizer):
    # Always predicts "positive"; 3 of 5 dev labels are positive -> 60.0
    model_dir = save_tiny(_constant_classifier(2, 1), tokenizer, tmp_path / "m")
    _write(tmp_path / "SST-2" / "dev.tsv", "sentence\tlabel\n" + "".join(f"the movie {i} .\t{lab}\n" for i, lab in enumerate([1, 0, 1, 1, 0])))
    (record,) = evaluate(model_dir, EvalConfig(task="sst2", data_dir=str(tmp_path)))
    assert record["metrics"]["accuracy"] == 60.0 and record["n"] == 5
    assert read_metrics(model_dir)[-1]["metrics"]["accuracy"] == 60.0


def test_regression_eval_and_clipped_predictions(tmp_path, tokenizer):
    model = make_tiny_model(num_labels=1, problem_type="regression")
    model_dir = save_tiny(model, tokenizer, tmp_path / "stsb")
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    body = "".join(f"{i}\tg\tf\ty\t0\tn\tn\tthe cat sat {i}\tthe dog {i}\t{i * 1.2:.3f}\n" for i in range(5))
    _write(tmp_path / "STS-B" / "dev.tsv", header + body)
    (record,) = evaluate(model_dir, EvalConfig(task="stsb", data_dir=str(tmp_path), record=False))
    assert set(record["metrics"]) == {"pearson", "spearmanr", "n"}
    assert read_metrics(model_dir) == []  # record=False leaves metrics.json alone


def test_sst2_submission_file_and_zip(tmp_path, tokenizer):
    model_dir = save_tiny(_constant_classifier(2, 1), tokenizer, tmp_path / "m")
    _write(tmp_path / "SST-2" / "test.tsv", "index\tsentence\n" + "".join(f"{i}\tthe film .\n" for i in range(7)))
    sub = tmp_path / "submit"
    (record,) = evaluate(model_dir, EvalConfig(task="sst2", split="test", data_dir=str(tmp_path), submission=str(sub)))
    assert "metrics" not in record
    lines = (sub / "SST-2.tsv").read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == 8
    assert lines[1:] == [f"{i}\t1" for i in range(7)]
    with zipfile.ZipFile(sub / "submission.zip") as zf:
        assert zf.namelist() == ["SST-2.tsv"]
    assert read_metrics(model_dir) == []  # nothing to score on an unlabelled split


def test_mnli_submission_includes_ax(tmp_path, tokenizer):
    legacy = {0: "contradiction", 1: "entailment", 2: "neutral"}
    model = _constant_classifier(3, 2, id2label=legacy, label2id={v: k for k, v in legacy.items()})
    model_dir = save_tiny(model, tokenizer, tmp_path / "mnli")
    glue = tmp_path / "glue"
    header = "index\tpromptID\tpairID\tgenre\tsentence1\tsentence2\n"
    _write(glue / "MNLI" / "test_matched.tsv", header + "0\t1\t1\tfic\tthe cat\tthe dog\n1\t1\t1\tfic\ta\tb\n")
    _write(glue / "MNLI" / "test_mismatched.tsv", header + "0\t1\t1\tfic\tthe cat\tthe dog\n")
    _write(glue / "diagnostic" / "diagnostic.tsv", "index\tsentence1\tsentence2\n0\tthe cat\tthe dog\n")
    sub = tmp_path / "sub"
    records = evaluate(model_dir, EvalConfig(task="mnli", split="test", data_dir=str(glue), submission=str(sub)))
    assert [r["task"] for r in records] == ["mnli", "mnli", "ax"]
    assert (sub / "MNLI-m.tsv").read_text().splitlines() == ["index\tprediction", "0\tneutral", "1\tneutral"]
    assert (sub / "MNLI-mm.tsv").read_text().splitlines()[1] == "0\tneutral"
    assert (sub / "AX.tsv").read_text().splitlines() == ["index\tprediction", "0\tneutral"]
    with zipfile.ZipFile(sub / "submission.zip") as zf:
        assert sorted(zf.namelist()) == ["AX.tsv", "MNLI-m.tsv", "MNLI-mm.tsv"]


def test_submission_needs_test_split(tiny_model_dir, tmp_path):
    with pytest.raises(CompressError, match="use --split test"):
        evaluate(tiny_model_dir, EvalConfig(task="sst2", split="dev", data_dir=str(tmp_path), submission=str(tmp_path / "s")))


def test_squad_eval_writes_official_predictions(tmp_path, tokenizer):
    from compress.eval.squad import squad_v1_scores

    model_dir = save_tiny(make_tiny_model(head="question-answering"), tokenizer, tmp_path / "qa")
    doc = {
        "version": "1.1",
        "data": [
            {
                "title": "France",
                "paragraphs": [
                    {
                        "context": "paris is the capital of france . the river is big .",
                        "qas": [
                            {"id": "a", "question": "what is the capital", "answers": [{"text": "paris", "answer_start": 0}]},
                            {"id": "b", "question": "what is big", "answers": [{"text": "the river", "answer_start": 32}]},
                        ],
                    }
                ],
            }
        ],
    }
    data = _write(tmp_path / "dev-v1.1.json", json.dumps(doc))
    (record,) = evaluate(model_dir, EvalConfig(task="squad", data_file=str(data), max_length=14, doc_stride=4))
    preds = json.loads((model_dir / "predictions" / "squad_dev.json").read_text())
    assert set(preds) == {"a", "b"} and all(isinstance(v, str) for v in preds.values())
    ds = load_split(get_task("squad"), "dev", DataSource(data_file=str(data)))
    expected = squad_v1_scores(ds, preds)
    assert record["metrics"]["f1"] == pytest.approx(expected["f1"])
    assert record["metrics"]["exact_match"] == pytest.approx(expected["exact_match"])
    assert record["n_features"] > 2  # the short max length forced several windows


def test_eval_errors(tiny_model_dir, tmp_path):
    _write(tmp_path / "SST-2" / "dev.tsv", "sentence\tlabel\ngood .\t1\n")
    with pytest.raises(CompressError, match="above the model's maximum of 64 positions"):
        evaluate(tiny_model_dir, EvalConfig(task="sst2", data_dir=str(tmp_path), max_length=512))
    with pytest.raises(CompressError, match="--data-dir reads benchmark folders .* tiny is your own text-classification task"):
        evaluate(tiny_model_dir, EvalConfig(data_dir=str(tmp_path)))
    with pytest.raises(CompressError, match="has 2 outputs but MNLI has 3 labels"):
        evaluate(tiny_model_dir, EvalConfig(task="mnli", data_dir=str(tmp_path)))


def test_vocab_mismatch_is_caught(tmp_path, tokenizer):
    model = make_tiny_model(vocab_size=20)  # the tokenizer has more tokens than the embedding
    model_dir = save_tiny(model, tokenizer, tmp_path / "m")
    _write(tmp_path / "SST-2" / "dev.tsv", "sentence\tlabel\ngood .\t1\n")
    with pytest.raises(CompressError, match="gives ids up to 97, but the model's embedding matrix has 20 rows"):
        evaluate(model_dir, EvalConfig(task="sst2", data_dir=str(tmp_path)))


# ---------------------------------------------------------------------------- the model's own task, --no-record, indices


def _tree(folder):
    """Every file under ``folder`` with its content hash."""
    import hashlib

    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_no_record_leaves_the_model_folder_byte_identical(tmp_path, tokenizer):
    from compress.cli import main

    model_dir = save_tiny(_constant_classifier(2, 1), tokenizer, tmp_path / "m", extra={"task": "sst2"})
    _write(tmp_path / "SST-2" / "dev.tsv", "sentence\tlabel\n" + "".join(f"the movie {i} .\t{i % 2}\n" for i in range(6)))
    before = _tree(model_dir)
    (record,) = evaluate(model_dir, EvalConfig(task="sst2", data_dir=str(tmp_path), record=False))
    assert record["metrics"]["accuracy"] == 50.0 and "predictions" not in record
    assert main(["eval", "--model", str(model_dir), "--data-dir", str(tmp_path), "--no-record"]) == 0
    assert _tree(model_dir) == before
    # --predictions still writes them, elsewhere; a recording run does change the folder
    evaluate(model_dir, EvalConfig(task="sst2", data_dir=str(tmp_path), record=False, predictions=str(tmp_path / "p")))
    assert (tmp_path / "p" / "sst2_dev.tsv").is_file() and _tree(model_dir) == before
    evaluate(model_dir, EvalConfig(task="sst2", data_dir=str(tmp_path)))
    after = _tree(model_dir)
    assert "predictions/sst2_dev.tsv" in set(after) - set(before) and after["metrics.json"] != before["metrics.json"]


def test_eval_without_task_uses_the_models_compression_json(tmp_path, tokenizer, capsys):
    from compress.cli import main

    _write(tmp_path / "STS-B" / "dev.tsv", "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
           + "".join(f"{i}\tg\tf\ty\t0\tn\tn\tthe cat {i}\tthe dog\t{i * 0.9:.1f}\n" for i in range(5)))
    _write(tmp_path / "SST-2" / "dev.tsv", "sentence\tlabel\ngood .\t1\nbad .\t0\n")
    stsb = save_tiny(make_tiny_model(num_labels=1, problem_type="regression"), tokenizer, tmp_path / "stsb",
                     extra={"task": "stsb"})
    (record,) = evaluate(stsb, EvalConfig(data_dir=str(tmp_path), record=False))
    assert record["task"] == "stsb" and set(record["metrics"]) == {"pearson", "spearmanr", "n"}
    # A copy whose own record names no task (dynamic int8 needs none) inherits its parent's.
    parent = save_tiny(_constant_classifier(2, 1), tokenizer, tmp_path / "sst2-parent", config={"task": "sst2"})
    child = save_tiny(_constant_classifier(2, 1), tokenizer, tmp_path / "child", config={"task": ""}, parent=parent)
    (record,) = evaluate(child, EvalConfig(data_dir=str(tmp_path), record=False))
    assert record["task"] == "sst2" and record["n"] == 2
    # No record anywhere: a classifier is the user's own task, read off its config.json (its data comes from a file) ...
    orphan = save_tiny(_constant_classifier(2, 1), tokenizer, tmp_path / "orphan")
    capsys.readouterr()
    assert main(["eval", "--model", str(orphan), "--data-dir", str(tmp_path)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "orphan is your own text-classification task" in err[0] and "--data-file FILE" in err[0]
    # ... and a bare encoder has no task at all: one line, naming --task.
    bare = save_tiny(make_tiny_model(head="base"), tokenizer, tmp_path / "bare")
    capsys.readouterr()
    assert main(["eval", "--model", str(bare), "--data-dir", str(tmp_path)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "records no task (its config.json has no task head); pass --task" in err[0]


def test_prediction_and_submission_files_carry_the_inputs_own_index(tmp_path, tokenizer):
    model_dir = save_tiny(_constant_classifier(2, 1), tokenizer, tmp_path / "m")
    own = [17, 3, 42, 8, 100]  # not the row numbers 0..4
    _write(tmp_path / "SST-2" / "dev.tsv", "index\tsentence\tlabel\n" + "".join(f"{i}\tthe film {i} .\t1\n" for i in own))
    _write(tmp_path / "SST-2" / "test.tsv", "index\tsentence\n" + "".join(f"{i}\tthe film {i} .\n" for i in reversed(own)))
    evaluate(model_dir, EvalConfig(task="sst2", data_dir=str(tmp_path)))
    lines = (model_dir / "predictions" / "sst2_dev.tsv").read_text().splitlines()
    assert [line.split("\t")[0] for line in lines[1:]] == [str(i) for i in own]
    evaluate(model_dir, EvalConfig(task="sst2", split="test", data_dir=str(tmp_path), submission=str(tmp_path / "sub")))
    sub = (tmp_path / "sub" / "SST-2.tsv").read_text().splitlines()
    assert sub[0] == "index\tprediction" and [line.split("\t")[0] for line in sub[1:]] == [str(i) for i in reversed(own)]
    # a csv given with --data-file keeps its idx column; a file without one is numbered by row
    csv = _write(tmp_path / "rows.csv", "idx,text,stars\n9,good,1\n4,bad,0\n")
    (record,) = evaluate(model_dir, EvalConfig(task="sst2", data_file=str(csv), columns=("sentence=text", "label=stars"),
                                               predictions=str(tmp_path / "p")))
    assert (tmp_path / "p" / "sst2_dev.tsv").read_text().splitlines()[1:] == ["9\t1", "4\t1"]
    plain = _write(tmp_path / "plain.csv", "text,stars\ngood,1\nbad,0\n")
    evaluate(model_dir, EvalConfig(task="sst2", data_file=str(plain), columns=("sentence=text", "label=stars"),
                                   predictions=str(tmp_path / "q")))
    assert (tmp_path / "q" / "sst2_dev.tsv").read_text().splitlines()[1:] == ["0\t1", "1\t1"]
    bad = _write(tmp_path / "SST2bad" / "SST-2" / "dev.tsv", "index\tsentence\tlabel\nx7\tgood .\t1\n")
    with pytest.raises(CompressError, match="dev.tsv:2: index 'x7' is not an integer"):
        evaluate(model_dir, EvalConfig(task="sst2", data_dir=str(bad.parent.parent), record=False))



@pytest.mark.e2e
def test_openvino_runtime_gives_the_fp32_folders_own_scores(tmp_path, tokenizer):
    model_dir = save_tiny(make_tiny_model(), tokenizer, tmp_path / "m")
    rows = "".join(f"the {w} movie was {v} .\t{i % 2}\n" for i, (w, v) in enumerate(
        [("good", "great"), ("bad", "awful"), ("fun", "not fun"), ("dull", "boring"), ("long", "very good"), ("a", "bad")] * 5))
    _write(tmp_path / "SST-2" / "dev.tsv", "sentence\tlabel\n" + rows)
    torch_record, = evaluate(model_dir, EvalConfig(task="sst2", data_dir=str(tmp_path), record=False))
    (ov_record,) = evaluate(model_dir, EvalConfig(task="sst2", data_dir=str(tmp_path), record=False, runtime="openvino"))
    assert ov_record["metrics"] == torch_record["metrics"] and ov_record["runtime"] == "openvino"
    assert "runtime" not in torch_record
    # the same logits, not just the same (possibly constant) labels
    from compress.core.formats.folder import open_folder
    from compress.eval.evaluate import _load

    batch = tokenizer(["the movie was good .", "the plot was not very fun and the actor was awful ."], padding=True,
                      return_tensors="pt")
    with torch.inference_mode():
        want = _load(open_folder(model_dir), "sequence-classification", "auto")(**batch).logits
        got = _load(open_folder(model_dir), "sequence-classification", "openvino")(**batch).logits
    assert torch.allclose(got, want, atol=1e-4) and float(want.std()) > 0
    with pytest.raises(CompressError, match="runs on the CPU"):
        EvalConfig(task="sst2", runtime="openvino", device="cuda").validate()
