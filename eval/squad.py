"""SQuAD v1.1 / v2.0 scoring, as the official evaluation scripts do it, and span post-processing.

Scoring follows ``evaluate-v1.1.py`` and ``evaluate-v2.0.py`` (Rajpurkar et al. 2016,
2018) rule for rule: normalise (lower-case, drop ASCII punctuation, replace the
articles a/an/the by a space, collapse whitespace), exact match and token-overlap F1,
the max over gold answers, averaged, x100. They differ where it matters:

- v1.1 scores a question without a prediction 0; v2.0 skips it (we report ``missing``).
- v2.0 treats a question whose gold answers are all empty as "no answer" (gold = "")
  and gives F1 1 only when prediction and gold are both empty; v1.1's F1 of two empty
  strings is 0.

Post-processing turns start/end logits of overlapping windows into answer texts, as
Hugging Face's ``run_qa.py`` (``utils_qa.postprocess_qa_predictions``) does.
"""

from __future__ import annotations

import collections
import json
import math
import os
import re
import string
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from compress.core.formats.writes import write_text_atomic
from compress.core.errors import CompressError

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


# --------------------------------------------------------------------------- normalisation


def normalize_answer(s: str) -> str:
    """Lower-case, drop punctuation, articles and extra whitespace (official scripts' order)."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCTUATION)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def get_tokens(s: str) -> list[str]:
    """Normalised whitespace tokens; none for an empty string (evaluate-v2.0.py)."""
    return normalize_answer(s).split() if s else []


# --------------------------------------------------------------------------- v1.1 metrics


def exact_match_score(prediction: str, gold: str) -> bool:
    """Whether the normalised strings are equal (evaluate-v1.1.py)."""
    return normalize_answer(prediction) == normalize_answer(gold)


def f1_score(prediction: str, gold: str) -> float:
    """Token multiset-overlap F1 of normalised answers (evaluate-v1.1.py: two empties score 0)."""
    pred_toks = normalize_answer(prediction).split()
    gold_toks = normalize_answer(gold).split()
    return _overlap_f1(pred_toks, gold_toks)


# --------------------------------------------------------------------------- v2.0 metrics


def compute_exact(a_gold: str, a_pred: str) -> int:
    """1 if the normalised strings are equal else 0 (evaluate-v2.0.py)."""
    return int(normalize_answer(a_gold) == normalize_answer(a_pred))


def compute_f1(a_gold: str, a_pred: str) -> float:
    """Token-overlap F1 with v2.0's no-answer rule: if either side is empty, 1 iff both are."""
    gold_toks, pred_toks = get_tokens(a_gold), get_tokens(a_pred)
    if not gold_toks or not pred_toks:
        return float(gold_toks == pred_toks)
    return _overlap_f1(pred_toks, gold_toks)


def _overlap_f1(pred_toks: list[str], gold_toks: list[str]) -> float:
    common = collections.Counter(pred_toks) & collections.Counter(gold_toks)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_toks)
    recall = num_same / len(gold_toks)
    return 2 * precision * recall / (precision + recall)


# --------------------------------------------------------------------------- scoring


def squad_v1_scores(examples: Iterable[Mapping[str, Any]], predictions: Mapping[str, str]) -> dict[str, float]:
    """SQuAD v1.1 EM and F1 in percent, as evaluate-v1.1.py computes them.

    ``examples``: rows with ``id`` and ``answers`` (SQuAD schema); ``predictions``:
    ``{id: answer text}``. A question without a prediction scores 0.
    """
    exact = f1 = 0.0
    total = missing = 0
    for ex in examples:
        total += 1
        golds = _gold_texts(ex)
        if not golds:
            raise CompressError(
                f"question {ex['id']} has no gold answer: this looks like SQuAD v2.0 data; score it with squad_v2"
            )
        if ex["id"] not in predictions:
            missing += 1  # v1.1: unanswered questions score 0
            continue
        pred = predictions[ex["id"]]
        exact += max(float(exact_match_score(pred, g)) for g in golds)
        f1 += max(f1_score(pred, g) for g in golds)
    if total == 0:
        raise CompressError("no SQuAD examples to score")
    return {"exact_match": 100.0 * exact / total, "f1": 100.0 * f1 / total, "total": total, "missing": missing}


