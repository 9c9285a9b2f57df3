"""Inputs that used to pass silently or fail wrongly: GLUE TSV quirks in --data-file / --train-file,
SQuAD answers that are not in their context, a model scored on a task of another head, --max-length 0."""

from __future__ import annotations

import json
import logging

import pytest

from compress.cli import main
from compress.core.data import synthetic
from compress.core.data.features import squad_train_features, train_features
from compress.core.data.sources import DataSource, TaskData, load_dev_splits, load_split, load_train_split
from compress.core.errors import CompressError
from compress.core.data.tasks import get_task
from compress.eval.evaluate import EvalConfig, evaluate
from tests.conftest import make_tiny_model, save_tiny


def _write(path, text, bom=False):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(("\ufeff" if bom else "") + text, encoding="utf-8")
    return path


# ---------------------------------------------------------------------------- a) one TSV reader for both paths

# MRPC as the GLUE download script wrote it: BOM on the header, and an opening quote with no
# closing one inside a field (its dev.tsv line 354), which CSV quoting runs into the next lines.
MRPC_HEADER = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
MRPC_ROWS = (
    '1\t101\t102\t"Sanitation is poor... there could be typhoid, he said.\tThe cat sat on the mat .\n'
    "0\t103\t104\tThe dog did not .\tA dog sat .\n"
    '1\t105\t106\tHe rated it "overweight" from "equal-weight" .\tIt was rated "overweight" .\n'
)


def test_glue_tsv_with_a_bare_quote_reads_the_same_through_data_file_and_data_dir(tmp_path):
    path = _write(tmp_path / "MRPC" / "dev.tsv", MRPC_HEADER + MRPC_ROWS, bom=True)
    mrpc = get_task("mrpc")
    from_dir = load_split(mrpc, "dev", DataSource(data_dir=str(tmp_path)))
    from_file = load_split(mrpc, "dev", DataSource(data_file=str(path)))
    mapped = load_split(mrpc, "dev", DataSource(data_file=str(path), columns=(
        ("sentence1", "#1 String"), ("sentence2", "#2 String"), ("label", "Quality"))))
    assert from_dir.to_dict() == from_file.to_dict() == mapped.to_dict()
    assert from_file["sentence1"][0] == '"Sanitation is poor... there could be typhoid, he said.'  # the quote is text
    assert from_file["sentence1"][2] == 'He rated it "overweight" from "equal-weight" .'
    assert from_file["label"] == [1, 0, 1] and from_file["idx"] == [0, 1, 2]


def test_tsv_named_by_the_tasks_fields_keeps_quotes_as_text(tmp_path):
    # A plain --train-file/--dev-file TSV (SST-2's own header): quotes are text there too.
    text = 'sentence\tlabel\n"good" film .\t1\n" bad film .\t0\nfine .\t1\n'
    path = _write(tmp_path / "SST-2" / "dev.tsv", text)
    sst2 = get_task("sst2")
    data = TaskData(train_file=str(path), dev_file=str(path))
    (dev,) = load_dev_splits(sst2, data).values()
    assert dev["sentence"] == ['"good" film .', '" bad film .', "fine ."]
    assert dev.to_dict() == load_split(sst2, "dev", DataSource(data_dir=str(tmp_path))).to_dict()
    assert load_train_split(sst2, data)["label"] == [1, 0, 1]


def test_headerless_and_renamed_glue_files_read_as_data_files(tmp_path):
    # CoLA has no header; STS-B names its score column "score", MNLI its texts sentence1/sentence2.
    cola = _write(tmp_path / "CoLA" / "dev.tsv", 'gj04\t1\t\tThe "cat" sat.\ngj04\t0\t*\tCat the sat.\n')
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    stsb = _write(tmp_path / "STS-B" / "dev.tsv", header + '0\tg\tf\ty\t0\tn\tn\t"A.\tB.\t3.800\n7\tg\tf\ty\t1\tn\tn\tC.\tD.\t1.0\n')
    for name, path in (("cola", cola), ("stsb", stsb)):
        task = get_task(name)
        from_dir = load_split(task, "dev", DataSource(data_dir=str(tmp_path)))
        assert load_split(task, "dev", DataSource(data_file=str(path))).to_dict() == from_dir.to_dict()
    assert load_split(get_task("stsb"), "dev", DataSource(data_file=str(stsb)))["idx"] == [0, 7]


