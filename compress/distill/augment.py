"""TinyBERT-style data augmentation: copies of each training text with words replaced by plausible ones.

Jiao et al., "TinyBERT: Distilling BERT for Natural Language Understanding" (2020),
Section 3.3, Algorithm 1: for every word of a text, a candidate set of ``K`` words is
built (by a masked-LM's predictions at the word's position, or by nearest neighbours in
an embedding space); then ``N`` copies are made in which each word is replaced, with
probability ``p``, by a random candidate. The paper uses N=20, p=0.4, K=15 with BERT's
MLM for single-piece words and GloVe neighbours for the others.

Here:

* a word is what the tokenizer's pre-tokenizer calls a word; only words that are one
  whole-word vocabulary piece (no ``##`` continuation, letters only) are replaced, and only
  by such pieces, so a copy has exactly as many tokens as its original (the length budget
  holds) and special tokens ([CLS], [SEP], [MASK], ...) are never produced or touched;
* candidates come from :class:`MaskedLMCandidates` (the word masked, the model's top-K
  whole-word predictions) when a masked-LM is at hand, else from
  :class:`EmbeddingNeighbours` (the K nearest whole-word pieces by cosine similarity in
  the model's input embedding matrix);
* copies are seeded per example (``seed`` and the example's texts), so the augmented set
  is reproducible and an example's copies do not depend on the rows around it; the set is
  cached on disk under a key of the candidate model, vocabulary, texts and settings
  (:func:`augmented_rows`), so a second run of the same recipe does not rebuild it (nor
  one started at the same time: it waits for the first's set).

:func:`transfer_rows` adds unlabelled text of another source (a corpus, a ``datasets``
corpus, another GLUE task's training texts) in the task's format: single sentences, or
pairs for a pair task (consecutive sentences of a document, half of them with a random
second sentence instead).

Augmented and transfer texts carry no gold label: they are for soft-target (teacher)
losses only; distillation marks them and its hard-label term skips them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from compress.core.formats.writes import atomic_path, build_lock
from compress.core.logs import progress
from compress.core.model.structure import base_model, mlm_head
# The options and the default number of copies live apart, with the stage's other options (no torch there).
from compress.distill.config import AUTO_COPIES, AUTO_MAX_EXAMPLES, AugmentConfig  # noqa: F401

log = logging.getLogger(__name__)


class Candidates(Protocol):
    def __call__(self, ids: list[int], positions: list[int]) -> dict[int, list[int]]:
        """Replacement ids for the tokens at ``positions`` of ``ids`` (a tokenised text with its special tokens)."""


def whole_word_ids(tokenizer) -> list[int]:
    """Vocabulary ids of whole-word pieces: letters only, no ``##`` continuation, not special."""
    special = set(tokenizer.all_special_ids)
    return sorted(i for token, i in tokenizer.get_vocab().items()
                  if i not in special and token.isalpha() and not token.startswith("##"))


class EmbeddingNeighbours:
    """The K nearest whole-word pieces of a token by cosine similarity of input embeddings (the token excluded)."""

    name = "embedding-neighbours"

    def __init__(self, embeddings: torch.Tensor, allowed: list[int], k: int):
        self.allowed = torch.tensor(allowed, dtype=torch.long)  # (A,)
        table = nn.functional.normalize(embeddings.detach().float(), dim=-1)  # (V, d)
        self.table, self.k, self.cache = table, k, {}
        self.allowed_table = table[self.allowed]  # (A, d)

    @classmethod
    def of_model(cls, model: nn.Module, tokenizer, k: int) -> "EmbeddingNeighbours":
        return cls(model.get_input_embeddings().weight, whole_word_ids(tokenizer), k)

    def __call__(self, ids: list[int], positions: list[int]) -> dict[int, list[int]]:
        return {pos: self.of_token(ids[pos]) for pos in positions}

    def of_token(self, token: int) -> list[int]:
        if token not in self.cache:
            sims = self.allowed_table @ self.table[token]  # (A,)
            sims[self.allowed == token] = -float("inf")
            top = sims.topk(min(self.k, len(self.allowed) - 1)).indices
            self.cache[token] = self.allowed[top].tolist()
        return self.cache[token]


