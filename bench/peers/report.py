"""The pure half of ``bench.peers.run``: the one scorer, the Pareto front, the goal verdicts and the report text.

Nothing here loads a model or times anything: every function takes numbers (embeddings as
numpy arrays, rows as dicts) and returns numbers or text, so ``tests/bench/test_peers.py``
checks them on hand-made inputs. A row is one contender::

    {"name": "st-onnx", "side": "peer" | "toolkit", "label": "...", "precision": "fp32" | "fp16" | "int8",
     "spearman": 86.72, "pearson": ..., "recall_at_1": ..., "mrr": ...,   # x100, None if not scored
     "mb": 90.4, "b1": 250.0, "b32": 900.0, "b1_ms": 3.9,               # sentences/s, median over rounds
     "status": "ok" | "failed: why"}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np
from scipy.stats import pearsonr, spearmanr

# Scores are compared as the table prints them: two decimals (x100), so a tie on paper is a tie in the verdict.
DECIMALS = 2
# The refinement goal: refining the static student on the user's sentences adds at least this many Spearman points.
REFINE_GAIN = 2.0
# An fp32 contender's embeddings must point where the teacher's do (cosine, every scored sentence).
FP32_MIN_COSINE = 0.99


# ---------------------------------------------------------------------------- the scorer (one for every contender)


@dataclass(frozen=True)
class Plan:
    """The distinct sentences every contender embeds, and where each scored item finds its rows.

    ``texts`` (n,) distinct sentences, STS-B's first, then MRPC's not seen before;
    ``first``/``second`` (pairs,) rows of each STS-B pair's two sentences and ``gold`` (pairs,) its score;
    ``queries`` (q,) rows of each positive MRPC pair's sentence1, ``candidates`` (c,) rows of every
    distinct MRPC sentence2, ``relevant`` (q,) each query's own candidate (an index into ``candidates``).
    """

    texts: list[str]
    first: np.ndarray
    second: np.ndarray
    gold: np.ndarray
    queries: np.ndarray
    candidates: np.ndarray
    relevant: np.ndarray


def make_plan(stsb: list[tuple[str, str, float]], mrpc: list[tuple[str, str, int]]) -> Plan:
    """A :class:`Plan` from STS-B pairs ``(s1, s2, score)`` and MRPC pairs ``(s1, s2, label)`` (1: equivalent)."""
    index: dict[str, int] = {}

    def row(text: str) -> int:
        return index.setdefault(text, len(index))

    first = np.array([row(a) for a, _, _ in stsb], dtype=np.int64)
    second = np.array([row(b) for _, b, _ in stsb], dtype=np.int64)
    gold = np.array([float(s) for _, _, s in stsb])
    candidates: dict[int, int] = {}  # text row -> candidate position, in first-seen order
    for _, b, _ in mrpc:
        candidates.setdefault(row(b), len(candidates))
    positives = [(a, b) for a, b, label in mrpc if int(label) == 1]
    queries = np.array([row(a) for a, _ in positives], dtype=np.int64)
    relevant = np.array([candidates[index[b]] for _, b in positives], dtype=np.int64)
    return Plan(list(index), first, second, gold, queries, np.array(list(candidates), dtype=np.int64), relevant)


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)  # (n, d): scored in float64 whatever the contender returned
    return x / np.clip(np.linalg.norm(x, axis=1, keepdims=True), 1e-12, None)


def score(embeddings: np.ndarray, plan: Plan) -> dict[str, float]:
    """STS-B Spearman/Pearson of the cosine and MRPC recall@1/MRR (all x100) of one contender's ``(n, d)`` embeddings.

    The same definitions as ``compress eval --embedding`` (compress.eval.embeddings), written
    here without the toolkit so that the scorer judges every contender from outside it: the
    cosine of each pair; a query's rank is 1 + the number of candidates scoring strictly higher
    than its own (ties favour the query).
    """
    unit = _unit(embeddings)
    cosine = np.sum(unit[plan.first] * unit[plan.second], axis=1)  # (pairs,)
    out = {"spearman": float(spearmanr(cosine, plan.gold)[0] * 100), "pearson": float(pearsonr(cosine, plan.gold)[0] * 100)}
    if len(plan.queries):
        scores = unit[plan.queries] @ unit[plan.candidates].T  # (q, c)
        own = scores[np.arange(len(plan.relevant)), plan.relevant][:, None]  # (q, 1)
        ranks = 1 + np.sum(scores > own, axis=1)  # (q,)
        out.update({"recall_at_1": float(np.mean(ranks == 1) * 100), "mrr": float(np.mean(1.0 / ranks) * 100)})
    return out


def agreement(embeddings: np.ndarray, reference: np.ndarray) -> dict[str, float] | None:
    """Mean and minimum cosine of each row with the same row of ``reference`` (None when the widths differ)."""
    if embeddings.shape != reference.shape:
        return None
    cos = np.sum(_unit(embeddings) * _unit(reference), axis=1)  # (n,)
    return {"mean": float(cos.mean()), "min": float(cos.min()), "n": int(len(cos))}


# ---------------------------------------------------------------------------- Pareto front and verdicts


def _acc(row: dict[str, Any]) -> float:
    return round(float(row["spearman"]), DECIMALS)


def usable(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with a score and both speeds (a failed or untimed contender takes no part in fronts or verdicts)."""
    return [r for r in rows if r.get("spearman") is not None and r.get("b1") and r.get("b32")]