def test_tsv_in_neither_layout_still_asks_for_columns(tmp_path):
    path = _write(tmp_path / "reviews.tsv", 'text\tstars\n"great" .\t1\n')
    with pytest.raises(CompressError, match=r"reviews.tsv: no column 'sentence' for SST-2's sentence \(columns here: text, stars\).*--columns sentence=COLUMN"):
        load_split(get_task("sst2"), "dev", DataSource(data_file=str(path)))
    src = DataSource(data_file=str(path), columns=(("sentence", "text"), ("label", "stars")))
    assert load_split(get_task("sst2"), "dev", src)["sentence"] == ['"great" .']
    bad = _write(tmp_path / "rows.tsv", "sentence\tlabel\ngood .\t1\nbad .\t0\textra\n")
    with pytest.raises(CompressError, match=r"rows.tsv:3: 3 fields where the header has 2 \(sentence, label\)"):
        load_split(get_task("sst2"), "dev", DataSource(data_file=str(bad)))


def test_real_mrpc_dev_reads_the_same_through_data_file(data_root):
    mrpc = get_task("mrpc")
    from_dir = load_split(mrpc, "dev", DataSource(data_dir=str(data_root / "glue")))
    from_file = load_split(mrpc, "dev", DataSource(data_file=str(data_root / "glue" / "MRPC" / "dev.tsv")))
    assert len(from_file) == 408 and from_file.to_dict() == from_dir.to_dict()


# ---------------------------------------------------------------------------- b) SQuAD answers not in their context


def _squad_train(tmp_path, shift: dict[int, int], n: int = 6):
    """A generated SQuAD v1.1 train file whose answer ``i`` has its answer_start moved by ``shift[i]``."""
    path = synthetic.write_squad(tmp_path / "train.json", n, seed=3)
    doc = json.loads(path.read_text())
    for i, paragraph in enumerate(doc["data"][0]["paragraphs"]):
        paragraph["qas"][0]["answers"][0]["answer_start"] += shift.get(i, 0)
    path.write_text(json.dumps(doc))
    dev = synthetic.write_squad(tmp_path / "dev.json", 2, seed=4)
    return TaskData(train_file=str(path), dev_file=str(dev), max_length=48, doc_stride=16)


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.fixture
def warnings_seen():
    handler = _Records()
    logger = logging.getLogger("compress")
    logger.addHandler(handler)
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)


def test_squad_training_refuses_data_where_no_answer_is_in_its_context(tmp_path, tokenizer):
    squad = get_task("squad")
    data = _squad_train(tmp_path, {i: 1000 for i in range(6)})  # every answer_start past its context
    with pytest.raises(CompressError, match="no SQuAD training example has its answer in its context: in all 6") as err:
        train_features(load_train_split(squad, data), squad, tokenizer, 48, doc_stride=data.doc_stride)
    assert "\n" not in str(err.value)
    data = _squad_train(tmp_path, {i: 2 for i in range(6)})  # inside the context, but not where the text is
    with pytest.raises(CompressError, match="answer text is not at answer_start"):
        train_features(load_train_split(squad, data), squad, tokenizer, 48, doc_stride=data.doc_stride)


def test_squad_training_drops_lost_answers_and_says_how_many(tmp_path, tokenizer, warnings_seen):
    squad = get_task("squad")
    data = _squad_train(tmp_path, {1: 1000, 4: 3})
    raw = load_train_split(squad, data)
    features = train_features(raw, squad, tokenizer, 48, doc_stride=data.doc_stride)
    assert len(warnings_seen) == 1 and "\n" not in warnings_seen[0]
    assert "dropped 2 of 6 SQuAD training examples" in warnings_seen[0]
    kept = squad_train_features(raw.select([0, 2, 3, 5]), tokenizer, 48, 16)
    assert features.to_dict() == kept.to_dict()


