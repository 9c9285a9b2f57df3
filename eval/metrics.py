"""Task metrics computed locally (scikit-learn / scipy / seqeval, never a download).

Every number is in percent (x100), as papers print GLUE tables; MSE is in the label's own
units squared. The metric names are the ones in ``Task.metrics``:

* GLUE: accuracy, f1 (binary, positive class 1, as MRPC/QQP), matthews_correlation (CoLA,
  AX), pearson and spearmanr (STS-B);
* a user's text classification: accuracy, macro_f1 (unweighted mean of the per-label F1);
  regression: pearson, spearmanr, mse;
* multi-label: micro_f1 (over every (example, label) decision), macro_f1 (mean of the
  per-label F1), subset_accuracy (every label of an example right);
* token classification: entity_precision / entity_recall / entity_f1 and ``f1_<type>``,
  exactly as seqeval computes them (an entity counts when its type and its span agree,
  CoNLL's conlleval rules; an ``I-`` that does not continue an entity starts one).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Union

import numpy as np
from scipy.stats import pearsonr, spearmanr
from seqeval.metrics import classification_report, precision_score, recall_score
from seqeval.metrics import f1_score as seq_f1
from sklearn.metrics import f1_score, matthews_corrcoef

from compress.core.errors import CompressError
from compress.core.data.tasks import UNLABELLED, Task, entity_types, get_task

ArrayLike = Union[Sequence[float], np.ndarray]


def accuracy(predictions: ArrayLike, references: ArrayLike) -> float:
    """Share of exact matches between predicted and gold class indices, in percent."""
    preds, refs = np.asarray(predictions), np.asarray(references)
    return float(np.mean(preds == refs) * 100.0)


def f1_binary(predictions: ArrayLike, references: ArrayLike) -> float:
    """F1 of the positive class (index 1), as GLUE reports for MRPC and QQP, in percent."""
    # zero_division=0: no predicted and no gold positives is 0, not a warning.
    return float(
        f1_score(references, predictions, pos_label=1, average="binary", zero_division=0.0) * 100.0
    )


def matthews(predictions: ArrayLike, references: ArrayLike) -> float:
    """Matthews correlation coefficient (CoLA, AX; multi-class for AX), in percent.

    A constant predictor has an undefined coefficient; scikit-learn returns 0.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # 0/0 on degenerate input
        return _finite(matthews_corrcoef(references, predictions) * 100.0)


def pearson(predictions: ArrayLike, references: ArrayLike) -> float:
    """Pearson correlation (STS-B), in percent; 0.0 when either side is constant."""
    return _correlation(pearsonr, predictions, references)


def spearman(predictions: ArrayLike, references: ArrayLike) -> float:
    """Spearman rank correlation (STS-B), in percent; 0.0 when either side is constant."""
    return _correlation(spearmanr, predictions, references)


def f1_macro(predictions: ArrayLike, references: ArrayLike) -> float:
    """Unweighted mean of the per-label F1 over the labels in gold or predictions, in percent."""
    return float(f1_score(references, predictions, average="macro", zero_division=0.0) * 100.0)


def mse(predictions: ArrayLike, references: ArrayLike) -> float:
    """Mean squared error between predicted and gold scores (the label's units squared, not percent)."""
    x, y = np.asarray(predictions, dtype=float), np.asarray(references, dtype=float)
    return float(np.mean((x - y) ** 2))


METRICS: dict[str, Callable[[ArrayLike, ArrayLike], float]] = {
    "accuracy": accuracy,
    "f1": f1_binary,
    "macro_f1": f1_macro,
    "matthews_correlation": matthews,
    "pearson": pearson,
    "spearmanr": spearman,
    "mse": mse,
}


def multi_label_metrics(predictions: ArrayLike, references: ArrayLike) -> dict[str, float]:
    """Micro / macro F1 and subset accuracy of multi-hot rows ``(n, labels)``, in percent, plus ``n``.

    Micro F1 pools every (example, label) decision; macro F1 averages the per-label F1 over
    every label (a label never predicted nor gold scores 0, as scikit-learn's zero_division=0).
    """
    preds, refs = np.asarray(predictions, dtype=int), np.asarray(references, dtype=int)
    if preds.shape != refs.shape or preds.ndim != 2:
        raise CompressError(f"multi-label scores need two (examples, labels) arrays of one shape; got {preds.shape} and {refs.shape}")
    if len(refs) == 0:
        raise CompressError("nothing to score (0 examples)")
    return {
        "micro_f1": float(f1_score(refs, preds, average="micro", zero_division=0.0) * 100.0),
        "macro_f1": float(f1_score(refs, preds, average="macro", zero_division=0.0) * 100.0),
        "subset_accuracy": float(np.mean((preds == refs).all(axis=1)) * 100.0),
        "n": int(len(refs)),
    }


