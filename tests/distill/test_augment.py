"""TinyBERT-style augmentation: candidates by hand, special tokens untouched, length kept, reproducible."""

from __future__ import annotations

import random
import threading
import time

import pytest
import torch

from compress.distill.augment import (
    AugmentConfig,
    EmbeddingNeighbours,
    MaskedLMCandidates,
    augment_examples,
    augment_text,
    augmented_rows,
    sentence_pairs,
    transfer_rows,
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
    assert neighbours([9, 0, 9], [1]) == {1: [1, 2, 3]}  # never the token itself, most similar first
    only_some = EmbeddingNeighbours(table, allowed=[0, 2, 4], k=5)
    assert only_some([0], [0]) == {0: [2, 4]}  # restricted to the allowed ids, at most all of them


def test_masked_lm_candidates_are_the_models_top_k_at_the_masked_position(tok):
    model = make_tiny_model("masked-lm", seed=3)
    source = MaskedLMCandidates(model, tok, k=4)
    ids = tok(TEXT)["input_ids"]
    positions = [ids.index(tok.convert_tokens_to_ids(w)) for w in ("movie", "actor", "good")]
    got = source(ids, positions)  # all positions in one batched forward
    for position in positions:
        masked = torch.tensor([ids])
        masked[0, position] = tok.mask_token_id
        with torch.no_grad():
            logits = model(input_ids=masked).logits[0, position]  # (V,) one text, one mask, at a time
        allowed = [i for i in whole_word_ids(tok) if i != ids[position]]
        expected = sorted(allowed, key=lambda i: -float(logits[i]))[:4]
        assert got[position] == expected


def test_copies_keep_special_tokens_and_length_and_are_reproducible(tok):
    model = make_tiny_model("base", seed=0)
    neighbours = EmbeddingNeighbours.of_model(model, tok, k=5)
    text = "[CLS] the movie was great [SEP] and the plot , very good ."  # literal special tokens stay
    copies = augment_text(tok, text, neighbours, copies=8, prob=0.5, rng=random.Random(1))
    again = augment_text(tok, text, neighbours, copies=8, prob=0.5, rng=random.Random(1))
    other = augment_text(tok, text, neighbours, copies=8, prob=0.5, rng=random.Random(2))
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
    assert augment_text(tok, TEXT, neighbours, copies=3, prob=0.0, rng=random.Random(0)) == [TEXT] * 3
    (changed,) = augment_text(tok, TEXT, neighbours, copies=1, prob=1.0, rng=random.Random(0))
    before, after = TEXT.split(), changed.split()
    for old, new in zip(before, after):
        if old.isalpha():  # every word replaced, by one of its candidates
            ids = tok(TEXT)["input_ids"]
            position = ids.index(tok.convert_tokens_to_ids(old))
            assert new != old and tok.convert_tokens_to_ids(new) in neighbours(ids, [position])[position]
        else:
            assert new == old


def test_augmented_examples_carry_texts_and_source_but_no_label(tok):
    neighbours = EmbeddingNeighbours.of_model(make_tiny_model("base"), tok, k=3)
    rows = [{"sentence1": "the dog sat on the mat .", "sentence2": "a cat sat .", "label": 1},
            {"sentence1": "paris is the capital of france .", "sentence2": "yes .", "label": 0}]
    out = augment_examples(tok, rows, ("sentence1", "sentence2"), neighbours, copies=4, prob=0.4, seed=3)
    assert len(out) == 8 and all(set(r) == {"sentence1", "sentence2", "source"} for r in out)
    assert [r["source"] for r in out] == [0] * 4 + [1] * 4
    # Per-example seeding: an example's copies do not depend on the rows before it.
    alone = augment_examples(tok, rows[1:], ("sentence1", "sentence2"), neighbours, copies=4, prob=0.4, seed=3)
    assert [r["sentence1"] for r in alone] == [r["sentence1"] for r in out[4:]] and all(r["source"] == 0 for r in alone)
    assert augment_examples(tok, rows, ("sentence1", "sentence2"), neighbours, copies=4, prob=0.4, seed=4) != out


def test_default_copies_follow_the_measured_rule(monkeypatch):
    monkeypatch.setattr("compress.distill.config.AUTO_MAX_EXAMPLES", 10_000)
    auto = AugmentConfig()
    assert auto.copies(4000, spans=False, soft_targets=True) == 4
    assert auto.copies(10_000, spans=False, soft_targets=True) == 4 and auto.copies(10_001, spans=False, soft_targets=True) == 0
    assert auto.copies(100, spans=True, soft_targets=True) == 0  # SQuAD: answers are spans, copies would move them
    assert auto.copies(100, spans=False, soft_targets=False) == 0  # hard labels only: nothing would label the copies
    assert AugmentConfig(augment=2).copies(10**6, spans=False, soft_targets=True) == 2  # asked for: always
    assert AugmentConfig(augment=0).copies(10, spans=False, soft_targets=True) == 0
    assert not auto.active and AugmentConfig(augment=2).active  # the default never trips the refusals of an explicit --augment


def test_augmented_set_is_cached_under_a_key_of_model_texts_and_settings(tok, tmp_path):
    model = make_tiny_model("base")
    built = []

    def make():
        built.append(1)
        return EmbeddingNeighbours.of_model(model, tok, k=3)

    rows = [{"sentence": "the movie was great ."}, {"sentence": "the actor was very good ."}]
    cfg = AugmentConfig(augment=3)
    first, info = augmented_rows(tok, rows, ("sentence",), make, source_hash="m1", cfg=cfg, seed=0, cache_dir=tmp_path)
    again, info2 = augmented_rows(tok, rows, ("sentence",), make, source_hash="m1", cfg=cfg, seed=0, cache_dir=tmp_path)
    assert first == again and len(first) == 6 and built == [1]  # the second call read the file, built nothing
    assert (info["hit"], info2["hit"]) == (False, True) and info["method"] == info2["method"] == "embedding-neighbours"
    for changed in ({"source_hash": "m2"}, {"seed": 1}, {"cfg": AugmentConfig(augment=3, augment_prob=0.5)}):
        _, miss = augmented_rows(tok, rows, ("sentence",), make, **{"source_hash": "m1", "cfg": cfg, "seed": 0, **changed},
                                 cache_dir=tmp_path)
        assert miss["hit"] is False
    _, miss = augmented_rows(tok, rows[:1], ("sentence",), make, source_hash="m1", cfg=cfg, seed=0, cache_dir=tmp_path)
    assert miss["hit"] is False


def test_transfer_rows_take_the_tasks_format_and_are_seeded():
    docs = [["one a .", "one b .", "one c ."], ["two a .", "two b ."], ["one a ."]]
    single = transfer_rows(docs, ("sentence",), 10, seed=0)
    assert sorted(r["sentence"] for r in single) == ["one a .", "one b .", "one c .", "two a .", "two b ."]  # distinct
    assert transfer_rows(docs, ("sentence",), 2, seed=0) == single[:2] and len(transfer_rows(docs, ("sentence",), 2, 1)) == 2
    pairs = transfer_rows(docs, ("sentence1", "sentence2"), 10, seed=0)
    consecutive = {("one a .", "one b ."), ("one b .", "one c ."), ("two a .", "two b .")}
    assert len(pairs) == 3 and {r["sentence1"] for r in pairs} == {a for a, _ in consecutive}
    assert all(set(r) == {"sentence1", "sentence2"} for r in pairs)
    assert pairs == transfer_rows(docs, ("sentence1", "sentence2"), 10, seed=0)
    given = transfer_rows(docs, ("question1", "question2"), 2, seed=0, pairs=[("q1", "q2"), ("q3", "q4")])
    assert sorted((r["question1"], r["question2"]) for r in given) == [("q1", "q2"), ("q3", "q4")]  # ready pairs first


def test_sentence_pairs_mix_next_and_random_second_sentences():
    docs = [[f"d{d} s{i} ." for i in range(40)] for d in range(5)]
    pairs = sentence_pairs(docs, 150, random.Random(0))
    nxt = sum(b == f"{a.rsplit(' ', 2)[0]} s{int(a.split()[1][1:]) + 1} ." for a, b in pairs)
    assert len(pairs) == 150 and 50 <= nxt <= 100  # about half keep their next sentence


def test_runs_started_together_build_the_augmented_set_once(tok, tmp_path):
    model = make_tiny_model("base")
    built, go = [], threading.Barrier(2)

    def make():  # slow enough that the second run arrives while the first builds
        built.append(1)
        time.sleep(0.5)
        return EmbeddingNeighbours.of_model(model, tok, k=3)

    rows = [{"sentence": "the movie was great ."}, {"sentence": "the actor was very good ."}]
    got = []

    def run():
        go.wait()
        got.append(augmented_rows(tok, rows, ("sentence",), make, source_hash="m1", cfg=AugmentConfig(augment=2),
                                  seed=0, cache_dir=tmp_path))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert built == [1]  # the second run waited and read what the first wrote
    assert got[0][0] == got[1][0] and sorted(info["hit"] for _, info in got) == [False, True]
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".lock")] == []  # the lock file went with its build
