"""GLUE's official metrics, computed locally (scikit-learn / scipy, never a download).

Every number is in percent (x100), as papers print GLUE tables. The metric names are
the ones in ``Task.metrics``: accuracy, f1 (binary, positive class 1, as MRPC/QQP),
matthews_correlation (CoLA, AX), pearson and spearmanr (STS-B).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import Union

import numpy as np
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import f1_score, matthews_corrcoef

from compress.core.errors import CompressError
from compress.core.tasks import CLASSIFICATION, REGRESSION, SPAN, UNLABELLED, Task, get_task

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


METRICS: dict[str, Callable[[ArrayLike, ArrayLike], float]] = {
    "accuracy": accuracy,
    "f1": f1_binary,
    "matthews_correlation": matthews,
    "pearson": pearson,
    "spearmanr": spearman,
}


def glue_metrics(task: Task | str, predictions: ArrayLike, references: ArrayLike) -> dict[str, float]:
    """The official GLUE metrics of ``task`` (exactly ``task.metrics``), in percent, plus ``n``.

    Classification tasks take class indices, STS-B takes floats. Gold labels of -1
    mean an unlabelled (test) split, which cannot be scored locally.
    """
    task = get_task(task) if isinstance(task, str) else task
    if task.behaviour.label_type is None:  # examples carry answers (text spans), not labels
        raise CompressError(f"{task.display} is a {task.kind} task: score it with compress.eval.squad, not glue_metrics")
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
    return _CHANCE_RULES[task.kind](task, metrics, labels)


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


# The kind of a task decides what chance means; this table is the module's one dispatch on it.
_CHANCE_RULES = {CLASSIFICATION: _classification_chance, REGRESSION: _regression_chance, SPAN: _span_chance}