def entity_metrics(predictions: list[list[str]], references: list[list[str]]) -> dict[str, float]:
    """Entity-level precision, recall and F1 (overall, micro) and F1 per entity type, as seqeval computes them.

    Both sides are lists of sentences, each a list of BIO tags; in percent, plus ``n``
    (sentences). Types absent from both sides are not reported.
    """
    if len(predictions) != len(references) or any(len(p) != len(r) for p, r in zip(predictions, references)):
        raise CompressError("entity scores need one predicted tag per gold tag in every sentence")
    if not references:
        raise CompressError("nothing to score (0 sentences)")
    out = {
        "entity_f1": float(seq_f1(references, predictions, zero_division=0) * 100.0),
        "entity_precision": float(precision_score(references, predictions, zero_division=0) * 100.0),
        "entity_recall": float(recall_score(references, predictions, zero_division=0) * 100.0),
    }
    report = classification_report(references, predictions, output_dict=True, zero_division=0)
    for name, row in report.items():
        if name not in ("micro avg", "macro avg", "weighted avg"):
            out[f"f1_{name}"] = float(row["f1-score"] * 100.0)
    out["n"] = int(len(references))
    return out


def task_metrics(task: Task, predictions: Any, references: Any) -> dict[str, float]:
    """``task``'s metrics (exactly ``task.metrics``, those a split lacks left out), in percent, plus ``n``.

    Classification takes class indices, regression floats, multi-label multi-hot rows,
    token classification lists of tag names per sentence.
    """
    if task.behaviour.multi_hot:
        return multi_label_metrics(predictions, references)
    if task.behaviour.tagged_words:
        scores = entity_metrics(predictions, references)
        # Every type the task has is reported; one absent from a split's gold and predictions scores nothing there.
        kept = {f"f1_{t}" for t in entity_types(task.label_names)} | {"entity_f1", "entity_precision", "entity_recall", "n"}
        return {k: v for k, v in scores.items() if k in kept}
    return glue_metrics(task, predictions, references)


def glue_metrics(task: Task | str, predictions: ArrayLike, references: ArrayLike) -> dict[str, float]:
    """The metrics of a classification or regression ``task`` (exactly ``task.metrics``), in percent, plus ``n``.

    Classification tasks take class indices, STS-B takes floats. Gold labels of -1
    mean an unlabelled (test) split, which cannot be scored locally.
    """
    task = get_task(task) if isinstance(task, str) else task
    if task.behaviour.label_type is None:  # examples carry answers (text spans), not labels
        raise CompressError(f"{task.display} is a {task.kind} task: score it with compress.eval.squad, not glue_metrics")
    if task.behaviour.label_list:
        raise CompressError(f"{task.display} is a {task.kind} task: score it with task_metrics, not glue_metrics")
    preds, refs = _check_inputs(task, predictions, references)
    out: dict[str, float] = {name: METRICS[name](preds, refs) for name in task.metrics}
    out["n"] = int(len(refs))
    return out


