"""Reading a user's data files into located records: every record knows its ``file:line``.

Formats: csv (quoted fields, CRLF or LF), tsv (GLUE's convention: tabs, no quoting),
json (a list of objects), jsonl, parquet, a ``datasets`` ``save_to_disk`` folder, and
CoNLL (``token<TAB>tag`` or space-separated, the tag in the last column; a sentence ends at
an empty or whitespace-only line; ``-DOCSTART-`` lines are skipped). Blank lines are
ordinary; a row that a line break cut short, a line without its tag and a field too long
for the csv module's default limit are not silently misread: the first two are refused
naming the line, the last is read whole. A column name given twice (a header's, a parquet
table's, a JSON object's key) is refused rather than one of the two read, and a header that
is one column at the suffix's separator but splits evenly at another says which separator
the file looks to use.

Nothing here knows a task: :mod:`compress.core.data.data_files` maps the records' columns onto the
task's fields, and :mod:`compress.core.data.labels` parses their labels.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from compress.core.errors import CompressError, reason
from compress.core.paths import check_input_file

# A text field of any length is read (a 40,000-word sentence is truncated later, with a count).
csv.field_size_limit(min(sys.maxsize, 2**31 - 1))

TABLE_SUFFIXES = {".csv": "csv", ".tsv": "tsv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}
CONLL_SUFFIXES = (".conll", ".conllu", ".bio", ".iob", ".iob2", ".txt")
DOCSTART = "-DOCSTART-"


@dataclass(frozen=True)
class Record:
    """One row of a file: where it is (``file:line``, or ``file row N`` for binary formats) and its values."""

    where: str
    values: dict[str, Any]
    token_lines: tuple[int, ...] = ()  # a CoNLL sentence: each token's own line, so a bad tag names the line it is on

    def token_where(self, i: int) -> str:
        """Where token ``i`` of the record is: its own ``file:line`` in a CoNLL file, else the record's place."""
        if i < len(self.token_lines):
            # A CoNLL record's ``where`` is ``file:first line``: the file part is everything before the last colon.
            return f"{self.where.rsplit(':', 1)[0]}:{self.token_lines[i]}"
        return self.where


def looks_utf16(raw: bytes) -> bool:
    """Whether ``raw`` looks UTF-16: a UTF-16 byte-order mark, or NUL as every other byte of its start (ASCII in UTF-16,
    which is valid UTF-8 full of NULs)."""
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        return True
    head = raw[:200]
    return len(head) >= 4 and any(all(b == 0 for b in head[i::2]) for i in (0, 1))


def read_text_file(path: Path) -> str:
    """Read UTF-8 text (a BOM is dropped); bad bytes name the file and line, a UTF-16 file says so."""
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise CompressError(f"cannot read {path}: {err.strerror or err}") from None
    if looks_utf16(raw):
        raise CompressError(f"{path}: looks UTF-16-encoded (NUL bytes between the characters); re-encode the file as "
                            "UTF-8 (e.g. iconv -f utf-16 -t utf-8)")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise CompressError(
            f"{path}:{line}: not valid UTF-8 (byte 0x{raw[err.start]:02x}); "
            "re-encode the file as UTF-8 (e.g. iconv -f cp1252 -t utf-8)"
        ) from None


def read_tsv_rows(path: Path) -> list[list[str]]:
    """The rows of a tab-separated file, read by GLUE's convention: the one TSV reader.

    Fields are split at tabs with no quoting: a quote character is text (MRPC and SST-2
    have bare quotes inside fields, which CSV quoting would run across lines); line
    endings may be CRLF (AX); a BOM is dropped. Row ``i`` is line ``i + 1`` (an empty line is ``[]``).
    """
    lines = read_text_file(path).split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    reader = csv.reader((ln.rstrip("\r") for ln in lines), delimiter="\t", quoting=csv.QUOTE_NONE)
    try:
        return list(reader)
    except csv.Error as err:  # a stray carriage return inside a line
        raise CompressError(f"{path}:{reader.line_num}: malformed line ({err}); fix or remove the line") from None


