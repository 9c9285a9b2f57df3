"""Task registry facts and every data layout: GLUE TSVs, hub parquet, plain files, SQuAD JSON."""

from __future__ import annotations

import json
import time

import pytest

from compress.core.data.glue_squad import read_squad_json
from compress.core.data.labels import parse_label
from compress.core.data.sources import DataSource, load_split
from compress.core.errors import CompressError
from compress.core.data.tasks import GLUE_TASKS, TASKS, get_task

# ---------------------------------------------------------------------------- registry


def test_registry_has_every_glue_task_ax_and_squad():
    assert set(GLUE_TASKS) == {"cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli", "ax"}
    assert {"squad", "squad_v2"} <= set(TASKS)


def test_official_label_orders():
    # The hub (and every fine-tuned hub checkpoint) orders MNLI as entailment, neutral, contradiction.
    assert get_task("mnli").label_names == ("entailment", "neutral", "contradiction")
    assert get_task("rte").label_names == ("entailment", "not_entailment")
    assert get_task("wnli").label_names == ("not_entailment", "entailment")
    assert get_task("cola").label_names == ("unacceptable", "acceptable")
    assert get_task("stsb").kind == "regression" and get_task("stsb").num_labels == 1


def test_metric_sets():
    assert get_task("cola").metrics[0] == "matthews_correlation"
    assert set(get_task("mrpc").metrics) == {"f1", "accuracy"}
    assert set(get_task("qqp").metrics) == {"f1", "accuracy"}
    assert set(get_task("stsb").metrics) == {"pearson", "spearmanr"}
    assert "HasAns_f1" in get_task("squad_v2").metrics


@pytest.mark.parametrize("alias", ["SST-2", "sst-2", "sst_2", "SST2", "sst2"])
def test_aliases(alias):
    assert get_task(alias).name == "sst2"


def test_unknown_task_lists_valid_names():
    with pytest.raises(CompressError) as err:
        get_task("sst3")
    assert "valid:" in str(err.value) and "sst2" in str(err.value) and "squad_v2" in str(err.value)


def test_mnli_dev_resolves_to_matched_and_mismatched():
    names = [s.name for s in get_task("mnli").resolve_splits("dev")]
    assert names == ["dev_matched", "dev_mismatched"]
    assert [s.name for s in get_task("mnli").resolve_splits("dev_mismatched")] == ["dev_mismatched"]
    with pytest.raises(CompressError, match="valid: train, dev_matched"):
        get_task("mnli").resolve_splits("validation")


# ---------------------------------------------------------------------------- kinds of task

# (task, kind, head, outputs, problem_type, label_dtype, label_type, unlabelled, max_length, soft, hard,
#  prediction, num_labels, id2label), written out by hand rather than read back from the registry.
KIND_FACTS = [
    ("sst2", "text-classification", "sequence-classification", ("logits",), "single_label_classification", "int64", int,
     -1, 128, "kl", "cross_entropy", "label", 2, {0: "negative", 1: "positive"}),
    ("mnli", "text-classification", "sequence-classification", ("logits",), "single_label_classification", "int64", int,
     -1, 128, "kl", "cross_entropy", "label", 3, {0: "entailment", 1: "neutral", 2: "contradiction"}),
    ("stsb", "regression", "sequence-classification", ("logits",), "regression", "float32", float,
     -1.0, 128, "mse", "mse", "score", 1, None),
    ("squad", "span", "question-answering", ("start_logits", "end_logits"), None, None, None,
     None, 384, "span_kl", "span_cross_entropy", "answer", 0, None),
    ("squad_v2", "span", "question-answering", ("start_logits", "end_logits"), None, None, None,
     None, 384, "span_kl", "span_cross_entropy", "answer", 0, None),
]


@pytest.mark.parametrize("name, kind, head, outputs, problem_type, label_dtype, label_type, unlabelled, max_length, "
                         "soft, hard, prediction, num_labels, id2label", KIND_FACTS)
def test_task_kind_facts(name, kind, head, outputs, problem_type, label_dtype, label_type, unlabelled, max_length,
                         soft, hard, prediction, num_labels, id2label):
    task = get_task(name)
    b = task.behaviour
    assert task.kind == b.name == kind
    assert (b.head, b.outputs, b.problem_type, b.label_dtype) == (head, outputs, problem_type, label_dtype)
    assert b.label_type is label_type and b.unlabelled == unlabelled and type(b.unlabelled) is type(unlabelled)
    assert (b.max_length, b.soft_loss, b.hard_loss, b.prediction) == (max_length, soft, hard, prediction)
    assert task.num_labels == num_labels and task.id2label == id2label
    assert b.per_token is (kind == "span")  # start/end logits score positions: padding must leave them


