"""A student with a tokenizer of its own: each model tokenises the text itself; their outputs meet per example or word.

A student from ``--init DIR`` (or ``--init-from DIR``) whose tokenizer is not its teacher's (another vocabulary, or
the same one tokenising otherwise: a MiniLM student with BERT's WordPiece under an MPNet teacher) trains on its own
tokenisation of every training row, is evaluated with it and is saved with it. The teacher reads its own tokenisation
of the same rows (row i of both is ``cache_index`` i), so its cache is keyed on its own token ids, as in any run of that
teacher on that data (:mod:`compress.distill.teacher_cache`): students of any tokenizer share it. Where the two
meet is decided by the task kind's ``layout`` (:data:`MEETINGS`):

* ``sentences`` (a label, a label set, a score): per example, the logits as they are;
* ``words`` (a tag per word): per word, the teacher's logits at each word's first piece against the student's at its
  own first piece of that word (``word_ids`` of each tokenizer); the other positions leave the kd term;
* ``squad`` (answer spans): nowhere. Start/end logits score each tokenizer's own windows over the context, and
  mapping the teacher's distributions onto the student's tokens through character offsets is not done here, so
  ``kd`` is refused; ``hard`` trains on the student's own windows.

The terms that compare hidden states or attention maps position by position (hidden, embedding, attention, cosine,
minilm) need the same tokens on both sides: they are refused before the student is loaded (:func:`check_terms`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable

import torch

from compress.core.data.features import collate
from compress.core.data.tasks import Task, TaskKind
from compress.core.data.token_data import encode_words, first_pieces
from compress.core.errors import CompressError
from compress.core.model.structure import model_inputs
from compress.distill.terms import INTERMEDIATE_TERMS, Outputs

POSITIONS = "teacher_positions"  # a student feature (words): per position, the teacher's position it meets, or -1
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

    where: str  # "example", "word", or "" (nowhere: kd is refused)
    why_not: str = ""  # when nowhere: why, for the refusal


# Keyed by TaskKind.layout (the task kind decides, in compress.core.data.tasks, how its examples are laid out).
MEETINGS: dict[str, Meeting] = {
    "sentences": Meeting("example"),
    "words": Meeting("word"),
    "squad": Meeting("", "the start/end logits score each tokenizer's own windows over the context, and the teacher's "
                         "are not mapped onto the student's tokens"),
}


def check_terms(task: Task, terms: tuple[str, ...]) -> None:
    """Refuse, in one line, the terms that cannot meet across tokenizers: the intermediate ones (tokens and the
    states at them do not line up), and kd where the task's outputs meet nowhere (:data:`MEETINGS`)."""
    inner = [t for t in terms if t in INTERMEDIATE_TERMS]
    if inner:
        raise CompressError(
            f"--losses {','.join(inner)}: the student has a tokenizer of its own (not the teacher's), so the two models' "
            "tokens, and the hidden states and attention maps at them, do not line up; use --losses kd,hard, or a "
            "student that shares the teacher's tokenizer")
    meeting = MEETINGS[task.behaviour.layout]
    if "kd" in terms and not meeting.where:
        raise CompressError(
            f"--losses kd cannot cross tokenizers on {task.display}: {meeting.why_not}; use --losses hard, or a student "
            "that shares the teacher's tokenizer")


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


@dataclass
class TeacherRows:
    """The teacher's side of a student that tokenises apart: its own features of the training rows and where the
    two models' outputs meet."""

    tokenizer: object  # the teacher's
    meeting: Meeting
    pad: Callable  # pads a list of the teacher's features into a batch
    features: object = None  # the teacher's own features (datasets.Dataset; row i is the student's cache_index i);
    #                          None when no term reads the teacher's outputs (hard alone)

    @classmethod
    def of(cls, task: Task, tokenizer, features=None) -> TeacherRows:
        """The teacher's side on ``task``: its ``tokenizer``, its ``features`` (None: its outputs are not read)."""
        return cls(tokenizer, MEETINGS[task.behaviour.layout], collate(tokenizer, task), features)

    @cached_property
    def inputs(self):
        """The teacher's features as its forward reads them (ids, mask, segments)."""
        return self.features.select_columns([c for c in INPUTS if c in self.features.column_names])

    def student_features(self, features, words: Callable[[], list[list[str]]], student_tokenizer, max_length: int):
        """The student's ``features`` with what the meeting reads: per word, :data:`POSITIONS` from both tokenizers'
        ``word_ids`` of ``words()`` (each row's words, in feature order, at ``max_length`` as the features were cut)."""
        if self.features is None or self.meeting.where != "word":
            return features
        rows = words()
        own = encode_words(student_tokenizer, rows, max_length)
        theirs = encode_words(self.tokenizer, rows, max_length)
        column = [word_positions(own.word_ids(i), theirs.word_ids(i)) for i in range(len(rows))]
        if [len(c) for c in column] != [len(ids) for ids in features["input_ids"]]:  # the features are these words
            raise RuntimeError("the student's features and its word alignment differ in length")
        return features.add_column(POSITIONS, column)

    def outputs(self, kind: TaskKind, model, cache, batch: dict, *, needs: set[str]) -> tuple[Outputs, torch.Tensor]:
        """The teacher's outputs for the batch's rows (``batch["cache_index"]``), computed on its own tokens (from
        ``cache``, else a no-grad forward), in the student's positions; and the (batch, seq) mask of the positions
        where they meet (the attention mask per example)."""
        index, positions = batch.pop("cache_index"), batch.pop(POSITIONS, None)
        mask = batch["attention_mask"]
        if "logits" not in needs:  # hard alone reads no teacher output
            return Outputs(), mask
        device = batch["input_ids"].device
        if cache is not None:
            logits = {name: cache.batch_outputs(index.tolist(), name).to(device) for name in kind.outputs}
        else:
            logits = self._forward(kind, model, index, device)
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
