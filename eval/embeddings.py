"""Sentence embeddings scored without fine-tuning: cosine similarity on a pair task's dev split.

Two measurements, chosen by the kind of pair task (this module's one dispatch on it):

* **similarity** (a regression task: STS-B): the cosine between the two sentences'
  embeddings against the gold score, as Pearson and Spearman correlations (x100) — the
  numbers sentence-embedding papers report for STS-B (Reimers & Gurevych 2019).
* **retrieval** (a classification task with a positive class: MRPC, QQP, RTE, QNLI, ...):
  every positive pair's first sentence is a query; all distinct second sentences of the
  split are the candidates, ranked by cosine; the pair's own second sentence is the one
  relevant candidate. Reported as recall@1 and mean reciprocal rank (x100).

Records go to ``metrics.json`` like GLUE evaluations but with kind ``embedding-eval``,
so a leaderboard never mistakes a cosine score for a fine-tuned model's STS-B result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from compress.core.formats.records import utc_now
from compress.core.errors import CompressError
from compress.core.formats.sentence import SentenceSpec, encode
from compress.core.data.tasks import Task
from compress.eval.metrics import pearson, spearman

EMBEDDING_EVAL = "embedding-eval"  # metrics.json "kind" of these records
# Label names that mark a pair as "the same meaning / follows": the relevant pairs of retrieval.
POSITIVE_LABELS = ("equivalent", "duplicate", "entailment")


# ---------------------------------------------------------------------------- metrics (pure)


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of each row of ``a`` with the same row of ``b``: ``(n, d), (n, d) -> (n,)``."""
    a, b = _unit(a), _unit(b)
    return np.sum(a * b, axis=1)


def similarity_metrics(first: np.ndarray, second: np.ndarray, gold) -> dict[str, float]:
    """Pearson and Spearman correlation (x100) of the pairs' cosine similarities with the gold scores.

    ``first``, ``second``: ``(n, d)`` embeddings of each pair's two sentences; ``gold``: ``(n,)``.
    """
    scores = cosine_rows(first, second)
    return {"pearson": pearson(scores, gold), "spearmanr": spearman(scores, gold)}


def retrieval_metrics(queries: np.ndarray, candidates: np.ndarray, relevant) -> dict[str, float]:
    """Recall@1 and mean reciprocal rank (x100) of ranking ``candidates`` by cosine for each query.

    ``queries``: ``(q, d)``; ``candidates``: ``(c, d)``; ``relevant``: ``(q,)`` the index of
    each query's one relevant candidate. A query's rank is 1 + the number of candidates
    scoring strictly higher than its relevant one.
    """
    relevant = np.asarray(relevant, dtype=np.int64)
    if len(queries) == 0:
        raise CompressError("no queries to rank: the split has no positive pairs")
    scores = _unit(queries) @ _unit(candidates).T  # (q, c)
    gold = scores[np.arange(len(relevant)), relevant][:, None]  # (q, 1)
    ranks = 1 + np.sum(scores > gold, axis=1)  # (q,)
    return {"recall_at_1": float(np.mean(ranks == 1) * 100.0), "mrr": float(np.mean(1.0 / ranks) * 100.0)}


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.clip(np.linalg.norm(x, axis=1, keepdims=True), 1e-12, None)


# ---------------------------------------------------------------------------- per kind of task


@dataclass(frozen=True)
class _Plan:
    """What one split asks to encode and how its embeddings become metrics."""

    texts: list[str]  # distinct sentences to encode
    score: Callable[[np.ndarray], dict[str, float]]  # embeddings of ``texts`` (n, d) -> metrics
    details: dict[str, Any]  # facts for the record (queries, candidates)


def _similarity_plan(task: Task, ds) -> _Plan:
    a, b = task.text_fields
    texts, where = _distinct(list(ds[a]) + list(ds[b]))
    first, second = where[: len(ds)], where[len(ds):]
    gold = np.asarray(ds["label"], dtype=float)
    return _Plan(texts, lambda e: similarity_metrics(e[first], e[second], gold), {"pairs": len(ds)})