def test_labels_description_and_unanswerable():
    assert get_task("mrpc").labels_description == "not_equivalent, equivalent"
    assert get_task("stsb").labels_description == "score 0-5"
    assert get_task("squad").labels_description == "answer span" and not get_task("squad").unanswerable
    assert get_task("squad_v2").labels_description == "answer span or no answer" and get_task("squad_v2").unanswerable


def test_unlabelled_rows_carry_the_kinds_placeholder(tmp_path):
    _write(tmp_path / "SST-2" / "test.tsv", "index\tsentence\n0\tgood film .\n")
    _write(tmp_path / "STS-B" / "test.tsv", "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\n"
           "0\tg\tf\ty\t0\tn\tn\tA.\tB.\n")
    src = DataSource(data_dir=str(tmp_path))
    sst2, stsb = load_split(get_task("sst2"), "test", src), load_split(get_task("stsb"), "test", src)
    assert sst2.features["label"].dtype == "int64" and sst2["label"] == [-1]
    assert stsb.features["label"].dtype == "float32" and stsb["label"] == [-1.0]


@pytest.mark.parametrize("name, model_class, problem_type, id2label", [
    ("sst2", "BertForSequenceClassification", "single_label_classification", {0: "negative", 1: "positive"}),
    ("mnli", "BertForSequenceClassification", "single_label_classification",
     {0: "entailment", 1: "neutral", 2: "contradiction"}),
    ("stsb", "BertForSequenceClassification", "regression", {0: "LABEL_0"}),
    ("squad", "BertForQuestionAnswering", None, {0: "LABEL_0", 1: "LABEL_1"}),
])
def test_load_model_for_task_gives_the_kinds_head(tmp_path, tokenizer, name, model_class, problem_type, id2label):
    from compress.core.formats.runtime import load_model_for_task
    from tests.conftest import make_tiny_model, save_tiny

    encoder = save_tiny(make_tiny_model("base"), tokenizer, tmp_path / "encoder")
    model = load_model_for_task(encoder, get_task(name))
    assert type(model).__name__ == model_class
    assert model.config.problem_type == problem_type
    assert model.config.id2label == id2label and model.config.num_labels == len(id2label)
    # With options (heads analysis): eager attention and the load info, the head still the task's.
    model, info = load_model_for_task(encoder, get_task(name), attn_implementation="eager", with_info=True)
    assert type(model).__name__ == model_class and model.config.problem_type == problem_type
    assert model.config._attn_implementation == "eager"
    assert any(k.startswith(("classifier.", "qa_outputs.")) for k in info["new_weights"])


# ---------------------------------------------------------------------------- GLUE TSV layouts


def _write(path, text, bom=False):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(("\ufeff" if bom else "").encode() + text.encode("utf-8"))
    return path


def test_cola_has_no_header(tmp_path):
    _write(tmp_path / "CoLA" / "dev.tsv", "gj04\t1\t\tThe cat sat.\ngj04\t0\t*\tCat the sat.\n")
    ds = load_split(get_task("cola"), "dev", DataSource(data_dir=str(tmp_path)))
    assert ds["sentence"] == ["The cat sat.", "Cat the sat."]
    assert ds["label"] == [1, 0]
    assert ds["idx"] == [0, 1]


def test_mrpc_bom_header_and_bare_quotes(tmp_path):
    text = (
        "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
        '1\t1\t2\tHe said "no.\tHe said no.\n'
        "0\t3\t4\tA cat.\tA dog.\n"
    )
    _write(tmp_path / "MRPC" / "train.tsv", text, bom=True)
    ds = load_split(get_task("mrpc"), "train", DataSource(data_dir=str(tmp_path)))
    assert ds["sentence1"] == ['He said "no.', "A cat."]  # the quote is data, not quoting
    assert ds["label"] == [1, 0]


def test_mnli_matched_mismatched_files_and_label_names(tmp_path):
    header = "index\tpromptID\tpairID\tgenre\tsentence1\tsentence2\tlabel1\tgold_label\n"
    _write(tmp_path / "MNLI" / "dev_matched.tsv", header + "0\t1\t1\tfic\tP one.\tH one.\tneutral\tcontradiction\n")
    _write(tmp_path / "MNLI" / "dev_mismatched.tsv", header + "0\t1\t1\tfic\tP two.\tH two.\tneutral\tentailment\n")
    src = DataSource(data_dir=str(tmp_path))
    m = load_split(get_task("mnli"), "dev_matched", src)
    mm = load_split(get_task("mnli"), "dev_mismatched", src)
    assert m["premise"] == ["P one."] and m["label"] == [2]  # contradiction is index 2 by name
    assert mm["hypothesis"] == ["H two."] and mm["label"] == [0]