SAVED_DATASET = "a folder datasets' save_to_disk wrote"  # what a data folder must be, as messages say it


def is_saved_dataset(path: Path) -> bool:
    """Whether ``path`` is a folder ``datasets``' ``save_to_disk`` wrote (a Dataset or a DatasetDict)."""
    return path.is_dir() and any((path / name).is_file() for name in ("dataset_info.json", "state.json", "dataset_dict.json"))


def read_table(path: Path, split: str = "train") -> list[Record]:
    """The records of one csv/tsv/json/jsonl/parquet file or ``save_to_disk`` folder (``split`` picks from a DatasetDict)."""
    if is_saved_dataset(path):
        return read_saved_dataset(path, split)
    check_input_file(path, "data file", folder=SAVED_DATASET)  # a FIFO, a device, an empty file: said as such
    fmt = TABLE_SUFFIXES.get(path.suffix.lower())
    if fmt is None:
        raise CompressError(
            f"data file {path}: unsupported extension {path.suffix!r}; use one of {', '.join(TABLE_SUFFIXES)} "
            "or a datasets save_to_disk folder"
        )
    if fmt == "parquet":
        return read_parquet(path)
    if fmt == "json":
        return read_json_records(path)
    if fmt == "tsv":
        return table_records([(n + 1, row) for n, row in enumerate(read_tsv_rows(path))], path, "\t")
    return table_records(csv_rows(path), path, ",")


def csv_rows(path: Path) -> list[tuple[int, list[str]]]:
    """(first line, fields) of every row of a csv file; a quoted field may span lines, CRLF ends are plain ends."""
    reader = csv.reader(io.StringIO(read_text_file(path), newline=""), delimiter=",")
    rows, line = [], 1
    try:
        for row in reader:
            rows.append((line, row))
            line = reader.line_num + 1  # the next row starts after the lines this one spanned
    except csv.Error as err:
        raise CompressError(f"{path}:{line}: malformed csv ({err}); fix or remove the line") from None
    return rows


def _blank(row: list[str]) -> bool:
    return all(not field.strip() for field in row)


# The separators a table may use, by name; what a file of one suffix that holds another should do.
SEPARATORS = {",": "comma", "\t": "tab", ";": "semicolon", "|": "pipe"}
SEPARATOR_ADVICE = {
    "\t": "name it .tsv",
    ",": "name it .csv",
    ";": "save it with commas (a .csv) or tabs (a .tsv), the separators the toolkit reads",
    "|": "save it with commas (a .csv) or tabs (a .tsv), the separators the toolkit reads",
}
SNIFF_LINES = 20  # the first non-blank lines a separator must split evenly


def sniff_separator(text: str, used: str) -> str | None:
    """The separator other than ``used`` that ``text``'s first lines agree on, else None.

    A separator is taken when the first non-blank line splits at it into at least two non-blank
    names and each of the first ``SNIFF_LINES`` non-blank lines into as many fields; of several,
    the one giving the most columns. Counting is csv.Sniffer's idea, made strict: a guess is only
    said when every line agrees.
    """
    lines = [line for line in text.splitlines() if line.strip()][:SNIFF_LINES]
    best: tuple[int, str] | None = None
    for sep in SEPARATORS:
        if sep == used or not lines:
            continue
        try:
            rows = list(csv.reader(lines, delimiter=sep))
        except csv.Error:
            continue
        width = len(rows[0])
        even = sum(1 for name in rows[0] if name.strip()) >= 2 and all(len(row) == width for row in rows)
        if even and (best is None or width > best[0]):
            best = (width, sep)
    return best[1] if best else None


def repeated_names(names: list[str], what: str = "columns") -> str:
    """``'text' (columns 1 and 3)`` for every non-blank name given more than once (1-based); "" when none is.

    Blank names are left out: a spreadsheet's export often ends its rows with empty columns.
    """
    where: dict[str, list[int]] = {}
    for i, name in enumerate(names, start=1):
        if str(name).strip():
            where.setdefault(name, []).append(i)
    return "; ".join(f"{name!r} ({what} {', '.join(map(str, at[:-1]))} and {at[-1]})"
                     for name, at in where.items() if len(at) > 1)