def pareto_front(rows: list[dict[str, Any]], speed: str = "b1") -> list[str]:
    """Names of the rows no other row beats: none at least as accurate and at least as fast with one of them strictly.

    Accuracy is ``spearman`` (at the printed decimals), speed the ``speed`` key (sentences/s).
    Returned fastest first.
    """
    rows = usable(rows)
    front = []
    for r in rows:
        beaten = any(_acc(o) >= _acc(r) and o[speed] >= r[speed] and (_acc(o) > _acc(r) or o[speed] > r[speed])
                     for o in rows if o is not r)
        if not beaten:
            front.append(r)
    return [r["name"] for r in sorted(front, key=lambda r: -r[speed])]


def dominates(tool: dict[str, Any], peer: dict[str, Any]) -> bool:
    """Whether ``tool`` is at least as accurate as ``peer`` and at least as fast at batch 1 and at batch 32."""
    return _acc(tool) >= _acc(peer) and tool["b1"] >= peer["b1"] and tool["b32"] >= peer["b32"]


def precision_class(row: dict[str, Any]) -> str:
    """``int8`` or ``float`` (fp32, fp16): a peer is judged against the toolkit's models of its own class."""
    return "int8" if row.get("precision") == "int8" else "float"


def peer_verdict(peer: dict[str, Any], toolkit: list[dict[str, Any]]) -> dict[str, Any]:
    """For one peer, against the toolkit models of its precision class: who matches it, and the best at each batch size.

    ``met``/``by``: the toolkit models at least as accurate and at least as fast at batch 1 and at batch 32
    (fastest at batch 1 first); ``b1``/``b32``: the fastest toolkit model at that batch size among those at least as
    accurate (``best``, None when none is), its speed over the peer's (``ratio``) and whether it is at least as fast
    (``met``); the nearest misses: ``as_accurate``, the fastest (batch 1) at least as accurate, with its speed ratios,
    and ``as_fast``, the most accurate at least as fast at both batch sizes, with its gap in points.
    """
    toolkit = [t for t in toolkit if precision_class(t) == precision_class(peer)]
    matches = sorted((t for t in toolkit if dominates(t, peer)), key=lambda t: -t["b1"])
    accurate = [t for t in toolkit if _acc(t) >= _acc(peer)]
    fast = sorted((t for t in toolkit if t["b1"] >= peer["b1"] and t["b32"] >= peer["b32"]), key=lambda t: -_acc(t))
    out: dict[str, Any] = {"peer": peer["name"], "class": precision_class(peer), "met": bool(matches),
                           "by": [t["name"] for t in matches]}
    for speed in ("b1", "b32"):
        best = max(accurate, key=lambda t: t[speed], default=None)
        out[speed] = ({"met": False, "best": None} if best is None else
                      {"met": best[speed] >= peer[speed], "best": best["name"], "ratio": best[speed] / peer[speed]})
    if accurate:
        t = max(accurate, key=lambda t: t["b1"])
        out["as_accurate"] = {"name": t["name"], "b1_ratio": t["b1"] / peer["b1"], "b32_ratio": t["b32"] / peer["b32"]}
    if fast:
        t = fast[0]
        out["as_fast"] = {"name": t["name"], "points": _acc(t) - _acc(peer)}
    return out