def test_sst2_test_split_has_index_and_no_labels(tmp_path):
    _write(tmp_path / "SST-2" / "test.tsv", "index\tsentence\n0\tgood film .\n1\tbad film .\n")
    ds = load_split(get_task("sst2"), "test", DataSource(data_dir=str(tmp_path)))
    assert ds["label"] == [-1, -1]
    assert ds["sentence"] == ["good film .", "bad film ."]


def test_task_folder_itself_can_be_the_data_dir(tmp_path):
    _write(tmp_path / "dev.tsv", "sentence\tlabel\ngood .\t1\n")
    ds = load_split(get_task("sst2"), "dev", DataSource(data_dir=str(tmp_path)))
    assert ds["label"] == [1]


def test_stsb_scores_are_floats_and_range_checked(tmp_path):
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    _write(tmp_path / "STS-B" / "dev.tsv", header + "0\tg\tf\ty\t0\tn\tn\tA.\tB.\t3.800\n")
    ds = load_split(get_task("stsb"), "dev", DataSource(data_dir=str(tmp_path)))
    assert ds["label"] == [pytest.approx(3.8)]
    _write(tmp_path / "STS-B" / "train.tsv", header + "0\tg\tf\ty\t0\tn\tn\tA.\tB.\t7.5\n")
    with pytest.raises(CompressError, match=r"train.tsv:2: score 7.5 is outside STS-B's range \[0.0, 5.0\]"):
        load_split(get_task("stsb"), "train", DataSource(data_dir=str(tmp_path)))


def test_ax_crlf_and_label_names(tmp_path):
    text = (
        "Lexical Semantics\tPredicate-Argument Structure\tLogic\tKnowledge\tDomain\tPremise\tHypothesis\tLabel\r\n"
        "\t\tNegation\t\tArtificial\tThe cat sat.\tThe cat did not sit.\tcontradiction\r\n"
    )
    _write(tmp_path / "diagnostic" / "diagnostic-full.tsv", text)
    ds = load_split(get_task("ax"), "test", DataSource(data_dir=str(tmp_path)))
    assert ds["premise"] == ["The cat sat."]
    assert ds["label"] == [2]  # no stray "\r" in the label


def test_malformed_row_names_file_and_line(tmp_path):
    path = _write(tmp_path / "RTE" / "dev.tsv", "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n1\tonly two\n")
    with pytest.raises(CompressError) as err:
        load_split(get_task("rte"), "dev", DataSource(data_dir=str(tmp_path)))
    assert f"{path}:3: malformed row" in str(err.value)


def test_unknown_label_names_the_valid_ones(tmp_path):
    _write(tmp_path / "RTE" / "dev.tsv", "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tmaybe\n")
    with pytest.raises(CompressError) as err:
        load_split(get_task("rte"), "dev", DataSource(data_dir=str(tmp_path)))
    assert "dev.tsv:2: unknown label 'maybe' for RTE; valid: 0 (entailment), 1 (not_entailment)" in str(err.value)


def test_label_out_of_range(tmp_path):
    _write(tmp_path / "SST-2" / "dev.tsv", "sentence\tlabel\ngood .\t2\n")
    with pytest.raises(CompressError, match="unknown label '2' for SST-2; valid: 0 \\(negative\\), 1 \\(positive\\)"):
        load_split(get_task("sst2"), "dev", DataSource(data_dir=str(tmp_path)))


def test_non_utf8_names_line(tmp_path):
    path = tmp_path / "SST-2" / "dev.tsv"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"sentence\tlabel\ngood .\t1\ncaf\xe9 .\t0\n")
    with pytest.raises(CompressError, match=r"dev.tsv:3: not valid UTF-8"):
        load_split(get_task("sst2"), "dev", DataSource(data_dir=str(tmp_path)))


def test_missing_split_file_says_what_was_expected(tmp_path):
    (tmp_path / "SST-2").mkdir()
    with pytest.raises(CompressError, match="no SST-2 dev data .* expected dev.tsv or validation\\*.parquet"):
        load_split(get_task("sst2"), "dev", DataSource(data_dir=str(tmp_path)))