def squad_v2_scores(
    examples: Iterable[Mapping[str, Any]],
    predictions: Mapping[str, str],
    na_probs: Mapping[str, float] | None = None,
    na_prob_thresh: float = 1.0,
) -> dict[str, float]:
    """SQuAD v2.0 scores in percent, as evaluate-v2.0.py computes them.

    Questions without a prediction are skipped (counted in ``missing``). With
    ``na_probs`` ({id: no-answer score}), a prediction counts as "no answer" when its
    score exceeds ``na_prob_thresh``, and best_exact / best_f1 and their thresholds are
    added. HasAns_/NoAns_ breakdowns appear only for non-empty subsets.
    """
    has_ans: dict[str, bool] = {}  # qid -> whether it has a gold answer (scored qids only)
    exact_raw: dict[str, float] = {}
    f1_raw: dict[str, float] = {}
    missing = 0
    for ex in examples:
        qid = ex["id"]
        raw_golds = _gold_texts(ex)
        # A gold list of only empty-after-normalisation answers means "no answer".
        golds = [g for g in raw_golds if normalize_answer(g)] or [""]
        if qid not in predictions:
            missing += 1  # v2.0: skipped, not scored 0
            continue
        has_ans[qid] = bool(raw_golds)
        pred = predictions[qid]
        exact_raw[qid] = max(compute_exact(g, pred) for g in golds)
        f1_raw[qid] = max(compute_f1(g, pred) for g in golds)
    if not exact_raw:
        raise CompressError(f"no prediction matches any of the {missing} SQuAD question ids")

    probs = _check_na_probs(na_probs, exact_raw)
    exact_t = _apply_no_ans_threshold(exact_raw, probs, has_ans, na_prob_thresh)
    f1_t = _apply_no_ans_threshold(f1_raw, probs, has_ans, na_prob_thresh)

    out: dict[str, float] = _eval_dict(exact_t, f1_t, list(exact_t))
    out["missing"] = missing
    for prefix, wanted in (("HasAns", True), ("NoAns", False)):
        qids = [q for q, h in has_ans.items() if h == wanted]
        if qids:
            out.update({f"{prefix}_{k}": v for k, v in _eval_dict(exact_t, f1_t, qids, "exact").items()})
    if na_probs is not None:
        out["best_exact"], out["best_exact_thresh"] = find_best_thresh(predictions, exact_raw, probs, has_ans)
        out["best_f1"], out["best_f1_thresh"] = find_best_thresh(predictions, f1_raw, probs, has_ans)
    return out


def find_best_thresh(
    predictions: Mapping[str, str],
    scores: Mapping[str, float],
    na_probs: Mapping[str, float],
    has_ans: Mapping[str, bool],
) -> tuple[float, float]:
    """Best score (percent) over no-answer thresholds and the threshold (evaluate-v2.0.py).

    Start as if every question were answered "no answer" (each NoAns question scores
    1), then walk the questions by increasing na_prob, switching each to its predicted
    answer: a HasAns question gains its score, a NoAns one loses 1 if the prediction is
    non-empty. The best running total and the na_prob where it was reached win.
    """
    cur_score = best_score = sum(1 for q in has_ans if not has_ans[q])
    best_thresh = 0.0
    for qid in sorted(na_probs, key=lambda k: na_probs[k]):  # stable: ties keep dict order
        if qid not in scores:
            continue
        if has_ans[qid]:
            diff = scores[qid]
        else:
            diff = -1 if predictions[qid] else 0
        cur_score += diff
        if cur_score > best_score:
            best_score, best_thresh = cur_score, na_probs[qid]
    return 100.0 * best_score / len(scores), float(best_thresh)


def _apply_no_ans_threshold(scores, na_probs, has_ans, thresh) -> dict[str, float]:
    """Replace the score of a question predicted "no answer" by 1 if it has none, else 0."""
    out = {}
    for qid, s in scores.items():
        out[qid] = float(not has_ans[qid]) if na_probs[qid] > thresh else s
    return out


def _eval_dict(exact, f1, qids, exact_key="exact_match") -> dict[str, float]:
    n = len(qids)
    return {
        exact_key: 100.0 * sum(exact[q] for q in qids) / n,
        "f1": 100.0 * sum(f1[q] for q in qids) / n,
        "total": n,
    }


def _check_na_probs(na_probs, scored) -> dict[str, float]:
    """The official default (all 0.0, so nothing is no-answer) or the given scores, complete."""
    if na_probs is None:
        return {qid: 0.0 for qid in scored}
    lacking = [q for q in scored if q not in na_probs]
    if lacking:
        raise CompressError(f"the no-answer probabilities lack {len(lacking)} question ids, e.g. {lacking[0]}")
    return {q: float(p) for q, p in na_probs.items()}


def _gold_texts(example: Mapping[str, Any]) -> list[str]:
    """Gold answer texts from the hub schema ({"text": [...]}) or the JSON one ([{"text": ...}])."""
    answers = example["answers"]
    if isinstance(answers, Mapping):
        return list(answers["text"])
    return [a["text"] for a in answers]


# --------------------------------------------------------------------------- post-processing


