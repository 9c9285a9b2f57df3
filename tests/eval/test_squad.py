"""SQuAD scoring and span post-processing against hand-worked examples."""

from __future__ import annotations

import json
import math
import string

import numpy as np
import pytest

from compress.core.errors import CompressError
from compress.eval.squad import (
    compute_exact,
    compute_f1,
    exact_match_score,
    f1_score,
    normalize_answer,
    postprocess_predictions,
    squad_v1_scores,
    squad_v2_scores,
    write_null_odds,
    write_predictions,
)

# --------------------------------------------------------------------------- normalisation


def test_normalize_lower_cases():
    assert normalize_answer("PaRiS") == "paris"


@pytest.mark.parametrize("ch", list(string.punctuation))
def test_normalize_drops_every_ascii_punctuation_mark(ch):
    assert normalize_answer(f"x{ch}y") == "xy"


def test_normalize_keeps_non_ascii_punctuation():
    # Only string.punctuation goes: guillemets and the en dash stay.
    assert normalize_answer("«x» – y") == "«x» – y"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("the cat", "cat"),
        ("a dog", "dog"),
        ("an apple", "apple"),
        ("THE An A owl", "owl"),  # lower-casing happens before article removal
        ("theatre", "theatre"),  # "the" only as a whole word
        ("another banana", "another banana"),
        ("cat the sat", "cat sat"),  # the gap left behind collapses
        ("(the) cat", "cat"),  # punctuation goes first, then "the" is a word
        ("the-end", "theend"),  # hyphen removed first: "theend" is no article
        ("the café", "café"),
    ],
)
def test_normalize_removes_articles_as_whole_words(text, expected):
    assert normalize_answer(text) == expected


def test_normalize_collapses_whitespace():
    assert normalize_answer("  cat \t sat\n\non  mat ") == "cat sat on mat"


def test_normalize_order_punctuation_before_articles():
    # "a.m." -> "am" (not an article); "u.s.a" -> "usa"
    assert normalize_answer("At 10 a.m. in the U.S.A.") == "at 10 am in usa"


# --------------------------------------------------------------------------- EM / F1


def test_em_and_f1_hand_example():
    # pred "the cat sat" -> [cat, sat]; gold "a cat sat on the mat" -> [cat, sat, on, mat]
    # common 2: precision 2/2, recall 2/4 -> F1 = 2 * 1 * 0.5 / 1.5 = 2/3
    assert f1_score("the cat sat", "a cat sat on the mat") == pytest.approx(2 / 3)
    assert compute_f1("a cat sat on the mat", "the cat sat") == pytest.approx(2 / 3)
    assert not exact_match_score("the cat sat", "a cat sat on the mat")
    assert exact_match_score("The Cat sat!", "cat  sat")
    assert compute_exact("cat  sat", "The Cat sat!") == 1


def test_f1_counts_token_multisets():
    # pred [cat, cat, cat] vs gold [cat, sat]: common = min(3, 1) = 1
    # precision 1/3, recall 1/2 -> F1 = 2 * (1/6) / (5/6) = 0.4
    assert f1_score("cat cat cat", "cat sat") == pytest.approx(0.4)


def test_no_overlap_scores_zero():
    assert f1_score("dog", "cat") == 0.0
    assert compute_f1("cat", "dog") == 0.0


def test_v2_empty_answer_f1_rules():
    assert compute_f1("", "") == 1.0  # both no-answer
    assert compute_f1("", "cat") == 0.0  # gold empty, prediction not
    assert compute_f1("cat", "") == 0.0  # prediction empty, gold not
    assert compute_f1("the", "a") == 1.0  # both normalise to nothing
    assert compute_exact("", "") == 1


def test_v1_empty_strings_score_zero_f1():
    # evaluate-v1.1.py has no empty rule: no common tokens -> 0.
    assert f1_score("", "") == 0.0


# --------------------------------------------------------------------------- v1.1


def _ex(qid, *golds, json_schema=False):
    if json_schema:  # the official JSON file's shape
        return {"id": qid, "answers": [{"text": g, "answer_start": 0} for g in golds]}
    return {"id": qid, "answers": {"text": list(golds), "answer_start": [0] * len(golds)}}


