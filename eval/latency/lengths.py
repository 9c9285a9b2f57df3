"""Latency on real inputs at their own lengths, batched with dynamic padding.

``compress latency`` times random token ids at a fixed length (128 by default), but
GLUE sentences are far shorter and vary (SST-2 dev: about 25 tokens). This module
times a model the way it is served:

    real_inputs(source, tokenizer)   a task's dev split, a text file or a user's data file, tokenised, unpadded
        -> batches(inputs, batch)    batch 1: one sentence at its own length, in the set's order;
                                     batch > 1: sorted by length, each chunk padded to its longest
        -> time_real(forward, ...)   warm-up, then timed passes; p50/p99 per batch, sentences/s

A user's own data file (csv, tsv, json, jsonl, parquet, CoNLL) is read through the task a model
folder records (:func:`lengths_task`), as training and evaluation read it: its text columns, a
token-classification sentence tokenised as its words.

It knows no backend: ``forward`` takes one batch of numpy arrays and runs the model once
(``compress.eval.latency.worker`` adapts each backend's session), so this module imports no
runtime and the latency modules may import it without a cycle.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from compress.core.data.features import check_max_length, encode_examples
from compress.core.data.sources import DataSource, load_split
from compress.core.errors import CompressError
from compress.core.data.files import read_json_records, read_text_file, read_tsv_rows
from compress.core.paths import check_input_file
from compress.core.data.resolve import task_of_model
from compress.core.data.tasks import TASKS, Task, get_task

# The file sources and how each names its text columns (a pair wins over a single sentence).
FILE_SUFFIXES = (".txt", ".tsv", ".jsonl")
TEXT_LINES = ".txt"  # one text per line, whatever task the models have: never read as a data file
PAIR_COLUMNS = ("sentence1", "sentence2")
SINGLE_COLUMNS = ("sentence",)


@dataclass(frozen=True, eq=False)  # eq=False: numpy arrays have no single truth value to compare
class RealInputs:
    """Tokenised real inputs, unpadded: sentence ``i`` is ``ids[i]`` with segments ``type_ids[i]``."""

    ids: tuple[np.ndarray, ...]  # each (len_i,) int64, [CLS] ... [SEP] as the tokenizer wrote it
    type_ids: tuple[np.ndarray, ...]  # each (len_i,) int64: 0 for the first text, 1 for a pair's second
    source: str  # what was read, e.g. "SST-2 dev (/data/glue)" or a file path
    max_length: int = 128  # the truncation limit the sentences were cut at

    def __post_init__(self) -> None:
        if len(self.ids) != len(self.type_ids):
            raise ValueError(f"{len(self.ids)} id arrays but {len(self.type_ids)} type-id arrays")
        for ids, types in zip(self.ids, self.type_ids):
            if ids.ndim != 1 or ids.shape != types.shape:
                raise ValueError(f"each sentence needs 1-D ids and type ids of one shape, got {ids.shape} and {types.shape}")
            # Frozen all the way down: batches and timings must not see a sentence change.
            ids.flags.writeable = False
            types.flags.writeable = False

    @property
    def n(self) -> int:
        """Number of sentences (a pair counts once)."""
        return len(self.ids)

    @property
    def lengths(self) -> np.ndarray:
        """(n,) int64: tokens per sentence, special tokens included."""
        return np.array([len(ids) for ids in self.ids], dtype=np.int64)

    @property
    def total_tokens(self) -> int:
        return int(self.lengths.sum())

    @property
    def mean_tokens(self) -> float:
        return float(self.lengths.mean())

    @property
    def median_tokens(self) -> float:
        return float(np.median(self.lengths))

    @property
    def max_tokens(self) -> int:
        return int(self.lengths.max())

    @property
    def n_truncated(self) -> int:
        """Sentences cut at ``max_length`` (they reached it; a few may have fitted exactly)."""
        return int((self.lengths >= self.max_length).sum())

    def stats(self) -> dict[str, Any]:
        """The length figures a report shows, as plain JSON values."""
        return {
            "source": self.source,
            "n": self.n,
            "mean_tokens": self.mean_tokens,
            "median_tokens": self.median_tokens,
            "max_tokens": self.max_tokens,
            "max_length": self.max_length,
            "n_truncated": self.n_truncated,
        }


# ---------------------------------------------------------------------------- reading


def real_inputs(source: str, tokenizer, *, data_dir: str | None = None, max_length: int = 128,
                limit: int | None = None, task: Task | None = None) -> RealInputs:
    """Tokenise a task's dev split or a text file at each text's own length (truncated, not padded).

    ``source`` is a task name (its first dev split, e.g. MNLI's dev_matched, read from
    ``data_dir`` or the hub through ``compress.core.data.sources``, encoded as training encodes
    it) or a ``.txt`` (one text per line), ``.tsv`` or ``.jsonl`` file (a ``sentence``
    column, or ``sentence1`` + ``sentence2`` for pairs). With ``task``, a user's own task
    (:func:`lengths_task`), any file but ``.txt`` is that task's data file, read and encoded
    as the task's model reads it. ``limit`` keeps the first N.
    """
    check_max_length(max_length, None)
    if limit is not None and limit < 1:
        raise CompressError(f"the input limit must be at least 1, got {limit}")
    path = Path(source)
    if path.suffix.lower() in FILE_SUFFIXES or path.is_file() or "/" in source:
        if data_dir is not None:
            raise CompressError(f"data_dir {data_dir} is for a task source, not the file {source}; pass one or the other")
        if reads_data_file(task, path):
            return _task_file(task, path, tokenizer, max_length, limit)
        texts, where = tuple(column[:limit] for column in _read_file(path)), str(path)
        if not texts[0]:
            raise CompressError(f"{where} has no texts to time; pass a file with at least one non-blank text, or a task name")
        # The same call training makes for sentences: pairs as pairs, the longest text cut first.
        encoded = tokenizer(*[list(column) for column in texts], truncation=True, max_length=max_length)
    else:
        named = _task(source)
        split = named.resolve_splits("dev")[0]  # MNLI: dev_matched
        ds = load_split(named, split.name, DataSource(data_dir=data_dir), limit)
        where = f"{named.display} {split.name} ({data_dir or 'the Hugging Face hub'})"
        encoded = encode_examples(named, tokenizer, ds, max_length)
    return _inputs(encoded, where, max_length)


def reads_data_file(task: Task | None, path: Path) -> bool:
    """Whether ``path`` is read as ``task``'s data file: a user's own task, any file but one text per line."""
    return task is not None and task.user and path.suffix.lower() != TEXT_LINES


def lengths_task(model_dirs, source: str | None) -> Task | None:
    """The task that reads a ``--lengths`` file for every model of a run: the first folder's own task that is a
    user's (its columns and kind), so every model times the same inputs; None for a preset name, a ``.txt`` file
    or models of no user task."""
    if not source or Path(source).suffix.lower() == TEXT_LINES or not (Path(source).is_file() or Path(source).is_dir()):
        return None
    for model in model_dirs:
        try:
            task = task_of_model(model)
        except CompressError:
            continue  # an unreadable record: the model has no task to offer
        if task is not None and task.user:
            return task
    return None


def _task_file(task: Task, path: Path, tokenizer, max_length: int, limit: int | None) -> RealInputs:
    """A user's data file as its task reads the test split (labels may be missing), encoded as its model reads it."""
    ds = load_split(task, "test", DataSource(data_file=str(path)), limit)
    encoded = encode_examples(task, tokenizer, ds, max_length)
    return _inputs(encoded, f"{task.display} {path}", max_length)


