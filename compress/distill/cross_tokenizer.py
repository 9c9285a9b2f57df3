"""A student with a tokenizer of its own: each model tokenises the text itself; outputs meet per example, word or span boundary.

A student from ``--init DIR`` (or ``--init-from DIR``) whose tokenizer is not its teacher's (another vocabulary, or
the same one tokenising otherwise: a MiniLM student with BERT's WordPiece under an MPNet teacher) trains on its own
tokenisation of every training row, is evaluated with it and is saved with it. The teacher reads its own tokenisation
of the same rows, so its cache is keyed on its own token ids, as in any run of that teacher on that data
(:mod:`compress.distill.teacher_cache`): students of any tokenizer share it. Where the two meet is decided by the task
kind's ``layout`` (:data:`MEETINGS`):

* ``sentences`` (a label, a label set, a score): per example, the logits as they are (row i of both is the student's
  ``cache_index`` i);
* ``words`` (a tag per word): per word, the teacher's logits at each word's first piece against the student's at its
  own first piece of that word (``word_ids`` of each tokenizer); the other positions leave the kd term;
* ``squad`` (answer spans): per span boundary, through character offsets in the context. Each tokenizer cuts the
  context into its own windows (``--max-length``, ``--doc-stride``); a student window meets the teacher window of the
  same example that saw most of its context (:func:`best_window`, the teacher's row :data:`TEACHER_ROW`). A student
  token takes the teacher's start logit of the teacher token that starts at the same character, and the end logit of
  the one that ends at the same character (:func:`boundary_positions`); every other position (question, special
  tokens, [CLS], pieces with no shared boundary, context the teacher's window did not see) gets ``-inf`` and leaves
  that softmax on both sides (:func:`compress.distill.losses.partial_span_kd`): the kd term runs over the positions
  both can express, the teacher's distribution renormalised over them. A student window that meets no teacher
  boundary takes the hard loss alone.

The terms that compare hidden states or attention maps position by position (hidden, embedding, attention, cosine,
minilm) need the same tokens on both sides: they are refused before the student is loaded (:func:`check_terms`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Sequence

import torch

from compress.core.data.features import collate, squad_eval_features
from compress.core.data.tasks import Task, TaskKind
from compress.core.data.token_data import encode_words, first_pieces
from compress.core.errors import CompressError
from compress.core.model.structure import model_inputs
from compress.distill.terms import INTERMEDIATE_TERMS, Outputs

log = logging.getLogger(__name__)

POSITIONS = "teacher_positions"  # a student feature (words): per position, the teacher's position it meets, or -1
STARTS = "teacher_starts"  # a student window (spans): per position, the teacher's position starting at its character, or -1
ENDS = "teacher_ends"  # a student window (spans): per position, the teacher's position ending at its character, or -1
TEACHER_ROW = "teacher_row"  # a student window (spans): the teacher's feature (its window) it meets, or -1
POSITION_COLUMNS = (POSITIONS, STARTS, ENDS)  # per position, padded with -1 as the ids are padded
MEETING_COLUMNS = (*POSITION_COLUMNS, TEACHER_ROW)  # what a student feature carries for the meeting, never the model
INPUTS = ("input_ids", "attention_mask", "token_type_ids")  # the teacher features a forward reads

# Texts two tokenizers must turn into the same ids to count as one tokenisation: case, accents, punctuation,
# numbers, a rare word and a pair (special tokens and segments between the texts).
PROBES = (("Hello World, it's a naïve café: 12,345 unbelievably-tokenised words!",),
          ("Who sat on the mat?", "The cat SAT on the mat."))


def same_tokenisation(a, b) -> bool:
    """Whether tokenizers ``a`` and ``b`` turn text into the same ids: vocabulary, padding id, lower-casing, splitting
    and special tokens compared (their classes are not: a BERT and an MPNet tokenizer may agree, or not)."""
    if a is b:
        return True
    if a.get_vocab() != b.get_vocab() or a.pad_token_id != b.pad_token_id:
        return False
    return all(a(*texts)["input_ids"] == b(*texts)["input_ids"] for texts in PROBES)


@dataclass(frozen=True)
class Meeting:
    """Where a teacher's and a student's outputs meet when they tokenise apart, for one layout of examples."""

    where: str  # "example", "word", "boundary" (the start/end boundaries both tokenizations share); "": nowhere


# Keyed by TaskKind.layout (the task kind decides, in compress.core.data.tasks, how its examples are laid out).
MEETINGS: dict[str, Meeting] = {
    "sentences": Meeting("example"),
    "words": Meeting("word"),
    "squad": Meeting("boundary"),
}


def check_terms(task: Task, terms: tuple[str, ...]) -> None:
    """Refuse, in one line, the terms that cannot meet across tokenizers: the intermediate ones (tokens and the
    states at them do not line up), and kd on a layout of examples with no meeting place (:data:`MEETINGS`)."""
    inner = [t for t in terms if t in INTERMEDIATE_TERMS]
    if inner:
        raise CompressError(
            f"--losses {','.join(inner)}: the student has a tokenizer of its own (not the teacher's), so the two models' "
            "tokens, and the hidden states and attention maps at them, do not line up; use --losses kd,hard, or a "
            "student that shares the teacher's tokenizer")
    if "kd" in terms and task.behaviour.layout not in MEETINGS:
        raise CompressError(
            f"--losses kd cannot cross tokenizers on {task.display}: its outputs have no place where the two "
            "tokenizations meet; use --losses hard, or a student that shares the teacher's tokenizer")


def word_positions(student_word_ids: list[int | None], teacher_word_ids: list[int | None]) -> list[int]:
    """Per student position: the teacher's position of the first piece of the word whose first piece this is, else -1
    (a later piece, a special token, or a word the teacher's tokenisation lost at its length)."""
    teacher_first = first_pieces(teacher_word_ids)
    positions = [-1] * len(student_word_ids)
    for word, position in first_pieces(student_word_ids).items():
        positions[position] = teacher_first.get(word, -1)
    return positions


def pad_positions(rows: list[list[int]], length: int, side: str = "right") -> torch.Tensor:
    """:data:`POSITIONS` of a batch padded with -1 to the batch's ``length`` on the tokenizer's padding ``side``:
    (batch, length)."""
    if side == "left":
        return torch.tensor([[-1] * (length - len(r)) + list(r) for r in rows], dtype=torch.long)
    return torch.tensor([list(r) + [-1] * (length - len(r)) for r in rows], dtype=torch.long)


def meeting_batch(items: list[dict], length: int, side: str = "right") -> dict[str, torch.Tensor]:
    """The meeting columns of a batch's student features (:data:`MEETING_COLUMNS`, those they carry): the positions
    padded with -1 to the batch's ``length`` (batch, length), the teacher's row (batch,)."""
    batch = {name: pad_positions([x[name] for x in items], length, side) for name in POSITION_COLUMNS if name in items[0]}
    if TEACHER_ROW in items[0]:
        batch[TEACHER_ROW] = torch.tensor([int(x[TEACHER_ROW]) for x in items], dtype=torch.long)
    return batch


# ---------------------------------------------------------------------------- spans: windows met through characters

Offsets = Sequence[tuple[int, int] | None]  # per position: (start, end) characters in the context; None off it


def _boundaries(offsets: Offsets, side: int) -> dict[int, int]:
    """character -> position: of the first token starting there (``side`` 0), of the last one ending there (1).
    Zero-width tokens bound nothing."""
    found: dict[int, int] = {}
    for position, span in enumerate(offsets):
        if span is None or span[0] >= span[1]:
            continue
        if side == 0:
            found.setdefault(span[0], position)
        else:
            found[span[1]] = position
    return found


def boundary_positions(student: Offsets, teacher: Offsets) -> tuple[list[int], list[int]]:
    """(starts, ends): per student position, the teacher's position of the token that starts at the same character of
    the context, and of the one that ends at the same character; -1 where none does (off the context, a piece with no
    shared boundary, a character outside the teacher's window).

    ``student``, ``teacher``: each window's offsets (None off the context: question and special tokens). A boundary
    counts once on each side: the first token starting at a character, the last one ending at it."""
    starts, ends = [-1] * len(student), [-1] * len(student)
    for side, out in ((0, starts), (1, ends)):
        theirs = _boundaries(teacher, side)
        for char, position in _boundaries(student, side).items():
            out[position] = theirs.get(char, -1)
    return starts, ends


def _context_span(offsets: Offsets) -> tuple[int, int]:
    """(first, last) character of the context a window sees; (0, 0) when it sees none."""
    spans = [o for o in offsets if o is not None and o[0] < o[1]]
    return (min(o[0] for o in spans), max(o[1] for o in spans)) if spans else (0, 0)


def best_window(student: Offsets, windows: Sequence[Offsets]) -> int:
    """The index of the teacher window (offsets in ``windows``) that saw most of the student window's context, in
    characters in common (the first on a tie); -1 when none shares a character with it."""
    first, last = _context_span(student)
    best, most = -1, 0
    for k, window in enumerate(windows):
        start, end = _context_span(window)
        common = min(last, end) - max(first, start)
        if common > most:
            best, most = k, common
    return best


def span_logits_at(teacher_start: torch.Tensor, teacher_end: torch.Tensor, starts: torch.Tensor,
                   ends: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The teacher's start and end logits (batch, seq_t) at the student's positions: :data:`STARTS` and :data:`ENDS`
    (batch, seq) index the teacher's positions; (batch, seq) each, ``-inf`` where the index is -1."""
    def at(logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        positions = positions.to(logits.device)
        values = torch.gather(logits, 1, positions.clamp(min=0))  # (batch, seq)
        return values.masked_fill(positions < 0, float("-inf"))

    return at(teacher_start, starts), at(teacher_end, ends)


@dataclass(frozen=True)
class Window:
    """One question/context window of a SQuAD example as a tokenizer cuts it."""

    example: int  # the example's row in the training set
    ids: tuple[int, ...]  # its token ids
    offsets: tuple[tuple[int, int] | None, ...]  # per position: characters in the context, None off it


def squad_windows(examples, tokenizer, max_length: int, doc_stride: int) -> list[Window]:
    """Every window of every example of ``examples`` (SQuAD rows) as ``tokenizer`` cuts them at ``max_length`` with
    ``doc_stride`` (the training features' windows, and those of any example they dropped), in order."""
    numbered = examples.remove_columns("id").add_column("id", [str(i) for i in range(len(examples))])
    features = squad_eval_features(numbered, tokenizer, max_length, doc_stride)
    return [Window(int(e), tuple(ids), tuple(tuple(o) if o is not None else None for o in offsets))
            for e, ids, offsets in zip(features["example_id"], features["input_ids"], features["offset_mapping"])]


def feature_windows(feature_ids: Sequence[Sequence[int]], windows: Sequence[Window]) -> list[int]:
    """Per training feature (its token ids), its index in ``windows``: the features are the windows of the examples
    they kept, in order (an example whose answer is not at its offset has none)."""
    found, w = [], 0
    for ids in feature_ids:
        ids = tuple(ids)
        while w < len(windows) and windows[w].ids != ids:
            w += 1
        if w == len(windows):
            raise RuntimeError("a SQuAD training feature is not one of its examples' windows")
        found.append(w)
        w += 1
    return found


@dataclass(frozen=True)
class SpanMeeting:
    """Per student window: the teacher's feature it meets (-1: none) and, per position, the teacher's positions
    sharing its start and its end character (-1: none)."""

    rows: list[int]
    starts: list[list[int]]
    ends: list[list[int]]

    @classmethod
    def of(cls, student: Sequence[Window], teacher: Sequence[Window]) -> SpanMeeting:
        """The meeting of the ``student``'s training windows with the ``teacher``'s (row j: the teacher's feature j)."""
        by_example: dict[int, list[int]] = {}
        for row, window in enumerate(teacher):
            by_example.setdefault(window.example, []).append(row)
        rows, starts, ends = [], [], []
        for window in student:
            candidates = by_example.get(window.example, [])
            k = best_window(window.offsets, [teacher[j].offsets for j in candidates])
            row = candidates[k] if k >= 0 else -1
            s, e = (boundary_positions(window.offsets, teacher[row].offsets) if row >= 0
                    else ([-1] * len(window.ids), [-1] * len(window.ids)))
            rows.append(row)
            starts.append(s)
            ends.append(e)
        return cls(rows, starts, ends)

    def describe(self, student: Sequence[Window]) -> str:
        """How much of the student's context met the teacher's, for the log."""
        context = sum(sum(o is not None and o[0] < o[1] for o in w.offsets) for w in student)
        met = [sum(p >= 0 for row in column for p in row) for column in (self.starts, self.ends)]
        alone = sum(1 for s, e in zip(self.starts, self.ends) if max(s + e, default=-1) < 0)
        share = [f"{100 * m / max(context, 1):.0f}%" for m in met]
        return (f"{share[0]} of the student's context tokens start where a teacher token starts, {share[1]} end where "
                f"one ends; {alone} of {len(student)} windows meet no teacher boundary (hard loss alone)")


@dataclass
class TeacherRows:
    """The teacher's side of a student that tokenises apart: its own features of the training rows and where the
    two models' outputs meet."""

    tokenizer: object  # the teacher's
    meeting: Meeting
    pad: Callable  # pads a list of the teacher's features into a batch
    features: object = None  # the teacher's own features (datasets.Dataset; row i is the student's cache_index i, or
    #                          for spans the student window's TEACHER_ROW); None when no term reads the teacher's outputs

    @classmethod
    def of(cls, task: Task, tokenizer, features=None) -> TeacherRows:
        """The teacher's side on ``task``: its ``tokenizer``, its ``features`` (None: its outputs are not read)."""
        meeting = MEETINGS.get(task.behaviour.layout, Meeting(""))
        return cls(tokenizer, meeting, collate(tokenizer, task), features)

    @cached_property
    def inputs(self):
        """The teacher's features as its forward reads them (ids, mask, segments)."""
        return self.features.select_columns([c for c in INPUTS if c in self.features.column_names])

    def gold(self):
        """The teacher's features of the gold rows (they come first)."""
        return self.features.select(range(sum(self.features["gold"])))

    def student_features(self, features, student_tokenizer, max_length: int, *, words: Callable[[], list[list[str]]],
                         examples=None, doc_stride: int = 0):
        """The student's ``features`` with what the meeting reads, made as the features were (``max_length``):

        * per word, :data:`POSITIONS` from both tokenizers' ``word_ids`` of ``words()`` (each row's words, in feature
          order);
        * per span boundary, :data:`TEACHER_ROW`, :data:`STARTS` and :data:`ENDS` from both tokenizers' windows over
          ``examples`` (the SQuAD rows the features were made from, with ``doc_stride``)."""
        if self.features is None or self.meeting.where not in ("word", "boundary"):
            return features
        if self.meeting.where == "boundary":
            return self._span_features(features, student_tokenizer, examples, max_length, doc_stride)
        rows = words()
        own = encode_words(student_tokenizer, rows, max_length)
        theirs = encode_words(self.tokenizer, rows, max_length)
        column = [word_positions(own.word_ids(i), theirs.word_ids(i)) for i in range(len(rows))]
        if [len(c) for c in column] != [len(ids) for ids in features["input_ids"]]:  # the features are these words
            raise RuntimeError("the student's features and its word alignment differ in length")
        return features.add_column(POSITIONS, column)

    def _span_features(self, features, student_tokenizer, examples, max_length: int, doc_stride: int):
        """The student's SQuAD windows, each with the teacher's window it meets and the boundaries they share."""
        own = squad_windows(examples, student_tokenizer, max_length, doc_stride)
        theirs = squad_windows(examples, self.tokenizer, max_length, doc_stride)
        student = [own[w] for w in feature_windows(features["input_ids"], own)]
        teacher = [theirs[w] for w in feature_windows(self.features["input_ids"], theirs)]
        meeting = SpanMeeting.of(student, teacher)
        log.info("SQuAD across tokenizers: %s", meeting.describe(student))
        return (features.add_column(TEACHER_ROW, meeting.rows).add_column(STARTS, meeting.starts)
                .add_column(ENDS, meeting.ends))

    def outputs(self, kind: TaskKind, model, cache, batch: dict, *, needs: set[str]) -> tuple[Outputs, torch.Tensor]:
        """The teacher's outputs for the batch's rows (``batch["cache_index"]``, or for spans each window's
        :data:`TEACHER_ROW`), computed on its own tokens (from ``cache``, else a no-grad forward), in the student's
        positions; and the (batch, seq) mask of the positions where they meet (the attention mask per example; for
        spans too, the teacher's logits being -inf where it cannot express a boundary)."""
        meet = {name: batch.pop(name, None) for name in MEETING_COLUMNS}
        index, mask = batch.pop("cache_index"), batch["attention_mask"]
        if "logits" not in needs:  # hard alone reads no teacher output
            return Outputs(), mask
        if meet[TEACHER_ROW] is not None:  # a window that meets none reads row 0: its positions are all -1
            index = meet[TEACHER_ROW].clamp(min=0)
        device = batch["input_ids"].device
        if cache is not None:
            logits = {name: cache.batch_outputs(index.tolist(), name).to(device) for name in kind.outputs}
        else:
            logits = self._forward(kind, model, index, device)
        if meet[STARTS] is not None:  # per span boundary: the teacher's (batch, seq_t) at the student's (batch, seq)
            start, end = span_logits_at(logits["start_logits"], logits["end_logits"], meet[STARTS], meet[ENDS])
            return Outputs(logits={"start_logits": start, "end_logits": end}), mask
        positions = meet[POSITIONS]
        if positions is None:  # per example: (batch, C) or (batch,) as they are
            return Outputs(logits=logits), mask
        # per word: the teacher's (batch, seq_t, C) gathered at each student position's teacher position
        at = positions.clamp(min=0).unsqueeze(-1)  # (batch, seq, 1)
        met = {name: torch.gather(v, 1, at.expand(-1, -1, v.shape[-1])) for name, v in logits.items()}
        return Outputs(logits=met), (positions >= 0) & (mask != 0)

    def _forward(self, kind: TaskKind, model, index: torch.Tensor, device) -> dict[str, torch.Tensor]:
        """The teacher's outputs on its own padded tokens of rows ``index``, no gradient."""
        batch = {k: v.to(device) for k, v in self.pad([self.inputs[int(i)] for i in index]).items()}
        with torch.no_grad():
            out = model(**model_inputs(model, batch))
        return {name: getattr(out, name) for name in kind.outputs}