def _check_inputs(task: Task, predictions: ArrayLike, references: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """1-D arrays of predictions and labelled references, or a one-line error."""
    dtype = task.behaviour.label_type  # int class indices, float scores
    preds = _vector(predictions, dtype, task, "predictions")
    refs = _vector(references, dtype, task, "references")
    if len(preds) != len(refs):
        raise CompressError(
            f"{task.display}: {len(preds)} predictions but {len(refs)} references; they must align row by row"
        )
    if len(refs) == 0:
        raise CompressError(f"{task.display}: nothing to score (0 examples)")
    unlabelled = int(np.sum(refs == UNLABELLED))
    if unlabelled:
        raise CompressError(
            f"{task.display}: {unlabelled} of {len(refs)} references are -1: this split has no labels "
            f"(a test split); evaluate on dev, or write a GLUE server submission for test"
        )
    return preds, refs


def _vector(values: ArrayLike, dtype: type, task: Task, what: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]  # (n, 1) regression head output
    if arr.ndim != 1:
        raise CompressError(
            f"{task.display}: {what} must be one value per example, got shape {arr.shape}"
            + (" (take the argmax of the logits)" if dtype is int else "")
        )
    return arr.astype(dtype)


def _correlation(fn: Callable, predictions: ArrayLike, references: ArrayLike) -> float:
    """``fn``'s coefficient in percent; constant or too-short input gives 0.0, silently."""
    x = np.asarray(predictions, dtype=float)
    y = np.asarray(references, dtype=float)
    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return 0.0  # undefined; scipy would warn (ConstantInputWarning) and return nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # near-constant input can still warn
        return _finite(fn(x, y)[0] * 100.0)


def _finite(value: float) -> float:
    value = float(value)
    return value if math.isfinite(value) else 0.0


# ---------------------------------------------------------------------------- chance level

CHANCE_MARGIN = 2.0  # points: the least a classifier's accuracy must clear the chance rate by
CHANCE_SPEARMAN = 10.0  # |Spearman| (percent) below which a regression model ranks pairs at chance
CHANCE_SPAN_F1 = 10.0  # answer F1 (percent) below which a reading-comprehension model finds no answers


def chance_check(task: Task, metrics: dict[str, float], labels: ArrayLike | None = None) -> dict | None:
    """Whether a dev result (``metrics``, in percent) is no better than chance on ``task``: the one rule.

    * classification: accuracy at most the chance rate plus two standard errors of a
      classifier at that rate over the dev set (never less than ``CHANCE_MARGIN`` points).
      The chance rate is the majority-class share of ``labels`` (the dev labels; rows
      labelled -1 ignored) or 1/num_labels, whichever is larger; without labels, 1/num_labels
      and a margin of ``CHANCE_MARGIN``.
    * regression: |Spearman| below ``CHANCE_SPEARMAN`` (0.1 as a correlation).
    * span (SQuAD): answer F1 below ``CHANCE_SPAN_F1``; on SQuAD v2.0 the F1 on answerable
      questions (``HasAns_f1``), since answering "no answer" everywhere already scores ~50.

    Returns ``{"at_chance", "metric", "value", "threshold", "rule"}`` (plus ``"chance"``, the
    rate, for classification), or None when ``metrics`` lack the metric the rule reads.
    """
    return _CHANCE_RULES[task.behaviour.prediction](task, metrics, labels)


def _classification_chance(task: Task, metrics: dict[str, float], labels: ArrayLike | None) -> dict | None:
    if "accuracy" not in metrics:
        return None
    rate, margin, basis = 1 / task.num_labels, CHANCE_MARGIN, f"1/{task.num_labels} labels"
    known = np.asarray(labels if labels is not None else [], dtype=float)
    known = known[known != UNLABELLED]
    if len(known):
        majority = float(np.unique(known, return_counts=True)[1].max() / len(known))
        if majority > rate:
            rate, basis = majority, f"the majority class of {len(known)} dev examples"
        margin = max(CHANCE_MARGIN, 200 * math.sqrt(rate * (1 - rate) / len(known)))  # two standard errors, in points
    value, threshold = float(metrics["accuracy"]), 100 * rate + margin
    return {"at_chance": value <= threshold, "metric": "accuracy", "value": value, "chance": 100 * rate,
            "threshold": threshold, "rule": f"accuracy <= {100 * rate:.1f} ({basis}) + {margin:.1f}"}


def _regression_chance(task: Task, metrics: dict[str, float], labels: ArrayLike | None) -> dict | None:
    if "spearmanr" not in metrics:
        return None
    value = float(metrics["spearmanr"])
    return {"at_chance": abs(value) < CHANCE_SPEARMAN, "metric": "spearmanr", "value": value,
            "threshold": CHANCE_SPEARMAN, "rule": f"|spearmanr| < {CHANCE_SPEARMAN:g}"}


def _span_chance(task: Task, metrics: dict[str, float], labels: ArrayLike | None) -> dict | None:
    metric = "HasAns_f1" if task.unanswerable else "f1"
    if metric not in metrics:
        return None
    value = float(metrics[metric])
    return {"at_chance": value < CHANCE_SPAN_F1, "metric": metric, "value": value,
            "threshold": CHANCE_SPAN_F1, "rule": f"{metric} < {CHANCE_SPAN_F1:g}"}


CHANCE_ENTITY_F1 = 10.0  # entity F1 (percent) below which a tagger finds no entities


def _multi_label_chance(task: Task, metrics: dict[str, float], labels: Any | None) -> dict | None:
    """At chance: micro F1 no better than predicting every label of every example (F1 = 2d / (1 + d) at density d)."""
    if "micro_f1" not in metrics:
        return None
    rows = np.asarray(labels if labels is not None else [], dtype=float)
    rows = rows[(rows >= 0).all(axis=1)] if rows.ndim == 2 else rows.reshape(0, 1)
    density = float(rows.mean()) if rows.size else 0.0
    every = 100 * 2 * density / (1 + density) if density else 0.0
    threshold = max(every + CHANCE_MARGIN, CHANCE_MARGIN)
    value = float(metrics["micro_f1"])
    return {"at_chance": value <= threshold, "metric": "micro_f1", "value": value, "chance": every, "threshold": threshold,
            "rule": f"micro_f1 <= {every:.1f} (every label predicted, density {density:.3f}) + {CHANCE_MARGIN:g}"}


def _entity_chance(task: Task, metrics: dict[str, float], labels: Any | None) -> dict | None:
    if "entity_f1" not in metrics:
        return None
    value = float(metrics["entity_f1"])
    return {"at_chance": value < CHANCE_ENTITY_F1, "metric": "entity_f1", "value": value,
            "threshold": CHANCE_ENTITY_F1, "rule": f"entity_f1 < {CHANCE_ENTITY_F1:g}"}


# What a task predicts (``TaskKind.prediction``) decides what chance means; this table is the module's one dispatch on it.
_CHANCE_RULES = {"label": _classification_chance, "labels": _multi_label_chance, "score": _regression_chance,
                 "tags": _entity_chance, "answer": _span_chance}
