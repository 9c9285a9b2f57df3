"""Data files that lie: each refused in one line that names the place and says what to do, or read as what it means.

A non-finite score, a header naming a column twice, a control character in a label, a list in a
task of one label per row (and JSON lists under --label-sep), IOB1 tags in a CoNLL file, a table
split at another separator than its suffix says, a UTF-16 file. Messages are written out in full;
the labels a file is read to are written out by hand.
"""

from __future__ import annotations

import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from compress.cli import main
from compress.core.data.labels import bio_tags
from compress.core.data.resolve import resolve_task
from compress.core.data.sources import DataSource, TaskOptions, load_split
from compress.core.data.tasks import CLASSIFICATION, MULTI_LABEL, REGRESSION, TOKEN
from compress.core.errors import CompressError
from tests.conftest import make_tiny_model, make_tokenizer, save_tiny


def _write(path, content):
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def _read(kind, path, split="train", **options):
    """The task ``path`` makes as a training file of ``kind``, and its ``split`` read from it."""
    task = resolve_task(kind, TaskOptions(**options), train_file=path)
    return task, load_split(task, split, DataSource(data_file=str(path)))


def _refused(kind, path, **options) -> str:
    with pytest.raises(CompressError) as err:
        _read(kind, path, **options)
    return str(err.value)


def _parquet(path, columns: list, names: list[str]):
    pq.write_table(pa.table(columns, names=names), path)
    return path


# ---------------------------------------------------------------------------- a score that is not a number


def test_a_score_that_is_not_finite_is_refused_naming_file_row_and_column(tmp_path):
    rows = "text,score\nthe dog,1.5\nthe cat,{}\n"
    for bad in ("inf", "-inf", "Infinity", "nan", "1e999"):
        path = _write(tmp_path / "scores.csv", rows.format(bad))
        assert _refused(REGRESSION, path, label_column="score") == (
            f"{path}:3: the score {bad!r} in column 'score' is not a finite number; a regression target is a real "
            "number: fix or remove the row")
    # JSON's own Infinity literal and a parquet float: the value as read
    path = _write(tmp_path / "scores.jsonl", '{"text": "a", "label": 2}\n{"text": "b", "label": -Infinity}\n')
    assert _refused(REGRESSION, path) == (f"{path}:2: the score -inf in column 'label' is not a finite number; a "
                                          "regression target is a real number: fix or remove the row")
    path = _parquet(tmp_path / "scores.parquet", [["a", "b"], [0.5, float("inf")]], ["text", "label"])
    assert _refused(REGRESSION, path) == (f"{path} row 1: the score inf in column 'label' is not a finite number; a "
                                          "regression target is a real number: fix or remove the row")
    # finite in Python, but inf as the float32 a target is stored in
    path = _write(tmp_path / "large.csv", "text,score\na,1\nb,-1e39\n")
    assert _refused(REGRESSION, path, label_column="score") == (
        f"{path}:3: the score '-1e39' in column 'score' is beyond a 32-bit float (about 3.4e38), the type regression "
        "targets are stored in: fix or remove the row")
    # NaN in a JSON or parquet column is a missing value (as pandas writes one): no label, in any kind
    path = _write(tmp_path / "missing.jsonl", '{"text": "a", "label": 2}\n{"text": "b", "label": NaN}\n')
    assert _refused(REGRESSION, path) == f"{path}:2: no label (column 'label'); fill it in or remove the row"
    path = _parquet(tmp_path / "missing.parquet", [["a", "b", "c"], [1.0, float("nan"), 2.0]], ["text", "label"])
    assert _refused(CLASSIFICATION, path) == f"{path} row 1: no label (column 'label'); fill it in or remove the row"
    # finite scores, however written, still read
    path = _write(tmp_path / "good.csv", "text,score\na,1.5\nb,-2\nc,1e3\n")
    assert _read(REGRESSION, path, label_column="score")[1]["label"] == [1.5, -2.0, 1000.0]


# ---------------------------------------------------------------------------- a column named twice


