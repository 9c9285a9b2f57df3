"""Any bytes given as a model folder's record give a result or the toolkit's one-line error, never another exception.

One property per record (compression.json, metrics.json, the sentence-transformers files), checked with Hypothesis
on arbitrary bytes, on arbitrary JSON documents, and on a valid record with one field replaced by any JSON value
(the shape a hand-edited or hostile file takes). A record the reader accepts then goes through what reads it next
(the lineage, the model card, the leaderboard's row, the task it names): those too give a result or a CompressError.

Bounded for CI: ``MAX_EXAMPLES`` per property, derandomized (the same examples on every run), no example database on
disk. ``COMPRESS_PROPERTY_EXAMPLES=1000`` draws that many new random examples per property, by hand.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compress.core.data.resolve import recorded_task
from compress.core.errors import CompressError
from compress.core.formats import card
from compress.core.formats.records import lineage, read_compression, read_metrics
from compress.core.formats.sentence import SentenceSpec, read_spec, write_sentence_files
from compress.eval.leaderboard_rows import read_row
from tests.conftest import make_tiny_model, make_tokenizer, save_tiny

SEARCH = os.environ.get("COMPRESS_PROPERTY_EXAMPLES")  # a deeper random search, by hand
MAX_EXAMPLES = int(SEARCH or 60)
BOUNDED = settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=not SEARCH, database=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# JSON values, small: the scalars that have broken readers (strings of digits, NaN, huge ints, NUL, "..", paths).
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2 ** 70), max_value=2 ** 70), st.floats(),
    st.sampled_from(["", "4", "high", "..", "../..", "/", "/etc", "a\x00b", "x" * 300, "mean", "cls", "1_Pooling",
                     "sentence_transformers.models.Pooling", "sentence_transformers.models.Transformer", "eval",
                     "latency", "sst2", "text-classification"]),
    st.text(max_size=12),
)
JSON = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                     st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                    max_leaves=12)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A tiny classifier and a sentence-transformers folder whose records each example overwrites."""
    root = tmp_path_factory.mktemp("records")
    tok = make_tokenizer(root / "tok")
    model = save_tiny(make_tiny_model(), tok, root / "model")
    st_folder = save_tiny(make_tiny_model("base"), tok, root / "st")
    write_sentence_files(st_folder, SentenceSpec(pooling="mean", normalize=True, max_seq_length=48), 32)
    return root


def replaced(document, path: tuple, value):
    """``document`` with the value at ``path`` (keys and indices, as far as they reach) replaced by ``value``."""
    if not path:
        return value
    document = copy.deepcopy(document)
    node = document
    for step in path[:-1]:
        try:
            node = node[step]
        except (KeyError, IndexError, TypeError):
            return document
    if isinstance(node, dict) or (isinstance(node, list) and isinstance(path[-1], int) and path[-1] < len(node)):
        node[path[-1]] = value
    return document


def as_bytes(document) -> bytes:
    return json.dumps(document).encode()


def documents(valid, paths: list[tuple]):
    """Bytes of a record: any bytes, any JSON, or ``valid`` with the value at one of ``paths`` replaced by any JSON."""
    edits = st.builds(lambda path, value: as_bytes(replaced(valid, path, value)), st.sampled_from(paths), JSON)
    return st.one_of(st.binary(max_size=300), JSON.map(as_bytes), edits)


def refused_or(read):
    """``read()``'s result, or None when it refused with the toolkit's one-line error."""
    try:
        return read()
    except CompressError as err:
        assert "\n" not in str(err)
        return None


# ---------------------------------------------------------------------------- compression.json

RECORD = {
    "stage": "distill", "method": "kd", "format": "torch", "precision": "fp32", "head": "sequence-classification",
    "config": {"task": "mine"}, "parent": {"path": "/nowhere/parent", "hash": "sha256:0", "stage": "finetune"},
    "structure": {"num_layers": 2, "hidden_size": 32, "head_size": 8, "heads": [4, 4], "pruned_heads": {},
                  "ffn": [37, 37], "kept_layers": [0, 1]},
    "task": "mine", "task_spec": {"name": "mine", "kind": "text-classification", "text_fields": ["text"],
                                  "labels": ["neg", "pos"], "columns": {}, "metric": "accuracy", "label_sep": None,
                                  "threshold": None},
    "provenance": {"date": "2026-01-01T00:00:00+00:00"}, "params": 1000,
    "teacher_check": {"problems": ["at chance"], "at_chance": True},
}
RECORD_PATHS = [(), ("stage",), ("format",), ("head",), ("config",), ("config", "task"), ("parent",), ("parent", "path"),
                ("structure",), ("structure", "heads"), ("structure", "heads", 0), ("structure", "ffn", 1),
                ("structure", "pruned_heads"), ("structure", "kept_layers"), ("structure", "hidden_size"),
                ("task",), ("task_spec",), ("task_spec", "labels"), ("task_spec", "labels", 0),
                ("task_spec", "text_fields"), ("task_spec", "columns"), ("task_spec", "threshold"), ("task_spec", "kind"),
                ("provenance",), ("params",), ("teacher_check",), ("teacher_check", "problems"), ("summary",)]