def table_records(rows: list[tuple[int, list[str]]], path: Path, separator: str) -> list[Record]:
    """Records of a csv/tsv table split at ``separator``: the first non-blank row names the columns, blank rows are
    skipped.

    A row with fewer fields than the header is refused: that is what a line break inside an
    unquoted text leaves (the text's first part alone on one line, the rest with the label on
    the next); one with more fields is a separator inside an unquoted field. A header naming a
    column twice is refused (a row is read by name, so one of the two would vanish); a header of
    one column that another separator splits evenly names that separator.
    """
    rows = [(n, row) for n, row in rows if not _blank(row)]
    if not rows:
        return []
    (first, header), body = rows[0], rows[1:]
    header = [h.strip().lstrip("\ufeff") for h in header]
    twice = repeated_names(header)
    if twice:
        raise CompressError(f"{path}:{first}: the header names a column more than once: {twice}; rows are read by "
                            "column name, so rename or remove the extra column")
    if len(header) == 1:
        found = sniff_separator(read_text_file(path), separator)
        if found:
            raise CompressError(f"{path}:{first}: the header {header[0]!r} is one column split at "
                                f"{SEPARATORS[separator]}s, but the file looks {SEPARATORS[found]}-separated: "
                                f"{SEPARATOR_ADVICE[found]}")
    records = []
    for n, row in body:
        if len(row) != len(header):
            columns = ", ".join(header)
            if len(row) < len(header):
                raise CompressError(
                    f"{path}:{n}: {len(row)} field(s) where the header has {len(header)} ({columns}): this row has no "
                    f"{header[len(row)]!r}; a line break inside an unquoted text splits a row in two: join the lines or "
                    "quote the text"
                )
            raise CompressError(
                f"{path}:{n}: {len(row)} fields where the header has {len(header)} ({columns}); quote a field that "
                "holds the separator"
            )
        records.append(Record(f"{path}:{n}", dict(zip(header, row))))
    return records


class _RepeatedKey(ValueError):
    """A JSON object that names a key twice (json keeps the last silently)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json's ``object_pairs_hook``: the object as a dict, refused when a key occurs twice."""
    twice = repeated_names([key for key, _ in pairs], "keys")
    if twice:
        raise _RepeatedKey(twice)
    return dict(pairs)


# A \uD800-\uDFFF escape: half of a surrogate pair, which json reads into a string no UTF-8 encoder takes unless
# its other half follows.
SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _lone_surrogate(value: Any) -> str | None:
    """The first string in a JSON value (keys included) holding a lone surrogate, else None."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if any("\ud800" <= c <= "\udfff" for c in item):
                return item
        elif isinstance(item, dict):
            stack += [*item.keys(), *item.values()]
        elif isinstance(item, list):
            stack += item
    return None


def _load_json(text: str, where: str) -> Any:
    """``json.loads`` refusing an object that names a key twice, a string holding half a surrogate pair and a
    document nested past the recursion limit (``where``: the file, or its line). Syntax errors raise as json's own."""
    try:
        value = json.loads(text, object_pairs_hook=_unique_keys)
        bad = _lone_surrogate(value) if SURROGATE_ESCAPE.search(text) else None  # the walk only where one may be
        if bad is not None:
            shown = bad if len(bad) <= 40 else bad[:40] + "..."
            raise CompressError(f"{where}: the JSON string {shown!r} holds half a surrogate pair (a \\uD800-\\uDFFF "
                                "escape without its other half), which is no character; fix or remove the escape")
        return value
    except _RepeatedKey as err:
        raise CompressError(f"{where}: a JSON object names a key more than once: {err}; each key is a column, "
                            "so rename or remove the extra one") from None
    except RecursionError:
        raise CompressError(f"{where} nests its JSON deeper than Python can read (over {sys.getrecursionlimit()} "
                            "levels); it cannot be a data file, restore or re-create it") from None


