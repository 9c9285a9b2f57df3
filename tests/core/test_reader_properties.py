"""Any bytes given as a data file give a result or the toolkit's one-line error, never another exception.

One property per reader (csv, tsv, json, jsonl, CoNLL, parquet), checked with Hypothesis on
arbitrary bytes and on near-valid files built from the pieces that have broken readers before
(quotes, separators, NUL and other control characters, BOMs, CR, brackets, non-finite numbers,
repeated column names, IOB1 tags). Each file is read as the toolkit reads a user's training file:
the task of each kind it would make (its labels), then the split itself; a result must hold
what that kind promises (labels in range, finite scores, BIO tags).

Bounded for CI: ``MAX_EXAMPLES`` per reader, derandomized (the same examples on every run, so a
failure is reproducible and never intermittent), no example database on disk. To search further,
``COMPRESS_PROPERTY_EXAMPLES=1000`` draws that many new random examples per reader.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compress.core.data.files import read_conll, read_table
from compress.core.data.resolve import resolve_task
from compress.core.data.sources import DataSource, TaskOptions, load_split
from compress.core.data.tasks import CLASSIFICATION, MULTI_LABEL, REGRESSION, TOKEN, USER_KINDS
from compress.core.errors import CompressError

SEARCH = os.environ.get("COMPRESS_PROPERTY_EXAMPLES")  # a deeper random search, by hand
MAX_EXAMPLES = int(SEARCH or 60)
BOUNDED = settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=not SEARCH, database=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# Hostile pieces: what has broken readers before, and any short text.
PIECES = st.one_of(
    st.sampled_from(["I-x", "B-y", "I-", "PER", "1e999", "inf", "nan", "Infinity", '["a", "b"]', "[]", "[", "{}", '"',
                     ",", ";", "\t", "|", " ", "\n", "\r\n", "\r", "\x00", "\x1b", "\x85", "\ufeff", "é", "\u2028",
                     "-DOCSTART-", "text", "label", "9" * 30]),
    st.text(max_size=4),
)
WORDS = st.lists(st.sampled_from(["the", "dog", "paris", "film", "x"]), min_size=1, max_size=4)
LABELS = st.sampled_from(["a", "b", "c"])
# One tag per word, IOB1 and BIO alike (an I- may start an entity); the edits below put in tags of neither.
TAGS = st.sampled_from(["O", "O", "B-x", "I-x", "B-y", "I-y"])


@st.composite
def rows(draw) -> list[dict]:
    """1 to 6 rows of one kind as a user writes them ({column: value}): a text and a label, a list of labels or a
    score; or words and their tags."""
    layout = draw(st.sampled_from(["class", "multi", "score", "tags"]))
    out = []
    for _ in range(draw(st.integers(1, 6))):
        words = draw(WORDS)
        if layout == "tags":
            out.append({"tokens": words, "tags": [draw(TAGS) for _ in words]})
        else:
            label = {"class": LABELS, "multi": st.lists(LABELS, max_size=3, unique=True),
                     "score": st.floats(-5, 5, allow_nan=False).map(lambda x: round(x, 2))}[layout]
            out.append({"text": " ".join(words), "label": draw(label)})
    if draw(st.integers(0, 3)) == 0:  # the file's own index column, which numbers the examples
        for i, row in enumerate(out):
            row["idx"] = draw(st.sampled_from([i, i, -i, 2**70]))
    return out


def _cells(record: dict) -> list[str]:
    """A row's values as csv/tsv cells: words and tags joined by spaces, a list of labels as JSON."""
    return [" ".join(v) if k in ("tokens", "tags") else json.dumps(v) if isinstance(v, list) else str(v)
            for k, v in record.items()]


@st.composite
def mutated(draw, text: str) -> bytes:
    """``text`` with 0 to 3 edits at random places (a hostile piece put in, a span cut out), as UTF-8."""
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(text)))
        if draw(st.booleans()):
            text = text[:at] + draw(PIECES) + text[at:]
        else:
            text = text[:at] + text[at + draw(st.integers(1, 8)):]
    return text.encode("utf-8", "surrogatepass")  # a lone surrogate makes invalid UTF-8: the decoder's case


@st.composite
def tables(draw, separator: str) -> bytes:
    """A csv (quoted by the csv module) or tsv (GLUE's way: no quoting) file of a kind's rows, then edited."""
    records = draw(rows())
    buffer = io.StringIO()
    if separator == ",":
        writer = csv.writer(buffer, lineterminator=draw(st.sampled_from(["\n", "\r\n"])))
        writer.writerow(list(records[0]))
        writer.writerows(_cells(r) for r in records)
    else:
        buffer.write("".join("\t".join(row) + "\n" for row in [list(records[0]), *map(_cells, records)]))
    return draw(mutated(buffer.getvalue()))


@st.composite
def json_documents(draw, lines: bool) -> bytes:
    """JSON lines, or a JSON list of objects, of a kind's rows (now and then a value made hostile), then edited."""
    records = draw(rows())
    for record in records:
        if draw(st.integers(0, 3)) == 0:  # JSON's own hostile values: non-finite floats, null, nesting, any text
            key = draw(st.sampled_from(list(record)))
            record[key] = draw(st.one_of(st.floats(), st.none(), st.lists(st.none() | PIECES, max_size=2), PIECES))
    indent = draw(st.sampled_from([None, 1]))
    text = "\n".join(map(json.dumps, records)) if lines else json.dumps(records, indent=indent)
    return draw(mutated(text))