@BOUNDED
@given(data=documents(RECORD, RECORD_PATHS))
def test_any_compression_json_is_read_or_refused_in_one_line(folders, data):
    folder = folders / "model"
    (folder / "compression.json").write_bytes(data)
    record = refused_or(lambda: read_compression(folder))
    if record is None:
        return
    assert isinstance(record, dict)
    # What reads it next: the chain of parents, the task it names, the card written from it.
    refused_or(lambda: list(lineage(folder)))
    refused_or(lambda: recorded_task([(folder, record)]))
    config = json.loads((folder / "config.json").read_text())
    text = card.model_card("model", record, config, [], head=record.get("head") or "base")
    assert text.startswith(card.MARKER)


# ---------------------------------------------------------------------------- metrics.json

RESULTS = {"results": [
    {"kind": "eval", "task": "sst2", "split": "dev", "n": 16, "metrics": {"accuracy": 50.0}, "when": "2026-01-01"},
    {"kind": "latency", "backend": "torch", "when": "2026-01-02", "speedup_vs": "x",
     "rows": [{"backend": "torch", "batch": 1, "seq": 128, "p50_ms": 2.5, "params": 1000, "size_mb": 0.1,
               "slowest_run": {"p50_ms": 2.6, "p90_ms": 2.7, "p99_ms": 2.8, "mean_ms": 2.6}}]},
    {"kind": "retention", "task": "sst2", "metric": "accuracy", "student": 50.0, "teacher": 60.0, "ratio": 0.83},
]}
RESULT_PATHS = [(), ("results",), ("results", 0), ("results", 0, "metrics"), ("results", 0, "metrics", "accuracy"),
                ("results", 0, "n"), ("results", 0, "split"), ("results", 0, "task"), ("results", 0, "when"),
                ("results", 1, "rows"), ("results", 1, "rows", 0), ("results", 1, "rows", 0, "batch"),
                ("results", 1, "rows", 0, "p50_ms"), ("results", 1, "rows", 0, "slowest_run"),
                ("results", 1, "rows", 0, "params"), ("results", 2, "student"), ("results", 2, "ratio")]


@BOUNDED
@given(data=documents(RESULTS, RESULT_PATHS))
def test_any_metrics_json_is_read_or_refused_in_one_line(folders, data):
    folder = folders / "model"
    (folder / "compression.json").write_text(json.dumps({"stage": "test", "method": "tiny"}))
    (folder / "metrics.json").write_bytes(data)
    results = refused_or(lambda: read_metrics(folder))
    if results is None:
        return
    assert isinstance(results, list) and all(isinstance(r, dict) for r in results)
    # What reads it next: the leaderboard's row (scores, latency points, sizes) and the card's measured lines.
    row = refused_or(lambda: read_row(folder, "model", batch=1, seq=128))
    assert row is None or row.path == folder
    config = json.loads((folder / "config.json").read_text())
    assert card.MARKER in card.model_card("model", {}, config, results)


# ---------------------------------------------------------------------------- the sentence-transformers files

MODULES = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
           {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
           {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
MODULE_PATHS = [(), (0,), (1,), (2,), (0, "path"), (1, "path"), (2, "path"), (0, "type"), (1, "type"), (2, "type")]
POOLING = {"word_embedding_dimension": 32, "pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False}
POOLING_PATHS = [(), ("word_embedding_dimension",), ("pooling_mode_mean_tokens",), ("pooling_mode",)]


@BOUNDED
@given(modules=documents(MODULES, MODULE_PATHS), pooling=documents(POOLING, POOLING_PATHS),
       transformer=st.one_of(documents({"max_seq_length": 48, "do_lower_case": False}, [(), ("max_seq_length",)]),
                             st.none()))
def test_any_sentence_transformers_files_are_read_or_refused_in_one_line(folders, modules, pooling, transformer):
    folder = folders / "st"
    (folder / "modules.json").write_bytes(modules)
    (folder / "1_Pooling" / "config.json").write_bytes(pooling)
    (folder / "sentence_bert_config.json").unlink(missing_ok=True)
    if transformer is not None:
        (folder / "sentence_bert_config.json").write_bytes(transformer)
    spec = refused_or(lambda: read_spec(folder))
    assert spec is None or spec.pooling in ("mean", "cls", "max")


def test_the_valid_records_themselves_read(folders):
    """The documents the properties edit are valid: each reads, so an edit is what any refusal is about."""
    model, st_folder = folders / "model", folders / "st"
    (model / "compression.json").write_text(json.dumps(RECORD))
    (model / "metrics.json").write_text(json.dumps(RESULTS))
    assert read_compression(model)["task_spec"]["labels"] == ["neg", "pos"]
    assert [r["kind"] for r in read_metrics(model)] == ["eval", "latency", "retention"]
    assert recorded_task([(model, RECORD)]).label_names == ("neg", "pos")
    row = read_row(model, "model", batch=1, seq=128)
    assert row.scores == {"sst2": 50.0} and row.latency.p50_ms == 2.5 and row.params == 1000
    (st_folder / "modules.json").write_text(json.dumps(MODULES))
    (st_folder / "1_Pooling" / "config.json").write_text(json.dumps(POOLING))
    (st_folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 48}))
    assert read_spec(st_folder) == SentenceSpec(pooling="mean", normalize=True, max_seq_length=48, dimension=32,
                                                sentence_transformers=True)
    Path(model / "compression.json").write_text(json.dumps({"stage": "test", "method": "tiny"}))