def test_v1_scores_max_over_golds_and_missing_scores_zero():
    examples = [
        # "broncos" vs [denver, broncos]: P 1, R 1/2 -> 2/3 (same for both golds)
        _ex("q1", "Denver Broncos", "the Denver Broncos"),
        # pred [levis, stadium, in, santa, clara]
        #   vs [santa, clara, california]: P 2/5, R 2/3 -> 1/2
        #   vs [levis, stadium]:           P 2/5, R 1   -> 4/7  (the max)
        _ex("q2", "Santa Clara, California", "Levi's Stadium", json_schema=True),
        _ex("q3", "1000"),  # "1,000" normalises to "1000": EM 1, F1 1
        _ex("q4", "Paris"),  # no prediction: 0 under v1.1
    ]
    preds = {"q1": "Broncos", "q2": "Levi's Stadium in Santa Clara", "q3": "1,000"}
    out = squad_v1_scores(examples, preds)
    assert out["exact_match"] == pytest.approx(100 * 1 / 4)
    assert out["f1"] == pytest.approx(100 * (2 / 3 + 4 / 7 + 1 + 0) / 4)  # = 100 * 47/84
    assert out["total"] == 4 and out["missing"] == 1


def test_v1_refuses_unanswerable_questions():
    with pytest.raises(CompressError, match="v2.0"):
        squad_v1_scores([_ex("q1")], {"q1": ""})


# --------------------------------------------------------------------------- v2.0

V2_EXAMPLES = [
    _ex("a", "cat"),  # pred "cat": EM 1, F1 1
    _ex("b", "the big dog"),  # pred "big cat": [big, cat] vs [big, dog] -> P 1/2, R 1/2, F1 1/2; EM 0
    _ex("c"),  # no answer, pred "": EM 1, F1 1
    _ex("d"),  # no answer, pred "mat": EM 0, F1 0
    _ex("e", "river"),  # no prediction: skipped under v2.0
]
V2_PREDS = {"a": "cat", "b": "big cat", "c": "", "d": "mat"}


def test_v2_scores_skip_missing_and_break_down():
    out = squad_v2_scores(V2_EXAMPLES, V2_PREDS)
    assert out["total"] == 4 and out["missing"] == 1
    assert out["exact_match"] == pytest.approx(100 * (1 + 0 + 1 + 0) / 4)
    assert out["f1"] == pytest.approx(100 * (1 + 0.5 + 1 + 0) / 4)
    assert (out["HasAns_exact"], out["HasAns_f1"], out["HasAns_total"]) == pytest.approx((50.0, 75.0, 2))
    assert (out["NoAns_exact"], out["NoAns_f1"], out["NoAns_total"]) == pytest.approx((50.0, 50.0, 2))
    assert "best_f1" not in out  # only with na_probs


def test_v2_breakdown_only_for_non_empty_subsets():
    out = squad_v2_scores([_ex("a", "cat")], {"a": "cat"})
    assert "HasAns_exact" in out and "NoAns_exact" not in out
    assert out["exact_match"] == 100.0


def test_v2_golds_that_normalise_to_nothing_mean_empty_answer():
    # Golds "the" and "." normalise to "": the only correct answer becomes "".
    out = squad_v2_scores([_ex("a", "the", ".")], {"a": ""})
    assert out["exact_match"] == 100.0 and out["f1"] == 100.0


# na_probs (with d after b so EM and F1 find different best thresholds):
#   a 0.1, e 0.2 (not scored), b 0.7, d 0.8, c 0.9
V2_NA = {"a": 0.1, "b": 0.7, "c": 0.9, "d": 0.8, "e": 0.2}


def test_v2_na_prob_thresh_turns_predictions_into_no_answer():
    # thresh 0.5: b (0.7), d (0.8), c (0.9) count as "no answer":
    #   b has an answer -> 0; c, d have none -> 1; a keeps 1.  EM = F1 = 3/4
    out = squad_v2_scores(V2_EXAMPLES, V2_PREDS, na_probs=V2_NA, na_prob_thresh=0.5)
    assert out["exact_match"] == pytest.approx(75.0) and out["f1"] == pytest.approx(75.0)
    assert out["HasAns_f1"] == pytest.approx(50.0) and out["NoAns_f1"] == pytest.approx(100.0)
    # thresh 0.7: only d (0.8) and c (0.9) flip (strict >): F1 = (1 + 0.5 + 1 + 1) / 4
    out = squad_v2_scores(V2_EXAMPLES, V2_PREDS, na_probs=V2_NA, na_prob_thresh=0.7)
    assert out["f1"] == pytest.approx(87.5)


