"""Token classification: words to word pieces and back.

A sentence arrives as words with one BIO tag each. The model sees word pieces: the tag
goes on the first piece of each word and every other position (the word's later
pieces, [CLS], [SEP], padding) gets ``IGNORED`` (-100), which cross-entropy skips, as
in BERT's CoNLL-2003 set-up (Devlin et al. 2019, section 5.3). Back from the model, a
word's prediction is the one at its first piece. A word the tokenizer turns into no piece
at all, or that falls past ``max_length``, has no prediction: it is predicted ``O`` and
counted in the log, so the entity scores still count its gold entity as missed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from compress.core.errors import CompressError
from compress.core.data.tasks import IGNORED

log = logging.getLogger(__name__)


def check_fast(tokenizer) -> None:
    """Word alignment needs a fast (Rust) tokenizer's ``word_ids``."""
    if not getattr(tokenizer, "is_fast", False):
        raise CompressError(
            "token classification aligns tags to word pieces with a fast tokenizer (tokenizer.json); this model's "
            "tokenizer is a slow one: save it again with transformers' AutoTokenizer(use_fast=True)"
        )


def encode_words(tokenizer, words: list[list[str]], max_length: int, **kwargs):
    """Tokenise sentences given as words (``is_split_into_words``), cut to ``max_length`` pieces."""
    check_fast(tokenizer)
    return tokenizer(words, is_split_into_words=True, truncation=True, max_length=max_length, **kwargs)


def first_pieces(word_ids: list[int | None]) -> dict[int, int]:
    """Word index -> the position of its first piece, from a tokenised sentence's ``word_ids``."""
    first: dict[int, int] = {}
    for position, word in enumerate(word_ids):
        if word is not None and word not in first:
            first[word] = position
    return first


def align_tags(word_ids: list[int | None], tags: list[int]) -> list[int]:
    """One target per position: the word's tag on its first piece, IGNORED elsewhere."""
    first = first_pieces(word_ids)
    targets = [IGNORED] * len(word_ids)
    for word, position in first.items():
        targets[position] = tags[word]
    return targets


@dataclass
class Lost:
    """Words without a prediction after tokenisation, counted for the log."""

    truncated_sentences: int = 0  # sentences cut at max_length
    truncated_words: int = 0  # words past the cut
    empty_words: int = 0  # words the tokenizer turned into no piece (a control character, say)

    def add(self, n_words: int, first: dict[int, int]) -> None:
        last = max(first) if first else -1
        past = n_words - 1 - last  # words after the last one that kept a piece
        if past > 0:
            self.truncated_sentences += 1
            self.truncated_words += past
        self.empty_words += sum(1 for w in range(last + 1) if w not in first)

    def report(self, what: str, n_sentences: int, max_length: int) -> None:
        if self.truncated_sentences:
            log.warning("%s: %d of %d sentences are longer than --max-length %d word pieces and were truncated: "
                        "%d words lost their tags (predicted O); raise --max-length to keep them",
                        what, self.truncated_sentences, n_sentences, max_length, self.truncated_words)
        if self.empty_words:
            log.warning("%s: %d words became no word piece in this tokenizer and carry no prediction (predicted O)",
                        what, self.empty_words)


def token_features(ds, tokenizer, max_length: int, what: str = "training"):
    """Training features: input ids, segments, mask and ``labels`` (one per piece, IGNORED off first pieces)."""
    lost = Lost()

    def encode(batch):
        enc = encode_words(tokenizer, [list(w) for w in batch["tokens"]], max_length)
        enc["labels"] = []
        for i, tags in enumerate(batch["label"]):
            word_ids = enc.word_ids(i)
            lost.add(len(tags), first_pieces(word_ids))
            enc["labels"].append(align_tags(word_ids, list(tags)))
        return enc

    features = ds.map(encode, batched=True, remove_columns=ds.column_names, desc=f"tokenising words ({what})")
    lost.report(what, len(ds), max_length)
    return features


def word_predictions(logits: list[np.ndarray], word_ids: list[list[int | None]], n_words: list[int]) -> list[list[int]]:
    """Per sentence, one label index per word: the argmax at the word's first piece; -1 where a word has none.

    ``logits[i]``: (pieces, labels) for sentence i, already in the task's label order.
    """
    out = []
    for rows, ids, n in zip(logits, word_ids, n_words):
        first = first_pieces(ids)
        out.append([int(np.argmax(rows[first[w]])) if w in first and first[w] < len(rows) else -1 for w in range(n)])
    return out