RUNTIME_WITHIN = 0.9  # a toolkit runtime's sentences/s over the fastest peer's on the same weights, wanted at least


def runtime_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each toolkit export of the peers' own weights (model "teacher") against the fastest peer of its precision class
    on those weights, at batch 1 and at batch 32 apart: ``{"name", "class", "b1": {"peer", "ratio", "met"} | None,
    "b32": ...}`` (``met``: at least :data:`RUNTIME_WITHIN` of the peer's speed; None where no peer of the class ran).
    Accuracy does not enter: the weights are the same, so only the runtime and the way the toolkit feeds it differ."""
    same = [r for r in usable(rows) if r.get("model") == "teacher"]
    out = []
    for tool in (r for r in same if r["side"] == "toolkit"):
        peers = [p for p in same if p["side"] == "peer" and precision_class(p) == precision_class(tool)]
        entry: dict[str, Any] = {"name": tool["name"], "class": precision_class(tool)}
        for speed in ("b1", "b32"):
            best = max(peers, key=lambda p: p[speed], default=None)
            ratio = None if best is None else tool[speed] / best[speed]
            entry[speed] = None if best is None else {"peer": best["name"], "ratio": ratio, "met": ratio >= RUNTIME_WITHIN}
        out.append(entry)
    return out


def verdicts(rows: list[dict[str, Any]], static: str = "tk-static", refined: str = "tk-static-refined",
             model2vec: str = "model2vec") -> dict[str, Any]:
    """The issue's goal, judged on the table of one run.

    * ``peers``: every peer contender has a toolkit model of its precision class at least as accurate and at least as
      fast at batch 1 and at batch 32 (:func:`peer_verdict` per peer; a peer that failed or was not timed is listed in
      ``missing`` and makes the goal unmet, as does a peer with no toolkit model of its class);
    * ``static``: the toolkit's static student (unrefined, like for like: model2vec's own distillation is unrefined
      too) is at least as accurate as model2vec's; ``refine``: refining it adds >= REFINE_GAIN points.
    Each is ``{"met": bool | None, ...numbers}``; None where a side is missing.
    """
    by_name = {r["name"]: r for r in rows}
    timed = {r["name"] for r in usable(rows)}
    toolkit = [r for r in usable(rows) if r["side"] == "toolkit"]
    peers = [r for r in rows if r["side"] == "peer"]
    per_peer = [peer_verdict(p, toolkit) for p in peers if p["name"] in timed]
    missing = [p["name"] for p in peers if p["name"] not in timed]
    out: dict[str, Any] = {"peers": {"met": bool(per_peer) and not missing and all(v["met"] for v in per_peer),
                                     "each": per_peer, "missing": missing}}
    s, m, r = (by_name.get(k) for k in (static, model2vec, refined))
    if s and m and s.get("spearman") is not None and m.get("spearman") is not None:
        out["static"] = {"met": _acc(s) >= _acc(m), "static": _acc(s), "model2vec": _acc(m), "points": _acc(s) - _acc(m),
                         "refined": _acc(r) if r and r.get("spearman") is not None else None}
    else:
        out["static"] = {"met": None}
    if s and r and s.get("spearman") is not None and r.get("spearman") is not None:
        gain = _acc(r) - _acc(s)
        out["refine"] = {"met": gain >= REFINE_GAIN, "gain": round(gain, DECIMALS), "static": _acc(s), "refined": _acc(r)}
    else:
        out["refine"] = {"met": None}
    return out


def median(values: list[float]) -> float | None:
    return float(np.median(values)) if values else None