def test_v2_best_threshold_hand_worked():
    # find_best_thresh: start with every question "no answer" = number of NoAns (c, d) = 2.
    # Walk by na_prob: a (HasAns) +score, e skipped, b (HasAns) +score,
    # d (NoAns, pred "mat" non-empty) -1, c (NoAns, pred "") +0.
    #   EM: 2 -> a +1 = 3 (best, thresh 0.1) -> b +0 = 3 -> d 2 -> c 2 : 3/4 = 75, thresh 0.1
    #   F1: 2 -> a +1 = 3 -> b +0.5 = 3.5 (best, thresh 0.7) -> d 2.5 -> c 2.5 : 3.5/4 = 87.5
    out = squad_v2_scores(V2_EXAMPLES, V2_PREDS, na_probs=V2_NA)
    assert out["best_exact"] == pytest.approx(75.0) and out["best_exact_thresh"] == pytest.approx(0.1)
    assert out["best_f1"] == pytest.approx(87.5) and out["best_f1_thresh"] == pytest.approx(0.7)
    # default thresh 1.0: nothing flips, the plain scores
    assert out["exact_match"] == pytest.approx(50.0) and out["f1"] == pytest.approx(62.5)


def test_v2_best_threshold_stays_zero_when_answering_never_helps():
    # One NoAns question answered wrongly: start 1, walk -1 -> best stays 1 at thresh 0.0.
    out = squad_v2_scores([_ex("d")], {"d": "mat"}, na_probs={"d": 0.3})
    assert out["best_exact"] == 100.0 and out["best_exact_thresh"] == 0.0


def test_v2_incomplete_na_probs_are_refused():
    with pytest.raises(CompressError, match="lack 1"):
        squad_v2_scores(V2_EXAMPLES, V2_PREDS, na_probs={"a": 0.1, "b": 0.2, "c": 0.3})


# --------------------------------------------------------------------------- post-processing

CONTEXT = "The cat sat on the mat in Paris."
# chars: The(0,3) cat(4,7) sat(8,11) on(12,14) the(15,18) mat(19,22) in(23,25) Paris(26,31) .(31,32)
# Window 1: [CLS] q q [SEP] The cat sat on the [SEP]          (length 10)
W1 = [None] * 4 + [(0, 3), (4, 7), (8, 11), (12, 14), (15, 18)] + [None]
# Window 2: [CLS] q q [SEP] on the mat in Paris . [SEP]       (length 11)
W2 = [None] * 4 + [(12, 14), (15, 18), (19, 22), (23, 25), (26, 31), (31, 32)] + [None]
EXAMPLE = {"id": "q", "question": "where ?", "context": CONTEXT, "answers": {"text": ["Paris"], "answer_start": [26]}}
WIDTH = 12  # logits rows are padded to the longest window + 1


def _logits(**values):
    """A (WIDTH,) row of zeros with row[i] = v for each p<i>=v keyword."""
    row = np.zeros(WIDTH)
    for key, v in values.items():
        row[int(key[1:])] = v
    return row


def _run(windows, starts, ends, **kw):
    features = [{"example_id": "q", "offset_mapping": w} for w in windows]
    return postprocess_predictions([EXAMPLE], features, np.stack(starts), np.stack(ends), **kw)


def test_postprocess_best_span_across_windows_ignores_question_and_padding():
    # W1: question token 1 has the top logits (10) but no offset; padding 10, 11 has 50.
    #     best context span: cat (5) .. sat (6) = 3 + 3 = 6.   [CLS]: 1 + 1 = 2
    # W2: padding 11 has 50; Paris (8) .. Paris (8) = 4 + 4 = 8.   [CLS]: 0.5 + 0.5 = 1
    starts = [_logits(p0=1, p1=10, p5=3, p10=50, p11=50), _logits(p0=0.5, p8=4, p11=50)]
    ends = [_logits(p0=1, p1=10, p6=3, p10=50, p11=50), _logits(p0=0.5, p8=4, p11=50)]
    preds, odds = _run([W1, W2], starts, ends)
    assert preds == {"q": "Paris"}
    assert odds["q"] == pytest.approx(1 - 8)  # null = min(2, 1); best span 8
    # Without W2, W1's best span is "cat sat".
    preds, _ = _run([W1], starts[:1], ends[:1])
    assert preds == {"q": "cat sat"}


@pytest.mark.parametrize(
    "max_len, expected",
    [
        (5, "The cat sat on the"),  # (4, 8): 5 + 6 = 11, five tokens
        (4, "The cat sat"),  # (4, 6): 5 + 4 = 9 beats (5, 8): 2 + 6 = 8
        (1, "the"),  # single tokens: (8, 8) = 0 + 6 beats (4, 4) = 5 + 0
    ],
)
def test_postprocess_max_answer_length(max_len, expected):
    starts = [_logits(p4=5, p5=2)]
    ends = [_logits(p6=4, p8=6)]
    preds, _ = _run([W1], starts, ends, max_answer_length=max_len)
    assert preds["q"] == expected


def test_postprocess_end_before_start_is_excluded():
    # (6, 5) would score 10 but ends before it starts; next best (6, 7) = 5 + 1 "sat on".
    preds, _ = _run([W1], [_logits(p6=5)], [_logits(p5=5, p7=1)])
    assert preds["q"] == "sat on"