def test_a_header_naming_a_column_twice_is_refused_naming_it_and_its_positions(tmp_path):
    path = _write(tmp_path / "twice.csv", "\ntext,label,text\nthe dog,pets,the cat\n")
    assert _refused(CLASSIFICATION, path) == (
        f"{path}:2: the header names a column more than once: 'text' (columns 1 and 3); rows are read by column name, "
        "so rename or remove the extra column")
    path = _write(tmp_path / "twice.tsv", "label\ttext\tlabel\tid\tlabel\ttext\na\tb\tc\t1\td\te\n")
    assert _refused(CLASSIFICATION, path) == (
        f"{path}:1: the header names a column more than once: 'label' (columns 1, 3 and 5); 'text' (columns 2 and 6); "
        "rows are read by column name, so rename or remove the extra column")
    path = _parquet(tmp_path / "twice.parquet", [["a"], ["x"], ["b"]], ["text", "label", "text"])
    assert _refused(CLASSIFICATION, path) == (
        f"{path}: the table names a column more than once: 'text' (columns 1 and 3); rows are read by column name, so "
        "rename or remove the extra column")
    path = _write(tmp_path / "twice.jsonl", '{"text": "a", "label": "x"}\n{"text": "b", "label": "x", "label": "y"}\n')
    assert _refused(CLASSIFICATION, path) == (
        f"{path}:2: a JSON object names a key more than once: 'label' (keys 2 and 3); each key is a column, so rename "
        "or remove the extra one")
    # Blank names are no name: a spreadsheet's export that ends its rows with empty columns still reads.
    path = _write(tmp_path / "trailing.csv", "text,label,,\nthe dog,pets,,\na film,films,,\n")
    assert _read(CLASSIFICATION, path)[1]["label"] == [1, 0]  # films, pets


# ---------------------------------------------------------------------------- control characters in labels


def test_a_control_character_in_a_label_is_refused_shown_escaped(tmp_path):
    path = _write(tmp_path / "nul.csv", 'text,label\nthe dog,pets\nthe cat,"pets\x00"\n')
    assert _refused(CLASSIFICATION, path) == (
        f"{path}:3: the label 'pets\\x00' holds a control character (U+0000); a label is plain text: remove the "
        "character (it would make a class of its own)")
    # in a dev file, against a task whose labels are clean: the control character is what is named
    train = _write(tmp_path / "train.csv", "text,label\nthe dog,pets\na film,films\n")
    task = resolve_task(CLASSIFICATION, TaskOptions(), train_file=train)
    dev = _write(tmp_path / "dev.csv", "text,label\nthe dog,pets\na film,fi\x1blms\n")
    with pytest.raises(CompressError) as err:
        load_split(task, "dev", DataSource(data_file=str(dev)))
    assert str(err.value) == (f"{dev}:3: the label 'fi\\x1blms' holds a control character (U+001B); a label is plain "
                              "text: remove the character (it would make a class of its own)")
    path = _write(tmp_path / "multi.jsonl", '{"text": "a", "label": ["x", "y\\u0085z"]}\n')
    assert _refused(MULTI_LABEL, path) == (
        f"{path}:1: the label 'y\\x85z' holds a control character (U+0085); a label is plain text: remove the "
        "character (it would make a class of its own)")
    path = _write(tmp_path / "tags.conll", "the\tO\ndog\tB-animal\x7f\n")
    assert _refused(TOKEN, path) == (f"{path}:2: the tag 'B-animal\\x7f' holds a control character (U+007F); a tag is "
                                     "plain text: remove the character (it would make a class of its own)")


# ---------------------------------------------------------------------------- lists as labels


