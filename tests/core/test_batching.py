"""Batches cut by length: the split against costs worked out by hand."""

from __future__ import annotations

import itertools

import numpy as np

from compress.core.data.batching import longest_first, padded_positions, split_by_length


def _cost(lengths, pieces, call_tokens):
    return sum(call_tokens + len(p) * max(lengths[i] for i in p) for p in pieces)


def test_the_split_is_the_cheapest_by_hand():
    lengths = [10, 2, 9, 3]
    # Sorted: 10 (row 0), 9 (row 2), 3 (row 3), 2 (row 1). With a call at 5 positions:
    # one batch 5 + 4 x 10 = 45; [10, 9] + [3, 2] = (5 + 20) + (5 + 6) = 36; [10], [9], [3, 2] = 15 + 14 + 11 = 40.
    pieces = split_by_length(lengths, call_tokens=5)
    assert [p.tolist() for p in pieces] == [[0, 2], [3, 1]]
    assert _cost(lengths, pieces, 5) == 36 and padded_positions(lengths, pieces) == 26
    assert [p.tolist() for p in split_by_length(lengths, call_tokens=100)] == [[0, 2, 3, 1]]
    assert [p.tolist() for p in split_by_length(lengths, call_tokens=float("inf"))] == [[0, 2, 3, 1]]


def test_free_calls_give_one_call_per_distinct_length():
    assert [p.tolist() for p in split_by_length([4, 1, 4], call_tokens=0)] == [[0, 2], [1]]


def test_no_contiguous_split_of_the_sorted_rows_is_cheaper():
    rng = np.random.default_rng(0)
    for _ in range(20):
        lengths = rng.integers(1, 60, size=7).tolist()
        call = float(rng.integers(0, 80))
        got = _cost(lengths, split_by_length(lengths, call), call)
        order = longest_first(lengths).tolist()
        brute = min(_cost(lengths, [order[a:b] for a, b in zip((0, *cuts), (*cuts, 7))], call)
                    for k in range(7) for cuts in itertools.combinations(range(1, 7), k))
        assert got == brute


def test_every_row_once_and_nothing_from_nothing():
    pieces = split_by_length([5, 5, 3, 8, 1, 13], call_tokens=4)
    assert sorted(np.concatenate(pieces).tolist()) == list(range(6))
    assert split_by_length([]) == []


def test_each_runtime_gets_its_measured_price_and_an_unknown_one_the_default():
    from compress.core.data.batching import CALL_TOKENS, CALL_TOKENS_BY_FORMAT, call_tokens_for

    class Runner:
        format = "onnx"

    assert call_tokens_for(Runner()) == CALL_TOKENS_BY_FORMAT["onnx"] == 0.0
    assert call_tokens_for(object()) == CALL_TOKENS_BY_FORMAT["pytorch"]
    Runner.format = "pt2"
    assert call_tokens_for(Runner()) == CALL_TOKENS
    Runner.format = "ctranslate2"
    assert call_tokens_for(Runner()) == float("inf")