def test_postprocess_n_best_limits_candidates():
    # starts: sat (6) = 5, on (7) = 4; ends: cat (5) = 5, on (7) = 3.
    # n_best=1: only (6, 5), which ends before it starts -> no span: "" and infinite odds.
    # n_best=2: (6, 7) = 8 beats (7, 7) = 7 -> "sat on".
    starts, ends = [_logits(p6=5, p7=4)], [_logits(p5=5, p7=3)]
    preds, odds = _run([W1], starts, ends, n_best=1)
    assert preds["q"] == "" and math.isinf(odds["q"])
    preds, _ = _run([W1], starts, ends, n_best=2)
    assert preds["q"] == "sat on"


def test_postprocess_v2_null_decision():
    # [CLS] 2 + 2 = 4 (null score); best span cat (5, 5) = 1.5 + 1.5 = 3 -> odds 4 - 3 = 1.
    starts, ends = [_logits(p0=2, p5=1.5)], [_logits(p0=2, p5=1.5)]
    preds, odds = _run([W1], starts, ends, version_2=True, null_threshold=0.0)
    assert preds["q"] == "" and odds["q"] == pytest.approx(1.0)
    preds, _ = _run([W1], starts, ends, version_2=True, null_threshold=1.0)  # 1 > 1 is false
    assert preds["q"] == "cat"
    preds, _ = _run([W1], starts, ends, version_2=True, null_threshold=1.5)
    assert preds["q"] == "cat"
    preds, odds = _run([W1], starts, ends)  # v1 never predicts "", but reports the odds
    assert preds["q"] == "cat" and odds["q"] == pytest.approx(1.0)


def test_postprocess_null_score_is_min_over_windows():
    # W1 [CLS] = 4, W2 [CLS] = 1 + 1 = 2 -> null 2; best span cat = 3 -> odds -1: answer.
    starts = [_logits(p0=2, p5=1.5), _logits(p0=1)]
    ends = [_logits(p0=2, p5=1.5), _logits(p0=1)]
    preds, odds = _run([W1, W2], starts, ends, version_2=True)
    assert preds["q"] == "cat" and odds["q"] == pytest.approx(-1.0)


def test_postprocess_refuses_misaligned_inputs():
    with pytest.raises(CompressError, match="2 SQuAD features but 1"):
        _run([W1, W2], [_logits()], [_logits()])
    stray = [{"example_id": "other", "offset_mapping": W1}]
    with pytest.raises(CompressError, match="other"):
        postprocess_predictions([EXAMPLE], stray, np.zeros((1, WIDTH)), np.zeros((1, WIDTH)))


def test_postprocess_on_real_eval_features(tokenizer):
    # The contract with compress.core.data.features.squad_eval_features: Arrow rows, None offsets.
    from datasets import Dataset

    from compress.core.data.features import squad_eval_features

    ds = Dataset.from_list(
        [{"id": "q1", "question": "where is paris?", "context": "Paris is the capital of France.",
          "answers": {"text": ["France"], "answer_start": [24]}}]
    )
    features = squad_eval_features(ds, tokenizer, max_length=32, doc_stride=8)
    offsets = features[0]["offset_mapping"]
    context = ds[0]["context"]
    target = next(i for i, o in enumerate(offsets) if o is not None and context[o[0] : o[1]] == "France")
    starts = np.zeros((1, 40))  # padded past the window
    ends = np.zeros((1, 40))
    starts[0, target] = ends[0, target] = 5.0
    preds, _ = postprocess_predictions(ds, features, starts, ends)
    assert preds == {"q1": "France"}
    assert squad_v1_scores(ds, preds) == {"exact_match": 100.0, "f1": 100.0, "total": 1, "missing": 0}


# --------------------------------------------------------------------------- files


def test_write_predictions_round_trip(tmp_path):
    preds = {"q1": "Zürich", "q2": "", "q3": "the \"big\" cat"}
    path = write_predictions(tmp_path / "out" / "predictions.json", preds)
    assert json.loads(path.read_text(encoding="utf-8")) == preds
    assert "Zürich" in path.read_text(encoding="utf-8")  # ensure_ascii=False
    assert [p.name for p in path.parent.iterdir()] == ["predictions.json"]  # no temp file left
    write_predictions(path, {"q1": "Bern"})  # replaces atomically
    assert json.loads(path.read_text(encoding="utf-8")) == {"q1": "Bern"}


def test_write_null_odds_round_trip(tmp_path):
    odds = {"q1": -7.0, "q2": 1.25}
    path = write_null_odds(tmp_path / "null_odds.json", odds)
    assert json.loads(path.read_text(encoding="utf-8")) == odds
