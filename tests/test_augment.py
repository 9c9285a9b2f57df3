"""TinyBERT-style augmentation: candidates by hand, special tokens untouched, length kept, reproducible."""

from __future__ import annotations

import random

import pytest
import torch

from compress.augment import (
    AugmentConfig,
    EmbeddingNeighbours,
    MaskedLMCandidates,
    augment_examples,
    augment_text,
    whole_word_ids,
)
from tests.conftest import make_tiny_model, make_tokenizer

TEXT = "the movie was great , and the actor was very good ."


@pytest.fixture
def tok(tmp_path):
    return make_tokenizer(tmp_path / "tok")


def test_whole_word_pieces_exclude_special_tokens_continuations_and_punctuation(tok):
    tokens = set(tok.convert_ids_to_tokens(whole_word_ids(tok)))
    assert {"movie", "good", "paris"} <= tokens
    assert not tokens & {"[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]", "##s", ".", ",", "1"}


def test_embedding_neighbours_are_the_hand_computed_nearest_by_cosine():
    # Five tokens in 2-D: token 0 points along x; cosines to it: 1 (itself), 0.8, 0.6, 0, -1.
    table = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.6, 0.8], [0.0, 2.0], [-3.0, 0.0]])
    neighbours = EmbeddingNeighbours(table, allowed=[0, 1, 2, 3, 4], k=3)
    assert neighbours([9, 0, 9], 1) == [1, 2, 3]  # never the token itself, most similar first
    only_some = EmbeddingNeighbours(table, allowed=[0, 2, 4], k=5)
    assert only_some([0], 0) == [2, 4]  # restricted to the allowed ids, at most all of them


def test_masked_lm_candidates_are_the_models_top_k_at_the_masked_position(tok):
    model = make_tiny_model("masked-lm", seed=3)
    source = MaskedLMCandidates(model, tok, k=4)
    ids = tok(TEXT)["input_ids"]
    position = ids.index(tok.convert_tokens_to_ids("movie"))
    masked = torch.tensor([ids])
    masked[0, position] = tok.mask_token_id
    with torch.no_grad():
        logits = model(input_ids=masked).logits[0, position]  # (V,)
    allowed = [i for i in whole_word_ids(tok) if i != ids[position]]
    expected = sorted(allowed, key=lambda i: -float(logits[i]))[:4]
    assert source(ids, position) == expected


def test_copies_keep_special_tokens_and_length_and_are_reproducible(tok):
    model = make_tiny_model("base", seed=0)
    neighbours = EmbeddingNeighbours.of_model(model, tok, k=5)
    text = "[CLS] the movie was great [SEP] and the plot , very good ."  # literal special tokens stay
    cfg = AugmentConfig(copies=8, replace_prob=0.5, seed=1)
    copies = augment_text(tok, text, neighbours, cfg, random.Random(1))
    again = augment_text(tok, text, neighbours, cfg, random.Random(1))
    other = augment_text(tok, text, neighbours, cfg, random.Random(2))
    assert copies == again and copies != other and len(copies) == 8
    length = len(tok(text)["input_ids"])
    for copy in copies:
        assert len(tok(copy)["input_ids"]) == length  # one piece for one piece
        assert copy.count("[CLS]") == 1 and copy.count("[SEP]") == 1 and "[MASK]" not in copy
        kept = [(a, b) for a, b in zip(text.split(), copy.split()) if not a.isalpha()]
        assert all(a == b for a, b in kept) and len(copy.split()) == len(text.split())  # punctuation never replaced
    assert any(c != text for c in copies)


def test_replace_probability_zero_and_one(tok):
    neighbours = EmbeddingNeighbours.of_model(make_tiny_model("base"), tok, k=3)
    assert augment_text(tok, TEXT, neighbours, AugmentConfig(copies=3, replace_prob=0.0), random.Random(0)) == [TEXT] * 3
    (changed,) = augment_text(tok, TEXT, neighbours, AugmentConfig(copies=1, replace_prob=1.0), random.Random(0))
    before, after = TEXT.split(), changed.split()
    for old, new in zip(before, after):
        if old.isalpha():  # every word replaced, by one of its candidates
            ids = tok(TEXT)["input_ids"]
            assert new != old and tok.convert_tokens_to_ids(new) in neighbours(ids, ids.index(tok.convert_tokens_to_ids(old)))
        else:
            assert new == old


def test_augmented_examples_carry_texts_and_source_but_no_label(tok):
    neighbours = EmbeddingNeighbours.of_model(make_tiny_model("base"), tok, k=3)
    rows = [{"sentence1": "the dog sat on the mat .", "sentence2": "a cat sat .", "label": 1},
            {"sentence1": "paris is the capital of france .", "sentence2": "yes .", "label": 0}]
    cfg = AugmentConfig(copies=4, seed=3)
    out = augment_examples(tok, rows, ("sentence1", "sentence2"), neighbours, cfg)
    assert len(out) == 8 and all(set(r) == {"sentence1", "sentence2", "source"} for r in out)
    assert [r["source"] for r in out] == [0] * 4 + [1] * 4
    # Per-example seeding: an example's copies do not depend on the rows before it.
    alone = augment_examples(tok, rows[1:], ("sentence1", "sentence2"), neighbours, cfg)
    assert [r["sentence1"] for r in alone] == [r["sentence1"] for r in out[4:]] and all(r["source"] == 0 for r in alone)
    assert augment_examples(tok, rows, ("sentence1", "sentence2"), neighbours, AugmentConfig(copies=4, seed=4)) != out
