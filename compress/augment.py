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
  is reproducible and an example's copies do not depend on the rows around it.

Augmented texts carry no gold label: they are for soft-target (teacher) losses only.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from compress.core.config import option
from compress.core.structure import base_model, mlm_head


@dataclass(frozen=True)
class AugmentConfig:
    copies: int = option(20, "augmented copies per training example (TinyBERT: N = 20)")
    replace_prob: float = option(0.4, "probability that a word of a copy is replaced (TinyBERT: p = 0.4)")
    candidates: int = option(15, "candidate words per word (TinyBERT: K = 15)")
    seed: int = option(0, "seed of the replacements (per example: this seed and the example's texts)")


class Candidates(Protocol):
    def __call__(self, ids: list[int], position: int) -> list[int]:
        """Replacement ids for the token at ``position`` of ``ids`` (a tokenised text with its special tokens)."""


def whole_word_ids(tokenizer) -> list[int]:
    """Vocabulary ids of whole-word pieces: letters only, no ``##`` continuation, not special."""
    special = set(tokenizer.all_special_ids)
    return sorted(i for token, i in tokenizer.get_vocab().items()
                  if i not in special and token.isalpha() and not token.startswith("##"))


class EmbeddingNeighbours:
    """The K nearest whole-word pieces of a token by cosine similarity of input embeddings (the token excluded)."""

    def __init__(self, embeddings: torch.Tensor, allowed: list[int], k: int):
        self.allowed = torch.tensor(allowed, dtype=torch.long)  # (A,)
        table = nn.functional.normalize(embeddings.detach().float(), dim=-1)  # (V, d)
        self.table, self.k, self.cache = table, k, {}

    @classmethod
    def of_model(cls, model: nn.Module, tokenizer, k: int) -> "EmbeddingNeighbours":
        return cls(model.get_input_embeddings().weight, whole_word_ids(tokenizer), k)

    def __call__(self, ids: list[int], position: int) -> list[int]:
        token = ids[position]
        if token not in self.cache:
            sims = self.table[self.allowed] @ self.table[token]  # (A,)
            sims[self.allowed == token] = -float("inf")
            top = sims.topk(min(self.k, len(self.allowed) - 1)).indices
            self.cache[token] = self.allowed[top].tolist()
        return self.cache[token]


class MaskedLMCandidates:
    """The K whole-word pieces a masked-LM ranks highest at the position, with the word masked."""

    def __init__(self, model: nn.Module, tokenizer, k: int):
        self.encoder, self.head = base_model(model).eval(), mlm_head(model).eval()
        self.mask_id, self.k = tokenizer.mask_token_id, k
        self.allowed = torch.tensor(whole_word_ids(tokenizer), dtype=torch.long)

    @torch.no_grad()
    def __call__(self, ids: list[int], position: int) -> list[int]:
        masked = torch.tensor([ids])  # (1, seq)
        masked[0, position] = self.mask_id
        hidden = self.encoder(input_ids=masked, attention_mask=torch.ones_like(masked)).last_hidden_state  # (1, seq, d)
        logits = self.head(hidden[:, position])[0]  # (V,)
        scores = logits[self.allowed]
        scores[self.allowed == ids[position]] = -float("inf")  # the word itself is no replacement
        return self.allowed[scores.topk(min(self.k, len(self.allowed) - 1)).indices].tolist()


def replaceable(tokenizer, text: str) -> tuple[list[int], list[tuple[int, int, int]]]:
    """The text's ids (with special tokens) and its replaceable words as (start, end, token position)."""
    enc = tokenizer(text, return_offsets_mapping=True)
    ids, offsets, words = enc["input_ids"], enc["offset_mapping"], enc.word_ids()
    allowed = set(whole_word_ids(tokenizer))
    spans = []
    for pos, (word, (start, end)) in enumerate(zip(words, offsets)):
        if word is None or ids[pos] not in allowed:
            continue
        if words.count(word) == 1:  # a word of one piece
            spans.append((start, end, pos))
    return ids, spans


def augment_text(tokenizer, text: str, candidates: Candidates, cfg: AugmentConfig, rng: random.Random) -> list[str]:
    """``cfg.copies`` copies of ``text``, each word replaced with probability ``cfg.replace_prob`` (Algorithm 1)."""
    ids, spans = replaceable(tokenizer, text)
    options = {pos: candidates(ids, pos) for _, _, pos in spans}
    vocab = tokenizer.convert_ids_to_tokens
    copies = []
    for _ in range(cfg.copies):
        out, last = [], 0
        for start, end, pos in spans:
            if options[pos] and rng.random() < cfg.replace_prob:
                out += [text[last:start], vocab(rng.choice(options[pos]))]
                last = end
        copies.append("".join(out) + text[last:])
    return copies


def augment_examples(tokenizer, rows: list[dict], fields: tuple[str, ...], candidates: Candidates,
                     cfg: AugmentConfig) -> list[dict]:
    """Augmented copies of ``rows`` (dicts of text ``fields``), every field of a pair replaced independently.

    The copies carry the texts and ``source`` (the index of the row they came from), never a label.
    """
    out = []
    for index, row in enumerate(rows):
        # str seeds are hashed (SHA-512) the same in every process: reproducible, order-independent.
        rng = random.Random("\x00".join([str(cfg.seed), *(row.get(f) or "" for f in fields)]))
        per_field = {f: augment_text(tokenizer, row[f], candidates, cfg, rng) for f in fields if row.get(f)}
        for copy in range(cfg.copies):
            out.append({**{f: texts[copy] for f, texts in per_field.items()}, "source": index})
    return out