def test_json_list_labels_are_read_as_lists_under_label_sep_and_refused_where_a_row_has_one_label(tmp_path):
    path = _write(tmp_path / "multi.csv", 'text,label\nthe dog,"[""animal"", ""place""]"\nparis,place;feeling\nok,\n')
    task, ds = _read(MULTI_LABEL, path, label_sep=";")
    assert task.label_names == ("animal", "feeling", "place")
    assert ds["label"] == [[1.0, 0.0, 1.0], [0.0, 1.0, 1.0], [0.0, 0.0, 0.0]]
    # text-classification: a list is several labels, refused rather than made one class named after the list
    assert _refused(CLASSIFICATION, path) == (
        f"{path}:2: the label '[\"animal\", \"place\"]' is a list, but a text-classification task takes one label per "
        "row; for several labels per row use --task multi-label, each row's labels a JSON list ([\"a\", \"b\"]) or "
        "names split at --label-sep")
    path = _write(tmp_path / "lists.jsonl", '{"text": "a", "label": "x"}\n{"text": "b", "label": ["x", "y"]}\n')
    assert _refused(CLASSIFICATION, path) == (
        f"{path}:2: the label \"['x', 'y']\" is a list, but a text-classification task takes one label per row; for "
        "several labels per row use --task multi-label, each row's labels a JSON list ([\"a\", \"b\"]) or names split "
        "at --label-sep")
    # a list holding something other than names
    path = _write(tmp_path / "nested.jsonl", '{"text": "a", "label": ["x", null]}\n')
    assert _refused(MULTI_LABEL, path) == (f"{path}:1: the label list holds None, not a label name; write each row's "
                                           "labels as a list of names ([\"a\", \"b\"])")


# ---------------------------------------------------------------------------- IOB1


IOB1 = ("-DOCSTART-\tO\n\n"
        "John\tI-PER\nSmith\tI-PER\nmet\tO\nAnna\tB-PER\nin\tO\nBerlin\tI-LOC\n\n"  # B- only between two PER entities
        "Anna\tI-PER\nBob\tB-PER\nand\tO\nParis\tI-LOC\nBerlin\tI-PER\n")  # I- after another type starts an entity


def test_iob1_tags_in_conll_are_converted_to_bio_in_one_log_line(tmp_path, caplog):
    path = _write(tmp_path / "iob1.conll", IOB1)
    with caplog.at_level(logging.WARNING, logger="compress.core.data"):
        task, ds = _read(TOKEN, path)
    assert [r.getMessage() for r in caplog.records] == [
        f"{path}: 2 sentence(s) start an entity with I- (first at {path}:3), as IOB1 tags do: read as IOB1 and "
        "converted to BIO, where every entity starts with B-"]
    assert task.label_names == ("O", "B-LOC", "B-PER", "I-PER")
    names = [[task.label_names[i] for i in tags] for tags in ds["label"]]
    # Written by hand from the IOB1 rules: the same entities, each starting with B-.
    assert names == [["B-PER", "I-PER", "O", "B-PER", "O", "B-LOC"], ["B-PER", "B-PER", "O", "B-LOC", "B-PER"]]
    # BIO tags come back unchanged, and nothing is logged
    bio = _write(tmp_path / "bio.conll", "John\tB-PER\nSmith\tI-PER\n\nParis\tB-LOC\nBerlin\tB-LOC\n")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="compress.core.data"):
        task, ds = _read(TOKEN, bio)
    assert caplog.records == []
    assert [[task.label_names[i] for i in tags] for tags in ds["label"]] == [["B-PER", "I-PER"], ["B-LOC", "B-LOC"]]
    assert bio_tags(["I-PER", "B-PER", "I-PER", "I-LOC", "O", "I-LOC"]) == (
        ["B-PER", "B-PER", "I-PER", "B-LOC", "O", "B-LOC"], 0)
    assert bio_tags(["O", "B-PER", "I-PER"]) == (["O", "B-PER", "I-PER"], None)


def test_an_iob1_dev_tag_of_a_type_training_never_had_is_named_as_the_file_has_it(tmp_path):
    train = _write(tmp_path / "train.conll", "John\tB-PER\nSmith\tI-PER\nsaid\tO\n")
    task = resolve_task(TOKEN, TaskOptions(task_name="ner"), train_file=train)
    dev = _write(tmp_path / "dev.conll", "John\tI-PER\n\nParis\tI-LOC\n")
    with pytest.raises(CompressError) as err:
        load_split(task, "dev", DataSource(data_file=str(dev)))
    assert str(err.value) == (f"{dev}:3: label 'I-LOC' is not one of ner's labels (O, B-PER, I-PER); the labels come "
                              "from the training data, so a dev or test label must occur there (or fix the label)")


# ---------------------------------------------------------------------------- another separator