def _inputs(encoded, where: str, max_length: int) -> RealInputs:
    """:class:`RealInputs` of a tokenizer's output (one unpadded row per example)."""
    ids = tuple(np.asarray(row, dtype=np.int64) for row in encoded["input_ids"])
    # A tokenizer without segments (e.g. RoBERTa's) gives none: every token is segment 0.
    types = encoded.get("token_type_ids") or [[0] * len(row) for row in ids]
    return RealInputs(ids, tuple(np.asarray(row, dtype=np.int64) for row in types), where, max_length)


def _task(name: str) -> Task:
    """The registered task called ``name``, or one line saying a source is a task or a file."""
    try:
        return get_task(name)
    except CompressError:
        raise CompressError(
            f"unknown input source {name!r}: not a task ({', '.join(TASKS)}) and not a file; "
            f"pass a task name or a {'/'.join(FILE_SUFFIXES)} file"
        ) from None


def _read_file(path: Path) -> tuple[list[str], ...]:
    """The texts of a file as columns: (texts,) or (first texts, second texts) for pairs."""
    suffix = path.suffix.lower()
    if not path.exists() and not path.is_symlink():
        raise CompressError(f"input file {path} does not exist; pass an existing {'/'.join(FILE_SUFFIXES)} file or a task name")
    check_input_file(path, "--lengths file")  # a FIFO, a device, a directory, an empty file, a broken link: named as such
    if suffix == ".txt":
        return ([line.strip() for line in read_text_file(path).splitlines() if line.strip()],)
    if suffix == ".tsv":
        rows = read_tsv_rows(path)  # GLUE's convention: tabs, no quoting, a header row
        header, body, first_line = (rows[0] if rows else []), rows[1:], 2
    elif suffix == ".jsonl":
        records = [r.values for r in read_json_records(path)]  # one JSON object per line; the first one's keys name the columns
        header = [str(k) for k in records[0]] if records else []
        body, first_line = [[str(r.get(k, "")) for k in header] for r in records], 1
    else:
        raise CompressError(f"input file {path}: unsupported extension {path.suffix!r}; use {', '.join(FILE_SUFFIXES)}, "
                            "or time models of your own task (a data file is read through the task their folder records)")
    names = [h.strip().lstrip("\ufeff") for h in header]
    wanted = next((cols for cols in (PAIR_COLUMNS, SINGLE_COLUMNS) if all(c in names for c in cols)), None)
    if wanted is None:
        raise CompressError(
            f"{path}: no 'sentence' column and no 'sentence1' + 'sentence2' columns (found: {', '.join(names) or 'none'}); "
            "rename the text column(s), or pass the task name for a GLUE file"
        )
    where = [names.index(c) for c in wanted]
    columns: tuple[list[str], ...] = tuple([] for _ in wanted)
    for line, row in enumerate(body, start=first_line):
        if not any(cell.strip() for cell in row):
            continue  # a blank line
        if len(row) <= max(where):
            raise CompressError(f"{path}:{line}: malformed row: {len(row)} fields where the header has {len(names)}")
        for column, i in zip(columns, where):
            column.append(row[i])
    return columns