def _retrieval_plan(task: Task, ds) -> _Plan:
    a, b = task.text_fields
    positive = positive_label(task)
    rows = [i for i, label in enumerate(ds["label"]) if int(label) == positive]
    queries = [ds[a][i] for i in rows]
    candidates, where = _distinct(list(ds[b]))
    relevant = [where[i] for i in rows]
    texts, at = _distinct(queries + candidates)
    q_at, c_at = at[: len(queries)], at[len(queries):]
    return _Plan(
        texts, lambda e: retrieval_metrics(e[q_at], e[c_at], relevant),
        {"queries": len(queries), "candidates": len(candidates), "positive_label": task.label_names[positive]},
    )


def positive_label(task: Task) -> int:
    """The label index of a pair with the same meaning (``equivalent``, ``duplicate``, ``entailment``)."""
    for i, name in enumerate(task.label_names):
        if name.lower() in POSITIVE_LABELS:
            return i
    raise CompressError(f"{task.display} has no positive label ({', '.join(POSITIVE_LABELS)}) to retrieve pairs by")


@dataclass(frozen=True)
class _KindEmbedding:
    measure: str  # "similarity" or "retrieval"
    metrics: tuple[str, ...]
    primary: str  # the metric retention is computed on
    plan: Callable[[Task, Any], _Plan]
    check: Callable[[Task], Any] = lambda task: None  # refuse a task it cannot measure, before any data is read


# Keyed by what the task predicts (``TaskKind.prediction``): a score is a pair's similarity, a label names pairs to retrieve.
_BY_PREDICTION: dict[str, _KindEmbedding] = {
    "score": _KindEmbedding("similarity", ("pearson", "spearmanr"), "spearmanr", _similarity_plan),
    "label": _KindEmbedding("retrieval", ("recall_at_1", "mrr"), "mrr", _retrieval_plan, check=positive_label),
}


def check_embedding_task(task: Task) -> _KindEmbedding:
    """How ``task`` scores embeddings; a one-line error for a task that cannot (single sentences, SQuAD)."""
    usable = "stsb (similarity) or a pair classification task with a positive class such as mrpc, qqp, rte (retrieval)"
    kind = _BY_PREDICTION.get(task.behaviour.prediction)
    if not task.is_pair or kind is None:
        raise CompressError(f"{task.display} cannot score sentence embeddings: it needs sentence pairs; use {usable}")
    kind.check(task)
    return kind


def primary_metric(task: Task) -> str:
    return check_embedding_task(task).primary


def _distinct(texts: list[str]) -> tuple[list[str], np.ndarray]:
    """The distinct texts in first-seen order, and each input's index among them."""
    index: dict[str, int] = {}
    where = np.array([index.setdefault(t, len(index)) for t in texts], dtype=np.int64)
    return list(index), where


# ---------------------------------------------------------------------------- scorer


def embedding_scorer(tokenizer, task: Task, ds, spec: SentenceSpec, *, batch_size: int = 32,
                     max_length: int | None = None, device=None):
    """Plan ``ds`` once; return ``score(model) -> (metrics, details)`` (distillation calls it every evaluation).

    ``max_length`` None: the folder's ``max_seq_length`` (as SentenceTransformer truncates).
    Every metric is in percent; ``details`` names the measurement and its sizes.
    """
    kind = check_embedding_task(task)
    if any(label == task.behaviour.unlabelled for label in ds["label"]):
        raise CompressError(f"{task.display}: this split has no labels (a test split); score embeddings on dev")
    plan = kind.plan(task, ds)

    def score(model) -> tuple[dict[str, float], dict[str, Any]]:
        embeddings = encode(model, tokenizer, plan.texts, spec, batch_size=batch_size, max_length=max_length, device=device)
        return plan.score(embeddings), {"measure": kind.measure, "sentences": len(plan.texts), **plan.details}

    return score


def embedding_record(task: Task, split: str, n: int, metrics: dict[str, float], details: dict[str, Any],
                     spec: SentenceSpec, **extra) -> dict[str, Any]:
    """The metrics.json record of one scored split (``extra``: data source, max_length, ...)."""
    return {
        "kind": EMBEDDING_EVAL, "task": task.name, "split": split, "n": n, "metrics": metrics,
        "embedding": {"pooling": spec.pooling, "normalize": spec.normalize, "similarity": "cosine", **details},
        "when": utc_now(), **extra,
    }