def postprocess_predictions(
    examples: Iterable[Mapping[str, Any]],
    features: Iterable[Mapping[str, Any]],
    start_logits: np.ndarray | Sequence[np.ndarray],
    end_logits: np.ndarray | Sequence[np.ndarray],
    *,
    version_2: bool = False,
    n_best: int = 20,
    max_answer_length: int = 30,
    null_threshold: float = 0.0,
) -> tuple[dict[str, str], dict[str, float]]:
    """Answer texts from window logits, as Hugging Face run_qa's postprocess_qa_predictions.

    ``features`` are the windows of ``compress.core.data.features.squad_eval_features``: each has
    ``example_id`` and ``offset_mapping`` (char span per token, None outside the
    context). ``start_logits``/``end_logits``: (n_features, seq_len), rows possibly
    padded past a window's length. Returns ``(predictions, null_odds)`` where
    ``null_odds[id] = null score - best span score`` (the v2.0 na_prob to threshold;
    +inf when no span qualifies). With ``version_2`` the answer is "" when the odds
    exceed ``null_threshold``.
    """
    ids, contexts = _column(examples, "id"), _column(examples, "context")
    by_example = _features_by_example(_column(features, "example_id"), ids)
    offsets = _column(features, "offset_mapping")
    if len(start_logits) != len(offsets) or len(end_logits) != len(offsets):
        raise CompressError(
            f"{len(offsets)} SQuAD features but {len(start_logits)} start / {len(end_logits)} end logit rows"
        )

    predictions: dict[str, str] = {}
    null_odds: dict[str, float] = {}
    for qid, context in zip(ids, contexts):
        null_score = float("inf")  # min over windows of the [CLS] score
        best_score, best_text = float("-inf"), ""
        for f in by_example[qid]:
            starts = np.asarray(start_logits[f], dtype=float)[: len(offsets[f])]  # (window_len,)
            ends = np.asarray(end_logits[f], dtype=float)[: len(offsets[f])]
            null_score = min(null_score, starts[0] + ends[0])
            score, span = _best_span(starts, ends, offsets[f], n_best, max_answer_length)
            if score > best_score:
                best_score, best_text = score, context[span[0] : span[1]]
        odds = null_score - best_score  # +inf when no span qualified
        null_odds[qid] = float(odds)
        predictions[qid] = "" if version_2 and odds > null_threshold else best_text
    return predictions, null_odds


def _best_span(starts, ends, offsets, n_best, max_answer_length) -> tuple[float, tuple[int, int]]:
    """Highest start+end score over the top-n starts x top-n ends of one window.

    Spans must lie in the context (offset not None), end >= start and be at most
    ``max_answer_length`` tokens. Returns (-inf, (0, 0)) when none qualifies.
    """
    best, span = float("-inf"), (0, 0)
    top_starts = np.argsort(-starts, kind="stable")[:n_best]
    top_ends = np.argsort(-ends, kind="stable")[:n_best]
    for s in top_starts:
        if offsets[s] is None:
            continue
        for e in top_ends:
            if offsets[e] is None or e < s or e - s + 1 > max_answer_length:
                continue
            score = starts[s] + ends[e]
            if score > best:
                best, span = score, (offsets[s][0], offsets[e][1])
    return float(best), span


def _features_by_example(example_ids: Sequence[str], ids: Sequence[str]) -> dict[str, list[int]]:
    """Feature indices per example id, in feature order; unknown ids are an error."""
    out: dict[str, list[int]] = {qid: [] for qid in ids}
    for i, qid in enumerate(example_ids):
        if qid not in out:
            raise CompressError(f"SQuAD feature {i} belongs to example {qid!r}, which is not among the examples")
        out[qid].append(i)
    return out


def _column(rows: Iterable[Mapping[str, Any]], name: str) -> list[Any]:
    """One column as a list, from a ``datasets.Dataset`` (fast path) or a list of dicts."""
    if hasattr(rows, "column_names"):
        return list(rows[name])
    return [r[name] for r in rows]


# --------------------------------------------------------------------------- files


def write_predictions(path: str | os.PathLike, predictions: Mapping[str, str]) -> Path:
    """Write the official ``{id: answer}`` prediction JSON, atomically."""
    return _write_json_atomic(path, dict(predictions))


def write_null_odds(path: str | os.PathLike, odds: Mapping[str, float]) -> Path:
    """Write ``{id: null odds}``, the na_prob file evaluate-v2.0.py reads, atomically.

    Infinite odds (no span qualified) are written as +-1e9: strict JSON has no Infinity.
    """
    return _write_json_atomic(path, {k: _finite(float(v)) for k, v in odds.items()})


def _finite(value: float) -> float:
    return value if math.isfinite(value) else math.copysign(1e9, value)


def _write_json_atomic(path: str | os.PathLike, obj: Any) -> Path:
    # The official scripts' compact, non-ASCII-preserving JSON, written atomically.
    write_text_atomic(Path(path), json.dumps(obj, ensure_ascii=False))
    return Path(path)