def test_missing_data_dir(tmp_path):
    with pytest.raises(CompressError, match="does not exist"):
        load_split(get_task("sst2"), "dev", DataSource(data_dir=str(tmp_path / "nope")))


def test_empty_split_is_an_error(tmp_path):
    _write(tmp_path / "SST-2" / "dev.tsv", "sentence\tlabel\n")
    with pytest.raises(CompressError, match="has no examples"):
        load_split(get_task("sst2"), "dev", DataSource(data_dir=str(tmp_path)))


def test_max_examples(tmp_path):
    _write(tmp_path / "SST-2" / "dev.tsv", "sentence\tlabel\n" + "".join(f"s{i} .\t{i % 2}\n" for i in range(10)))
    ds = load_split(get_task("sst2"), "dev", DataSource(data_dir=str(tmp_path)), max_examples=3)
    assert len(ds) == 3 and ds["idx"] == [0, 1, 2]


# ---------------------------------------------------------------------------- parquet (hub layout)


def _parquet(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


@pytest.mark.parametrize(
    "relative",
    ["rte/validation-00000-of-00001.parquet", "RTE/hf_parquet/validation.parquet", "RTE/validation_0000.parquet"],
)
def test_hub_parquet_layouts(tmp_path, relative):
    rows = [{"sentence1": "a", "sentence2": "b", "label": 1, "idx": 0}, {"sentence1": "c", "sentence2": "d", "label": 0, "idx": 1}]
    _parquet(tmp_path / relative, rows)
    ds = load_split(get_task("rte"), "dev", DataSource(data_dir=str(tmp_path)))
    assert ds["label"] == [1, 0] and ds["sentence2"] == ["b", "d"]


def test_mnli_parquet_matched_is_not_confused_with_mismatched(tmp_path):
    row = {"premise": "p", "hypothesis": "h", "label": 0, "idx": 0}
    _parquet(tmp_path / "mnli" / "validation_matched-00000-of-00001.parquet", [row])
    _parquet(tmp_path / "mnli" / "validation_mismatched-00000-of-00001.parquet", [row, row])
    src = DataSource(data_dir=str(tmp_path))
    assert len(load_split(get_task("mnli"), "dev_matched", src)) == 1
    assert len(load_split(get_task("mnli"), "dev_mismatched", src)) == 2


def test_parquet_label_out_of_range(tmp_path):
    _parquet(tmp_path / "rte" / "validation.parquet", [{"sentence1": "a", "sentence2": "b", "label": 5, "idx": 0}])
    with pytest.raises(CompressError, match="unknown label '5' for RTE"):
        load_split(get_task("rte"), "dev", DataSource(data_dir=str(tmp_path)))


# ---------------------------------------------------------------------------- plain files


def test_csv_with_column_mapping_and_label_names(tmp_path):
    path = _write(tmp_path / "reviews.csv", 'review,stars\n"great, really",positive\nawful,negative\n')
    src = DataSource(data_file=str(path), columns=(("sentence", "review"), ("label", "stars")))
    ds = load_split(get_task("sst2"), "dev", src)
    assert ds["sentence"] == ["great, really", "awful"]
    assert ds["label"] == [1, 0]


def test_jsonl_and_json_records(tmp_path):
    jsonl = _write(tmp_path / "d.jsonl", '{"sentence1": "a", "sentence2": "b", "label": "entailment"}\n\n{"sentence1": "c", "sentence2": "d", "label": 1}\n')
    ds = load_split(get_task("rte"), "dev", DataSource(data_file=str(jsonl)))
    assert ds["label"] == [0, 1]
    js = _write(tmp_path / "d.json", json.dumps([{"sentence": "x", "label": 0}]))
    assert load_split(get_task("sst2"), "dev", DataSource(data_file=str(js)))["sentence"] == ["x"]


def test_parquet_file_with_mapping(tmp_path):
    _parquet(tmp_path / "d.parquet", [{"text": "fine", "y": 1}])
    src = DataSource(data_file=str(tmp_path / "d.parquet"), columns=(("sentence", "text"), ("label", "y")))
    assert load_split(get_task("sst2"), "dev", src)["label"] == [1]


def test_plain_file_errors(tmp_path):
    path = _write(tmp_path / "d.jsonl", '{"text": "a", "label": 1}\n')
    with pytest.raises(CompressError, match=r"d.jsonl: no column 'sentence' for SST-2's sentence \(columns here: text, label\).*--columns sentence=COLUMN"):
        load_split(get_task("sst2"), "dev", DataSource(data_file=str(path)))
    broken = _write(tmp_path / "e.jsonl", '{"text": "a", "label": 1}\n{broken\n')
    with pytest.raises(CompressError, match=r"e.jsonl:2: malformed JSON line"):
        load_split(get_task("sst2"), "dev", DataSource(data_file=str(broken), columns=(("sentence", "text"),)))
    with pytest.raises(CompressError, match="unknown field"):
        load_split(get_task("sst2"), "dev", DataSource(data_file=str(path), columns=(("text", "x"),)))
    with pytest.raises(CompressError, match="unsupported extension '.xml'"):
        load_split(get_task("sst2"), "dev", DataSource(data_file=str(_write(tmp_path / "d.xml", "<a/>"))))
    with pytest.raises(CompressError, match="does not exist"):
        load_split(get_task("sst2"), "dev", DataSource(data_file=str(tmp_path / "missing.csv")))


def test_csv_row_with_wrong_field_count(tmp_path):
    path = _write(tmp_path / "d.csv", "sentence,label\ngood,1\nbad,0,extra\n")
    with pytest.raises(CompressError, match=r"d.csv:3: 3 fields where the header has 2 \(sentence, label\); quote a field that holds the separator"):
        load_split(get_task("sst2"), "dev", DataSource(data_file=str(path)))


# ---------------------------------------------------------------------------- SQuAD JSON


def squad_doc(version="1.1", no_answer=False):
    answers = [] if no_answer else [{"text": "Paris", "answer_start": 0}, {"text": "Paris", "answer_start": 0}]
    qa = {"id": "q1", "question": "What is the capital?", "answers": answers}
    if version == "v2.0":
        qa["is_impossible"] = no_answer
    return {"version": version, "data": [{"title": "France", "paragraphs": [{"context": "Paris is the capital.", "qas": [qa]}]}]}


def test_squad_json_flattens_questions(tmp_path):
    path = _write(tmp_path / "dev-v1.1.json", json.dumps(squad_doc()))
    ds = load_split(get_task("squad"), "dev", DataSource(data_dir=str(tmp_path)))
    assert ds[0]["id"] == "q1" and ds[0]["title"] == "France"
    assert ds[0]["answers"] == {"text": ["Paris", "Paris"], "answer_start": [0, 0]}
    assert len(read_squad_json(path)) == 1


def test_squad_v2_no_answer_and_subfolder(tmp_path):
    _write(tmp_path / "squad_v2" / "dev-v2.0.json", json.dumps(squad_doc("v2.0", no_answer=True)))
    ds = load_split(get_task("squad_v2"), "dev", DataSource(data_dir=str(tmp_path)))
    assert ds[0]["answers"] == {"text": [], "answer_start": []}


def test_squad_malformed(tmp_path):
    path = _write(tmp_path / "bad.json", json.dumps({"data": [{"title": "T", "paragraphs": [{"qas": []}]}]}))
    with pytest.raises(CompressError, match="article 0 \\(T\\) is malformed"):
        load_split(get_task("squad"), "dev", DataSource(data_file=str(path)))
    path = _write(tmp_path / "broken.json", '{"data": [')
    with pytest.raises(CompressError, match="broken.json:1: not valid JSON"):
        load_split(get_task("squad"), "dev", DataSource(data_file=str(path)))
    path = _write(tmp_path / "list.json", "[1, 2]")
    with pytest.raises(CompressError, match="not a SQuAD file"):
        load_split(get_task("squad"), "dev", DataSource(data_file=str(path)))


# ---------------------------------------------------------------------------- hub offline


def test_hub_offline_fails_fast_with_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.monotonic()
    with pytest.raises(CompressError) as err:
        load_split(get_task("sst2"), "dev")
    assert time.monotonic() - start < 10
    message = str(err.value)
    assert "\n" not in message
    assert "SST-2" in message and "--data-dir" in message


def test_hub_unreachable_probe_fails_fast(monkeypatch):
    from compress.core import hub

    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: nothing listens
    hub.hub_reachable.cache_clear()
    start = time.monotonic()
    try:
        with pytest.raises(CompressError, match="hub is unreachable; pass --data-dir"):
            load_split(get_task("mrpc"), "dev")
    finally:
        hub.hub_reachable.cache_clear()
    assert time.monotonic() - start < 10


def test_parse_label_auto():
    rte = get_task("rte")
    assert parse_label(rte, "not_entailment", "x") == 1
    assert parse_label(rte, 0, "x") == 0
    assert parse_label(rte, "1.0", "x") == 1
    with pytest.raises(CompressError):
        parse_label(rte, "1.5", "x")