class MaskedLMCandidates:
    """The K whole-word pieces a masked-LM ranks highest at each position, with that word masked."""

    name = "masked-lm"

    def __init__(self, model: nn.Module, tokenizer, k: int):
        self.encoder, self.head = base_model(model).eval(), mlm_head(model).eval()
        self.mask_id, self.k = tokenizer.mask_token_id, k
        self.allowed = torch.tensor(whole_word_ids(tokenizer), dtype=torch.long)
        self.device = next(model.parameters()).device

    @torch.no_grad()
    def __call__(self, ids: list[int], positions: list[int]) -> dict[int, list[int]]:
        if not positions:
            return {}
        # One copy of the text per position, that position masked: one forward for the whole text.
        masked = torch.tensor([ids] * len(positions), device=self.device)  # (P, seq)
        rows = torch.arange(len(positions), device=self.device)
        cols = torch.tensor(positions, device=self.device)
        masked[rows, cols] = self.mask_id
        hidden = self.encoder(input_ids=masked, attention_mask=torch.ones_like(masked)).last_hidden_state  # (P, seq, d)
        logits = self.head(hidden[rows, cols]).float().cpu()  # (P, V)
        scores = logits[:, self.allowed]  # (P, A)
        own = torch.tensor([ids[p] for p in positions])  # the word itself is no replacement
        scores[self.allowed[None, :] == own[:, None]] = -float("inf")
        top = scores.topk(min(self.k, len(self.allowed) - 1), dim=-1).indices  # (P, K)
        return {pos: self.allowed[top[i]].tolist() for i, pos in enumerate(positions)}


def replaceable(tokenizer, text: str, allowed: set[int] | None = None) -> tuple[list[int], list[tuple[int, int, int]]]:
    """The text's ids (with special tokens) and its replaceable words as (start, end, token position)."""
    enc = tokenizer(text, return_offsets_mapping=True)
    ids, offsets, words = enc["input_ids"], enc["offset_mapping"], enc.word_ids()
    allowed = allowed if allowed is not None else set(whole_word_ids(tokenizer))
    spans = []
    for pos, (word, (start, end)) in enumerate(zip(words, offsets)):
        if word is None or ids[pos] not in allowed:
            continue
        if words.count(word) == 1:  # a word of one piece
            spans.append((start, end, pos))
    return ids, spans


def augment_text(tokenizer, text: str, candidates: Candidates, *, copies: int, prob: float, rng: random.Random,
                 allowed: set[int] | None = None) -> list[str]:
    """``copies`` copies of ``text``, each one-piece word replaced with probability ``prob`` (Algorithm 1)."""
    ids, spans = replaceable(tokenizer, text, allowed)
    options = candidates(ids, [pos for _, _, pos in spans])
    vocab = tokenizer.convert_ids_to_tokens
    out_copies = []
    for _ in range(copies):
        out, last = [], 0
        for start, end, pos in spans:
            if options[pos] and rng.random() < prob:
                out += [text[last:start], vocab(rng.choice(options[pos]))]
                last = end
        out_copies.append("".join(out) + text[last:])
    return out_copies


def augment_examples(tokenizer, rows: list[dict], fields: tuple[str, ...], candidates: Candidates, *, copies: int,
                     prob: float, seed: int) -> list[dict]:
    """``copies`` augmented copies of each of ``rows`` (dicts of text ``fields``); each field of a pair replaced independently.

    The copies carry the texts and ``source`` (the index of the row they came from), never a label.
    """
    allowed = set(whole_word_ids(tokenizer))
    out = []
    for index, row in enumerate(progress(rows, desc="augmenting", unit="example", leave=False)):
        # str seeds are hashed (SHA-512) the same in every process: reproducible, order-independent.
        rng = random.Random("\x00".join([str(seed), *(row.get(f) or "" for f in fields)]))
        per_field = {f: augment_text(tokenizer, row[f], candidates, copies=copies, prob=prob, rng=rng,
                                    allowed=allowed) for f in fields if row.get(f)}
        for copy in range(copies):
            out.append({**{f: texts[copy] for f, texts in per_field.items()}, "source": index})
    return out