def test_valid_squad_training_data_is_unchanged_and_silent(tmp_path, tokenizer, warnings_seen):
    squad_v2 = get_task("squad_v2")
    train = synthetic.write_squad(tmp_path / "train.json", 8, seed=5, version="2.0", no_answer_fraction=0.5)
    data = TaskData(train_file=str(train), dev_file=str(train), max_length=48, doc_stride=16)
    raw = load_train_split(squad_v2, data)
    assert any(not a["text"] for a in raw["answers"])  # no-answer questions are not "lost" answers
    features = train_features(raw, squad_v2, tokenizer, 48, doc_stride=data.doc_stride)
    assert warnings_seen == []
    assert sorted(set(features["start_positions"])) != [0]  # answers were located
    assert len(features) >= len(raw)


# ---------------------------------------------------------------------------- c) the model's head and the task's


def test_eval_refuses_a_model_of_another_head(tmp_path, tokenizer):
    qa = save_tiny(make_tiny_model(head="question-answering"), tokenizer, tmp_path / "qa")
    classifier = save_tiny(make_tiny_model(), tokenizer, tmp_path / "cls")
    encoder = save_tiny(make_tiny_model(head="base"), tokenizer, tmp_path / "base")
    nowhere = str(tmp_path / "no-data")  # refused before any data is looked for
    with pytest.raises(CompressError, match="has a question-answering head but SST-2 is scored with a sequence-classification head"):
        evaluate(qa, EvalConfig(task="sst2", data_dir=nowhere))
    with pytest.raises(CompressError, match="has a sequence-classification head but SQuAD v1.1 is scored with a question-answering head"):
        evaluate(classifier, EvalConfig(task="squad", data_dir=nowhere))
    with pytest.raises(CompressError, match="has no task head .* but STS-B is scored with a sequence-classification head"):
        evaluate(encoder, EvalConfig(task="stsb", data_dir=nowhere))


def test_eval_cli_names_both_heads_in_one_line(tmp_path, tokenizer, capsys):
    qa = save_tiny(make_tiny_model(head="question-answering"), tokenizer, tmp_path / "qa")
    glue = synthetic.write_sst2_layout(tmp_path / "glue", n_train=4, n_dev=4, n_test=2)
    capsys.readouterr()
    assert main(["eval", "--model", str(qa), "--task", "sst2", "--data-dir", str(glue)]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and "question-answering head" in lines[0] and "sequence-classification head" in lines[0]


# ---------------------------------------------------------------------------- d) --max-length 0


def test_eval_max_length_zero_is_refused_not_defaulted(tiny_model_dir, tmp_path, capsys):
    glue = synthetic.write_sst2_layout(tmp_path / "glue", n_train=4, n_dev=4, n_test=2)
    for length in (0, -3):
        with pytest.raises(CompressError, match=f"--max-length {length} is too short; use at least 8 tokens"):
            evaluate(tiny_model_dir, EvalConfig(task="sst2", data_dir=str(glue), record=False, max_length=length))
        with pytest.raises(CompressError, match=f"--max-length {length} is too short"):
            EvalConfig(task="sst2", max_length=length).validate()
    capsys.readouterr()
    assert main(["eval", "--model", str(tiny_model_dir), "--task", "sst2", "--data-dir", str(glue), "--max-length", "0"]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and "--max-length 0 is too short" in lines[0]
    # None still means the task's default; a valid length is used as given
    (record,) = evaluate(tiny_model_dir, EvalConfig(task="sst2", data_dir=str(glue), record=False))
    assert record["max_length"] == 64  # 128 capped at the tiny model's 64 positions
    (record,) = evaluate(tiny_model_dir, EvalConfig(task="sst2", data_dir=str(glue), record=False, max_length=16))
    assert record["max_length"] == 16


@pytest.mark.parametrize("length", [0, -1, -128])
def test_task_data_refuses_a_max_length_of_zero_or_less(length):
    sst2 = get_task("sst2")
    with pytest.raises(CompressError, match=f"--max-length {length} is too short; use at least 8 tokens"):
        TaskData(max_length=length).validate()
    with pytest.raises(CompressError, match=f"--max-length {length} is too short"):
        TaskData(max_length=length).resolved_max_length(sst2, 512)  # never silently 128


def test_task_data_max_length_default_and_valid_values():
    TaskData().validate()
    TaskData(max_length=64).validate()
    assert TaskData().resolved_max_length(get_task("sst2"), 512) == 128
    assert TaskData().resolved_max_length(get_task("squad"), 512) == 384
    assert TaskData(max_length=32).resolved_max_length(get_task("sst2"), 512) == 32