# ---------------------------------------------------------------------------- batching


def batches(inputs: RealInputs, batch: int, pad_id: int = 0, multiple: int = 1) -> list[dict[str, np.ndarray]]:
    """The sentences as model inputs, each exactly once: ``input_ids``, ``attention_mask``, ``token_type_ids``.

    Batch 1 keeps the set's order, each sentence at its own length (1, len_i). A larger
    batch sorts by length (stable) and pads each chunk of ``batch`` only to its own
    longest, as a server that buckets requests would: every array is (b, s) int64 with
    b <= ``batch`` (the last chunk may be short) and s the chunk's longest sentence.
    ``multiple``: s is rounded up to a multiple of it (never past ``inputs.max_length``), so
    that a runtime compiled per shape needs few shapes.
    """
    if batch < 1:
        raise CompressError(f"the batch size must be at least 1, got {batch}")
    if multiple < 1:
        raise CompressError(f"the padding multiple must be at least 1, got {multiple}")
    order = np.argsort(inputs.lengths, kind="stable") if batch > 1 else np.arange(inputs.n)
    out = []
    for start in range(0, inputs.n, batch):
        chunk = order[start:start + batch]
        longest = max(len(inputs.ids[i]) for i in chunk)
        seq = max(longest, min(-(-longest // multiple) * multiple, inputs.max_length))
        ids = np.full((len(chunk), seq), pad_id, dtype=np.int64)  # (b, s)
        mask = np.zeros((len(chunk), seq), dtype=np.int64)  # 1 = real token, 0 = padding
        types = np.zeros((len(chunk), seq), dtype=np.int64)
        for row, i in enumerate(chunk):
            n = len(inputs.ids[i])
            ids[row, :n], mask[row, :n], types[row, :n] = inputs.ids[i], 1, inputs.type_ids[i]
        out.append({"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
    return out


# ---------------------------------------------------------------------------- timing


def more_passes(done: int, spent: float, *, passes: int, min_seconds: float = 0.0, max_seconds: float = 0.0,
                keep: int = 1) -> bool:
    """Whether to time another pass, ``done`` of them taking ``spent`` seconds so far.

    At least ``passes``, and more while they add up to less than ``min_seconds``; none once they
    add up to ``max_seconds`` (0: no limit), but never fewer than ``keep`` (a median needs a few).
    """
    if max_seconds and done >= keep and spent >= max_seconds:
        return False
    return done < passes or spent < min_seconds


def time_real(forward: Callable[[Any], object], inputs: RealInputs, batch: int, *, warmup: int = 3, passes: int = 1,
              prepare: Callable[[dict[str, np.ndarray]], Any] | None = None, multiple: int = 1,
              forward_for: Callable[[tuple[int, int]], Callable[[Any], object]] | None = None,
              min_seconds: float = 0.0, max_seconds: float = 0.0, clock: Callable[[], float] = time.perf_counter) -> dict[str, Any]:
    """Time ``forward`` over every sentence of ``inputs`` at ``batch``: latency per batch and throughput.

    ``warmup`` untimed calls go to the first batches (cycling when there are fewer), then
    ``passes`` timed passes over all batches. Each batch's time is its median over the
    passes; p50/p99 are over batches (per sentence at batch 1). Throughput is
    ``n_sentences`` over the median pass's total seconds, padding included.
    ``prepare`` turns every batch into what ``forward`` takes (e.g. tensors), before any timing.
    ``multiple``: pad each batch's length up to a multiple of it (see :func:`batches`).
    ``forward_for``: a forward made for one (batch, seq) shape (e.g. a model compiled for it),
    asked once per distinct padded shape before any timing; each batch then runs its shape's.
    ``min_seconds``: more passes while the timed ones add up to less than this; ``max_seconds``:
    no further pass once they add up to this long (0: no limit; a slow model's one pass over a
    dev set can take a minute). The first pass always runs.
    """
    timer = RealTimer(forward, inputs, batch, warmup=warmup, passes=passes, prepare=prepare, multiple=multiple,
                      forward_for=forward_for, min_seconds=min_seconds, max_seconds=max_seconds, clock=clock)
    while timer.advance():
        pass
    return timer.result()


class RealTimer:
    """:func:`time_real` a slice at a time: the same warm-up, passes and result, timed in as many turns as asked.

    Several models loaded at once can then take turns over the same real inputs (each
    :meth:`advance` times its model for a slice of seconds, continuing its pass where the
    last slice stopped), so that a slow spell of the machine lands on all of them.
    Everything untimed (padding, ``prepare``, ``forward_for``, the warm-up) happens here, once.
    """

    def __init__(self, forward: Callable[[Any], object], inputs: RealInputs, batch: int, *, warmup: int = 3,
                 passes: int = 1, prepare: Callable[[dict[str, np.ndarray]], Any] | None = None, multiple: int = 1,
                 forward_for: Callable[[tuple[int, int]], Callable[[Any], object]] | None = None,
                 min_seconds: float = 0.0, max_seconds: float = 0.0, clock: Callable[[], float] = time.perf_counter):
        if warmup < 0:
            raise CompressError(f"warm-up calls must be 0 or more, got {warmup}")
        if passes < 1:
            raise CompressError(f"timed passes must be at least 1, got {passes}")
        self.inputs, self.batch, self.multiple, self.clock = inputs, batch, multiple, clock
        self.passes, self.min_seconds, self.max_seconds = passes, min_seconds, max_seconds
        feeds = batches(inputs, batch, multiple=multiple)
        self.padded = int(sum(feed["input_ids"].size for feed in feeds))
        shapes = [feed["input_ids"].shape for feed in feeds]
        made = {shape: forward_for(shape) for shape in dict.fromkeys(shapes)} if forward_for is not None else {}
        self.shapes = len(made) or None
        self.forwards = [made.get(shape, forward) for shape in shapes]  # one per batch
        self.feeds = [prepare(feed) for feed in feeds] if prepare is not None else feeds
        for i in range(warmup):
            self.forwards[i % len(self.feeds)](self.feeds[i % len(self.feeds)])
        self.timed: list[np.ndarray] = []  # one (batches,) array per finished pass
        self.row: np.ndarray | None = None  # the pass under way: its first ``self.next`` batches are timed
        self.next = 0
        self.spent = 0.0  # seconds of the finished passes
        # min_seconds: a fast model's pass over a dev set takes 0.3 s, which a few seconds' slow spell of the machine covers.
        self.finished = not more_passes(0, 0.0, passes=passes, min_seconds=min_seconds, max_seconds=max_seconds)

    def advance(self, seconds: float = float("inf"), extra: bool = False) -> bool:
        """Time batches until this call's timed calls add up to ``seconds`` (at least one batch, and never
        past the last pass); whether passes remain. A pass is started only where :func:`more_passes` says so.

        ``extra``: time on past the last pass, for a slice of finite ``seconds``: a fast model taking turns
        with slow ones keeps timing until they are done, so its passes span the same minutes as theirs.
        Only whole passes count; one cut short by the last slice is left out of :meth:`result`.
        """
        if extra and not math.isfinite(seconds):
            raise CompressError("extra passes are timed a slice at a time: give the slice's seconds")
        slice_s = 0.0
        while (extra or not self.finished) and (slice_s == 0.0 or slice_s < seconds):
            if self.row is None:
                self.row, self.next = np.empty(len(self.feeds)), 0
            b = self.next
            start = self.clock()
            self.forwards[b](self.feeds[b])
            self.row[b] = self.clock() - start
            slice_s += float(self.row[b]) or 1e-12  # a clock too coarse to see a call still counts it
            self.next += 1
            if self.next == len(self.feeds):
                self.timed.append(self.row)
                self.spent += float(self.row.sum())
                self.row = None
                self.finished = not more_passes(len(self.timed), self.spent, passes=self.passes,
                                                min_seconds=self.min_seconds, max_seconds=self.max_seconds)
        return not self.finished

    def result(self) -> dict[str, Any]:
        """The figures of the finished passes (see :func:`time_real`)."""
        if not self.finished:
            raise CompressError("the real-input timing is not finished: advance it until it says so")
        seconds = np.stack(self.timed)  # (passes, batches)
        per_batch_ms = np.median(seconds, axis=0) * 1e3  # (batches,)
        p50, p99 = np.percentile(per_batch_ms, [50, 99])
        total_s = float(np.median(seconds.sum(axis=1)))  # the median pass
        return {
            "batch": self.batch,
            "n_sentences": self.inputs.n,
            "n_batches": len(self.feeds),
            "passes": len(seconds),  # timed; fewer than asked when max_seconds cut them short
            "mean_tokens": self.inputs.mean_tokens,  # real tokens per sentence
            "real_tokens": self.inputs.total_tokens,
            "padded_tokens": self.padded,  # sum of b * s: what the model computes on
            "multiple": self.multiple,  # each batch's length rounded up to it
            "shapes": self.shapes,  # models made for a fixed shape, when forward_for was given
            "p50_ms": float(p50),
            "p99_ms": float(p99),
            "sentences_per_s": self.inputs.n / total_s if total_s > 0 else float("inf"),
            "total_s": total_s,
        }