def read_json_records(path: Path) -> list[Record]:
    """Records of a JSON list of objects (``file record N``) or of JSON lines (``file:line``)."""
    text = read_text_file(path)
    if text.lstrip().startswith("["):
        try:
            data = _load_json(text, str(path))
        except json.JSONDecodeError as err:
            raise CompressError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from None
        except ValueError:  # an integer past Python's limit on digits (4300)
            raise CompressError(f"{path}: not valid JSON (a number with more digits than Python reads)") from None
        if not all(isinstance(r, dict) for r in data):
            raise CompressError(f"{path}: expected a JSON list of objects")
        return [Record(f"{path} record {i}", r) for i, r in enumerate(data)]
    records = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = _load_json(line, f"{path}:{n}")
        except json.JSONDecodeError as err:
            raise CompressError(f"{path}:{n}: malformed JSON line ({err.msg})") from None
        except ValueError:  # an integer past Python's limit on digits (4300)
            raise CompressError(f"{path}:{n}: malformed JSON line (a number with more digits than Python "
                                "reads)") from None
        if not isinstance(record, dict):
            raise CompressError(f"{path}:{n}: expected a JSON object per line")
        records.append(Record(f"{path}:{n}", record))
    return records


def read_parquet(path: Path) -> list[Record]:
    """Records of a parquet file (``file row N``); a column name given twice is refused with its positions."""
    try:
        names = pq.read_schema(path).names
        twice = repeated_names(names)
        rows = [] if twice else pq.read_table(path).to_pylist()
    except Exception as err:  # pyarrow raises many types; the user needs one line
        first = reason(err)
        raise CompressError(f"cannot read parquet file {path}: {first}") from None
    if twice:
        raise CompressError(f"{path}: the table names a column more than once: {twice}; rows are read by column "
                            "name, so rename or remove the extra column")
    return [Record(f"{path} row {i}", r) for i, r in enumerate(rows)]


# A DatasetDict's split names for each of the toolkit's splits, first found wins.
SPLIT_NAMES = {"train": ("train",), "dev": ("validation", "dev", "valid", "val"), "test": ("test",)}


def read_saved_dataset(path: Path, split: str = "train") -> list[Record]:
    """Records of a ``save_to_disk`` folder; class-label ids become their names (a list column's too)."""
    # deferred: a heavy import, paid only where it is used
    import datasets

    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as err:  # datasets raises many types; the user needs one line
        raise CompressError(f"cannot read the datasets folder {path}: {reason(err)}") from None
    if isinstance(loaded, datasets.DatasetDict):
        names = [n for n in SPLIT_NAMES.get(split, (split,)) if n in loaded]
        if not names:
            raise CompressError(f"{path} holds splits {', '.join(loaded)}, none of them {split} "
                                f"({' or '.join(SPLIT_NAMES.get(split, (split,)))}); pass the folder of one split")
        loaded = loaded[names[0]]
    names = {}
    for column, feature in loaded.features.items():
        inner = getattr(feature, "feature", None)  # Sequence(ClassLabel) / List(ClassLabel)
        if isinstance(feature, datasets.ClassLabel):
            names[column] = (feature.names, False)
        elif isinstance(inner, datasets.ClassLabel):
            names[column] = (inner.names, True)
    records = []
    for i, row in enumerate(loaded.to_list()):
        for column, (label_names, is_list) in names.items():
            value = row.get(column)
            if is_list and isinstance(value, list):
                row[column] = [label_names[v] if isinstance(v, int) and 0 <= v < len(label_names) else v for v in value]
            elif isinstance(value, int) and 0 <= value < len(label_names):
                row[column] = label_names[value]
        records.append(Record(f"{path} row {i}", row))
    return records