def augmented_rows(tokenizer, rows: list[dict], fields: tuple[str, ...], make_candidates, *, source_hash: str,
                   cfg: AugmentConfig, seed: int, cache_dir: Path) -> tuple[list[dict], dict]:
    """:func:`augment_examples`, read from ``cache_dir`` when this exact set was made before.

    ``make_candidates()`` builds the candidate source only on a miss; ``source_hash``
    names it (the candidate model's weights and the method). Returns the rows and what
    to record: the method's name, the cache file, whether it was a hit.
    """
    digest = hashlib.sha256()
    vocab = sorted(tokenizer.get_vocab().items())
    for part in (source_hash, json.dumps(vocab), json.dumps([cfg.augment, cfg.augment_prob, cfg.augment_candidates, seed]),
                 json.dumps(list(fields)), json.dumps([[r.get(f) for f in fields] for r in rows])):
        digest.update(part.encode())
        digest.update(b"|")
    path = Path(cache_dir) / f"{digest.hexdigest()[:24]}.jsonl"
    if path.is_file():
        return _read_augmented(path)
    with build_lock(path, "the augmented set"):  # runs started together build it once
        if path.is_file():  # made while this process waited
            return _read_augmented(path)
        candidates = make_candidates()
        out = augment_examples(tokenizer, rows, fields, candidates, copies=cfg.augment, prob=cfg.augment_prob, seed=seed)
        with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
            fh.write(json.dumps({"method": candidates.name, "n": len(out)}) + "\n")
            fh.writelines(json.dumps(r) + "\n" for r in out)
    return out, {"method": candidates.name, "path": str(path), "hit": False, "rows": len(out)}


def _read_augmented(path: Path) -> tuple[list[dict], dict]:
    """A cached augmented set (a header line, then one row a line) and its record."""
    with open(path, encoding="utf-8") as fh:
        meta = json.loads(fh.readline())
        out = [json.loads(line) for line in fh]
    return out, {"method": meta["method"], "path": str(path), "hit": True, "rows": len(out)}


def sentence_pairs(sentences: list[list[str]], n: int, rng: random.Random) -> list[tuple[str, str]]:
    """Up to ``n`` pairs in a pair task's format: consecutive sentences of a document, half with a random second one.

    ``sentences`` is a list of documents (lists of sentences). Like next-sentence
    prediction's instances, a pair is either related (the next sentence) or not.
    """
    flat = [s for doc in sentences for s in doc]
    pairs = [(a, b) for doc in sentences for a, b in zip(doc, doc[1:])]
    rng.shuffle(pairs)
    pairs = pairs[:n]
    return [(a, rng.choice(flat)) if rng.random() < 0.5 else (a, b) for a, b in pairs]


def transfer_rows(documents: list[list[str]], fields: tuple[str, ...], n: int, seed: int,
                  pairs: list[tuple[str, str]] | None = None) -> list[dict]:
    """Up to ``n`` unlabelled rows in the task's format from ``documents`` (and ready-made ``pairs`` for a pair task).

    A single-sentence task gets distinct sentences; a pair task gets ``pairs`` first,
    then :func:`sentence_pairs` of the documents. Seeded: the same inputs give the same rows.
    """
    rng = random.Random(seed)
    if len(fields) == 1:
        seen = list(dict.fromkeys(" ".join(s.split()) for doc in documents for s in doc if s.strip()))
        rng.shuffle(seen)
        return [{fields[0]: s} for s in seen[:n]]
    made = list(pairs or [])
    rng.shuffle(made)
    if len(made) < n:
        made += sentence_pairs(documents, n - len(made), rng)
    return [{fields[0]: a, fields[1]: b} for a, b in made[:n]]