def test_a_table_split_at_another_separator_is_refused_naming_the_one_it_looks_to_use(tmp_path):
    path = _write(tmp_path / "tabs.csv", "text\tlabel\nthe dog, the cat\tpets\na film\tfilms\n")
    assert _refused(CLASSIFICATION, path) == (f"{path}:1: the header 'text\\tlabel' is one column split at commas, but "
                                              "the file looks tab-separated: name it .tsv")
    path = _write(tmp_path / "semicolons.csv", "text;label\nthe dog, the cat;pets\n\"a; film\";films\n")
    assert _refused(CLASSIFICATION, path) == (
        f"{path}:1: the header 'text;label' is one column split at commas, but the file looks semicolon-separated: "
        "save it with commas (a .csv) or tabs (a .tsv), the separators the toolkit reads")
    path = _write(tmp_path / "commas.tsv", "text,label\nthe dog,pets\n")
    assert _refused(CLASSIFICATION, path) == (f"{path}:1: the header 'text,label' is one column split at tabs, but the "
                                              "file looks comma-separated: name it .csv")
    # One column whose texts hold a separator is one column: a test file of texts alone reads.
    train = _write(tmp_path / "train.csv", "text,label\nthe dog,pets\na film,films\n")
    task = resolve_task(CLASSIFICATION, TaskOptions(), train_file=train)
    texts = _write(tmp_path / "texts.csv", "text\nthe dog; the cat\nhello\tworld\n")
    assert load_split(task, "test", DataSource(data_file=str(texts)))["text"] == ["the dog; the cat", "hello\tworld"]


def test_a_utf16_file_is_refused_saying_so(tmp_path):
    for encoding in ("utf-16", "utf-16-le"):  # with a byte-order mark and without
        path = _write(tmp_path / "wide.csv", "text,label\nthe dog,pets\n".encode(encoding))
        assert _refused(CLASSIFICATION, path) == (f"{path}: looks UTF-16-encoded (NUL bytes between the characters); "
                                                  "re-encode the file as UTF-8 (e.g. iconv -f utf-16 -t utf-8)")


def test_values_json_reads_but_a_dataset_cannot_hold_are_refused_at_their_line(tmp_path):
    # Half a surrogate pair, an integer past Python's digit limit, an index past int64: each would otherwise escape as
    # pyarrow's or Python's own exception while the split is built.
    path = _write(tmp_path / "surrogate.jsonl", '{"text": "a", "label": "x"}\n{"text": "b\\udc00", "label": "y"}\n')
    assert _refused(CLASSIFICATION, path) == (
        f"{path}:2: the JSON string 'b\\udc00' holds half a surrogate pair (a \\uD800-\\uDFFF escape without its "
        "other half), which is no character; fix or remove the escape")
    path = _write(tmp_path / "digits.jsonl", '{"text": "a", "label": ' + "9" * 5000 + "}\n")
    assert _refused(CLASSIFICATION, path) == (f"{path}:1: malformed JSON line (a number with more digits than Python "
                                              "reads)")
    path = _write(tmp_path / "index.csv", "text,label,idx\na,x,0\nb,y,1e30\n")
    assert _refused(CLASSIFICATION, path) == (f"{path}:3: index '1e30' is too large; the index column numbers the "
                                              "examples")
    # a surrogate pair that makes one character reads
    path = _write(tmp_path / "pair.jsonl", '{"text": "\\ud83d\\ude00", "label": "x"}\n{"text": "b", "label": "y"}\n')
    assert _read(CLASSIFICATION, path)[1]["text"] == ["\U0001f600", "b"]


# ---------------------------------------------------------------------------- through the command line


def test_the_command_line_says_it_in_one_line_and_writes_nothing(tmp_path, capsys):
    base = save_tiny(make_tiny_model(head="base"), make_tokenizer(tmp_path / "tok"), tmp_path / "base")
    dev = _write(tmp_path / "dev.csv", "text,label\nthe dog,1\n")
    train = _write(tmp_path / "train.csv", "text,label\nthe dog,1\nthe cat,inf\n")
    capsys.readouterr()
    assert main(["teacher", "finetune", "--model", str(base), "--task", REGRESSION, "--train-file", str(train),
                 "--dev-file", str(dev), "--epochs", "1", "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"compress teacher finetune: error: {train}:3: the score 'inf' in column 'label' is not a finite number; a "
        "regression target is a real number: fix or remove the row"]
    assert not (tmp_path / "out").exists()