def read_conll(path: Path, tokens: str = "tokens", tags: str = "tags") -> list[Record]:
    """One record per sentence ``{tokens: [...], tags: [...]}``, located at the sentence's first line.

    A line holds a token and its tag: ``token<TAB>tag``, or fields separated by spaces (the
    token first, the tag last, columns between ignored). A line with one field has no tag: it
    is refused, unless no line of the file has one (an unlabelled test file: records without ``tags``).
    """
    text = read_text_file(path)
    tagged = any(len(ln.split("\t") if "\t" in ln else ln.split()) > 1 for ln in text.split("\n") if ln.strip())
    records: list[Record] = []
    words: list[str] = []
    labels: list[str] = []
    lines: list[int] = []
    start = 0
    for n, raw in enumerate(text.split("\n"), start=1):
        line = raw.rstrip("\r")
        if not line.strip():  # an empty or whitespace-only line ends a sentence
            if words:
                records.append(_sentence(path, start, words, labels, lines, tokens=tokens, tags=tags if tagged else None))
            words, labels, lines = [], [], []
            continue
        fields = line.split("\t") if "\t" in line else line.split()
        fields = [f.strip() for f in fields if f.strip()]
        if fields[0] == DOCSTART:
            continue
        if len(fields) < 2 and tagged:
            raise CompressError(
                f"{path}:{n}: {line.strip()!r} has no tag; a CoNLL line holds a token and its tag (token<TAB>tag), "
                "and sentences are separated by an empty line"
            )
        if not words:
            start = n
        words.append(fields[0])
        labels.append(fields[-1])
        lines.append(n)
    if words:
        records.append(_sentence(path, start, words, labels, lines, tokens=tokens, tags=tags if tagged else None))
    return records


def _sentence(path: Path, start: int, words: list[str], labels: list[str], lines: list[int], *,
              tokens: str, tags: str | None) -> Record:
    """One CoNLL sentence as a record: its words, and its tags unless the file has none (``tags`` None).

    ``tokens`` / ``tags`` are the record's column names for the words and the tags; ``lines`` the words' line numbers.
    """
    values = {tokens: words, **({tags: labels} if tags else {})}
    return Record(f"{path}:{start}", values, tuple(lines))


def is_conll(path: Path) -> bool:
    return path.suffix.lower() in CONLL_SUFFIXES


def json_list(text: str) -> list | None:
    """The list a cell's text holds as JSON (``["a", "b"]``), else None (plain text, or a bracket that is not JSON)."""
    text = text.strip()
    if not (text.startswith("[") and text.endswith("]")):
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):  # not JSON: plain text that starts with a bracket
        return None
    return value if isinstance(value, list) else None


def label_list(raw: Any, sep: str | None, where: str) -> list[str]:
    """The labels of one multi-label cell: a list, a JSON list in text, or text split at ``sep``.

    An empty cell, a NaN or ``[]`` is no label, and an empty name in a list is none either (as
    between two separators). A JSON list is read as a list with or without ``sep``: split at ``;``
    it would make one label of its whole text. Without ``sep`` a cell must be a list: a plain string
    such as ``a;b`` is refused rather than read as one label named ``a;b``. A list holds names
    (strings or integers); anything else in it is refused.
    """
    if raw is None or (isinstance(raw, float) and math.isnan(raw)):  # a missing value (NaN: as pandas writes one)
        return []
    value = list(raw) if isinstance(raw, (list, tuple)) else json_list(str(raw))
    if value is not None:
        bad = [x for x in value if isinstance(x, bool) or not isinstance(x, (str, int))]  # null, true, 1.5, a list
        if bad:
            raise CompressError(f"{where}: the label list holds {bad[0]!r}, not a label name; write each row's labels "
                                "as a list of names ([\"a\", \"b\"])")
        return [str(x).strip() for x in value if str(x).strip()]
    text = str(raw).strip()
    if sep is not None:
        return [part.strip() for part in text.split(sep) if part.strip()]
    if not text:
        return []
    raise CompressError(
        f"{where}: the label cell {text!r} is not a list; write each row's labels as a JSON list "
        "([\"a\", \"b\"]) or pass --label-sep (e.g. --label-sep ';')"
    )