@st.composite
def conll_files(draw) -> bytes:
    """A CoNLL file of tagged sentences (tabs or spaces, empty or whitespace lines between, a -DOCSTART-), edited."""
    sep = draw(st.sampled_from(["\t", " "]))
    lines = ["-DOCSTART- -X- O", ""] if draw(st.booleans()) else []
    for _ in range(draw(st.integers(1, 4))):
        words = draw(WORDS)
        lines += [f"{w}{sep}{draw(TAGS)}" for w in words] + [draw(st.sampled_from(["", " ", "\t"]))]
    return draw(mutated("\n".join(lines)))


@st.composite
def parquet_files(draw) -> bytes:
    """A parquet table of a kind's rows (a value made hostile now and then), perhaps with its bytes cut or changed."""
    records = draw(rows())
    columns = {key: [r[key] for r in records] for key in records[0]}
    for key, values in columns.items():
        if draw(st.integers(0, 3)) == 0:
            at = draw(st.integers(0, len(values) - 1))
            hostile = st.floats() if isinstance(values[0], float) else st.none() | PIECES
            values[at] = draw(st.lists(hostile, max_size=2)) if isinstance(values[0], list) else draw(hostile)
    names = list(columns)
    if draw(st.integers(0, 4)) == 0:
        names[-1] = names[0]  # a column name given twice
    try:
        table = pa.table(list(columns.values()), names=names)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):  # a value parquet cannot hold in its column: as text
        table = pa.table([[str(v) for v in values] for values in columns.values()], names=names)
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    data = bytearray(buffer.getvalue())
    damage = draw(st.sampled_from(["none", "none", "none", "cut", "byte"]))
    if damage == "cut":
        data = data[: draw(st.integers(0, len(data)))]
    elif damage == "byte":
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data)


def _holds(kind: str, task, ds) -> None:
    """What a split read for a task of ``kind`` promises, whatever its file held."""
    labels = ds["label"]
    if kind == REGRESSION:
        assert all(math.isfinite(v) for v in labels)
    elif kind == CLASSIFICATION:
        assert all(0 <= v < task.num_labels for v in labels)
    elif kind == MULTI_LABEL:
        assert all(len(row) == task.num_labels and set(row) <= {0.0, 1.0} for row in labels)
    else:
        for words, tags in zip(ds["tokens"], labels):
            assert len(words) == len(tags) and all(0 <= t < len(task.label_names) for t in tags)
            names = [task.label_names[t] for t in tags]
            # BIO: an I- tag continues an entity of its own type (never the first tag, never after O)
            assert all(i > 0 and names[i - 1] != "O" and names[i - 1][2:] == tag[2:]
                       for i, tag in enumerate(names) if tag.startswith("I-"))


def _read_every_way(path: Path) -> None:
    """Read ``path`` with its reader, then as the training file of each kind that reads its format (labels, then the
    split); only CompressError may stop either."""
    conll = path.suffix == ".conll"
    _either(lambda: read_conll(path) if conll else read_table(path))
    for kind in (TOKEN,) if conll else USER_KINDS:
        def whole(kind=kind):
            task = resolve_task(kind, TaskOptions(), train_file=path)
            _holds(kind, task, load_split(task, "train", DataSource(data_file=str(path))))
        _either(whole)


def _either(read) -> None:
    try:
        read()
    except CompressError as err:
        message = str(err)
        assert message and "\n" not in message and "\r" not in message  # the one line the CLI prints


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("reader-properties")


def _check(folder: Path, suffix: str, data: bytes) -> None:
    path = folder / f"data{suffix}"
    path.write_bytes(data)
    _read_every_way(path)


@BOUNDED
@given(data=st.one_of(st.binary(max_size=200), tables(",")))
def test_any_csv_file_reads_or_says_why(folder, data):
    _check(folder, ".csv", data)


@BOUNDED
@given(data=st.one_of(st.binary(max_size=200), tables("\t")))
def test_any_tsv_file_reads_or_says_why(folder, data):
    _check(folder, ".tsv", data)


@BOUNDED
@given(data=st.one_of(st.binary(max_size=200), json_documents(lines=False)))
def test_any_json_file_reads_or_says_why(folder, data):
    _check(folder, ".json", data)


@BOUNDED
@given(data=st.one_of(st.binary(max_size=200), json_documents(lines=True)))
def test_any_jsonl_file_reads_or_says_why(folder, data):
    _check(folder, ".jsonl", data)


@BOUNDED
@given(data=st.one_of(st.binary(max_size=200), conll_files()))
def test_any_conll_file_reads_or_says_why(folder, data):
    _check(folder, ".conll", data)


@BOUNDED
@given(data=st.one_of(st.binary(max_size=200), parquet_files()))
def test_any_parquet_file_reads_or_says_why(folder, data):
    _check(folder, ".parquet", data)
