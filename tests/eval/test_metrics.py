"""GLUE metrics against values worked out by hand (never values the code produced)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from compress.core.errors import CompressError
from compress.core.data.tasks import get_task
from compress.eval.metrics import accuracy, chance_check, f1_binary, glue_metrics, matthews, pearson, spearman

# Binary example A:   pred 1 1 0 1 0 0
#                     gold 1 0 1 1 0 1
#                          tp fp fn tp tn fn  -> tp=2 fp=1 fn=2 tn=1
# precision 2/3, recall 2/4; F1 = 2tp / (2tp + fp + fn) = 4/7; accuracy 3/6.
PRED_A = [1, 1, 0, 1, 0, 0]
GOLD_A = [1, 0, 1, 1, 0, 1]
F1_A = 100 * 4 / 7

# Binary example B:   pred 1 1 1 0 0 0 1 0
#                     gold 1 1 0 0 0 1 1 0
#                          tp tp fp tn tn fn tp tn -> tp=3 fp=1 fn=1 tn=3
# MCC = (tp*tn - fp*fn) / sqrt((tp+fp)(tp+fn)(tn+fp)(tn+fn)) = (9 - 1) / sqrt(4**4) = 0.5
PRED_B = [1, 1, 1, 0, 0, 0, 1, 0]
GOLD_B = [1, 1, 0, 0, 0, 1, 1, 0]


def test_accuracy_four_of_five():
    assert accuracy([0, 1, 1, 0, 1], [0, 1, 0, 0, 1]) == pytest.approx(80.0)


def test_f1_binary_from_hand_confusion_matrix():
    assert f1_binary(PRED_A, GOLD_A) == pytest.approx(F1_A)


def test_f1_positive_class_is_one():
    # Swapping the labels makes class 0 the one that matters: tp=1 (pos 5), fp=2, fn=1 -> 2/5.
    swapped_pred = [1 - p for p in PRED_A]
    swapped_gold = [1 - g for g in GOLD_A]
    assert f1_binary(swapped_pred, swapped_gold) == pytest.approx(100 * 2 / 5)


def test_matthews_from_formula():
    assert matthews(PRED_B, GOLD_B) == pytest.approx(50.0)


def test_matthews_perfect_and_inverted():
    assert matthews(GOLD_B, GOLD_B) == pytest.approx(100.0)
    assert matthews([1 - g for g in GOLD_B], GOLD_B) == pytest.approx(-100.0)


def test_pearson_by_hand_and_against_corrcoef():
    # x = 1 2 3, y = 1 2 4: dx = -1 0 1, dy = -4/3 -1/3 5/3; sum dx*dy = 3,
    # sum dx^2 = 2, sum dy^2 = 14/3 -> r = 3 / sqrt(28/3) = 3 * sqrt(3/28).
    x, y = [1.0, 2.0, 3.0], [1.0, 2.0, 4.0]
    assert pearson(x, y) == pytest.approx(100 * 3 * math.sqrt(3 / 28))
    assert pearson(x, y) == pytest.approx(100 * np.corrcoef(x, y)[0, 1])


def test_spearman_by_hand_ranks():
    # ranks x = 1 2 3 4, y = 1 3 2 4: d = 0 -1 1 0, sum d^2 = 2,
    # rho = 1 - 6 * 2 / (4 * (16 - 1)) = 0.8
    assert spearman([10.0, 20.0, 30.0, 40.0], [1.0, 3.0, 2.0, 4.0]) == pytest.approx(80.0)


@pytest.mark.parametrize(
    "name, expected",
    [
        ("cola", {"matthews_correlation", "accuracy"}),
        ("mrpc", {"f1", "accuracy"}),
        ("qqp", {"f1", "accuracy"}),
        ("stsb", {"pearson", "spearmanr"}),
        ("mnli", {"accuracy"}),
        ("sst2", {"accuracy"}),
        ("ax", {"matthews_correlation"}),
    ],
)
def test_each_task_reports_its_official_metrics(name, expected):
    task = get_task(name)
    if task.kind == "regression":
        preds, refs = [0.5, 1.5, 3.0, 4.5], [1.0, 2.0, 2.5, 5.0]
    else:
        preds, refs = [0, 1, 1, 0], [0, 1, 0, 0]
    out = glue_metrics(task, preds, refs)
    assert set(out) == expected | {"n"}
    assert out["n"] == 4


def test_cola_values_and_plain_floats():
    out = glue_metrics("CoLA", np.array(PRED_B), np.array(GOLD_B))
    assert out["matthews_correlation"] == pytest.approx(50.0)
    assert out["accuracy"] == pytest.approx(75.0)  # 6 of 8
    assert out["n"] == 8
    assert type(out["matthews_correlation"]) is float and type(out["accuracy"]) is float


def test_mrpc_values():
    out = glue_metrics("mrpc", PRED_A, GOLD_A)
    assert out["f1"] == pytest.approx(F1_A)
    assert out["accuracy"] == pytest.approx(50.0)


def test_stsb_values():
    # Pearson of x = 1 2 3 4 (a linear map of the predictions) and y = 1 3 2 4:
    # dx = dy-ish = (+-1.5, +-0.5); sum dx*dy = 2.25 - .25 - .25 + 2.25 = 4, sums of squares 5 -> 0.8.
    out = glue_metrics("sts-b", [10.0, 20.0, 30.0, 40.0], [1.0, 3.0, 2.0, 4.0])
    assert out == pytest.approx({"pearson": 80.0, "spearmanr": 80.0, "n": 4})
    assert type(out["pearson"]) is float and type(out["spearmanr"]) is float


def test_mnli_three_classes():
    out = glue_metrics("mnli", [0, 1, 2, 2], [0, 1, 2, 1])
    assert out == {"accuracy": pytest.approx(75.0), "n": 4}


def test_ax_multiclass_matthews_perfect():
    assert glue_metrics("ax", [0, 1, 2, 1], [0, 1, 2, 1])["matthews_correlation"] == pytest.approx(100.0)


def test_regression_head_output_of_shape_n_by_1():
    out = glue_metrics("stsb", np.array([[1.0], [2.0], [3.0]]), [1.0, 2.0, 4.0])
    assert out["pearson"] == pytest.approx(100 * 3 * math.sqrt(3 / 28))


def test_constant_predictions_score_zero_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any leaked warning fails the test
        cola = glue_metrics("cola", [1] * 6, [1, 0, 1, 1, 0, 1])
        stsb = glue_metrics("stsb", [2.5] * 4, [1.0, 3.0, 2.0, 4.0])
        both_constant = pearson([1.0, 1.0], [2.0, 2.0])
    assert cola["matthews_correlation"] == 0.0
    assert cola["accuracy"] == pytest.approx(100 * 4 / 6)
    assert stsb["pearson"] == 0.0 and stsb["spearmanr"] == 0.0
    assert both_constant == 0.0


def test_f1_with_no_positives_is_zero_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert f1_binary([0, 0, 0], [0, 0, 0]) == 0.0


def test_unlabelled_references_are_refused():
    with pytest.raises(CompressError, match="no labels.*dev"):
        glue_metrics("sst2", [0, 1, 1], [-1, -1, -1])
    with pytest.raises(CompressError, match="no labels"):
        glue_metrics("stsb", [0.5, 1.0], [-1.0, -1.0])


def test_length_mismatch_is_refused():
    with pytest.raises(CompressError, match="3 predictions but 2 references"):
        glue_metrics("sst2", [0, 1, 1], [0, 1])


def test_logits_and_span_tasks_are_refused():
    with pytest.raises(CompressError, match="argmax"):
        glue_metrics("sst2", np.zeros((3, 2)), [0, 1, 1])
    with pytest.raises(CompressError, match="compress.eval.squad"):
        glue_metrics("squad", [0], [0])
    with pytest.raises(CompressError, match="0 examples"):
        glue_metrics("sst2", [], [])


# ---------------------------------------------------------------------------- chance level


def test_classification_chance_is_the_majority_rate_plus_two_standard_errors():
    labels = [1] * 30 + [0] * 20 + [-1] * 5  # unlabelled rows are ignored: majority 30/50 = 0.6
    margin = 200 * math.sqrt(0.6 * 0.4 / 50)  # two standard errors of a 60% classifier over 50 examples, in points
    assert margin == pytest.approx(13.856, abs=1e-3)
    below = chance_check(get_task("sst2"), {"accuracy": 73.8}, labels)
    assert below["at_chance"] is True and below["chance"] == pytest.approx(60.0)
    assert below["threshold"] == pytest.approx(60.0 + margin)
    assert "the majority class of 50 dev examples" in below["rule"]
    assert chance_check(get_task("sst2"), {"accuracy": 73.9}, labels)["at_chance"] is False
    # a big dev set: the margin never drops below 2 points
    big = [0] * 5000 + [1] * 5000
    assert chance_check(get_task("sst2"), {"accuracy": 51.9}, big)["threshold"] == pytest.approx(52.0)
    # no labels: 1/num_labels (MNLI: 33.3) and the 2-point margin
    mnli = chance_check(get_task("mnli"), {"accuracy": 35.0})
    assert mnli["at_chance"] is True and mnli["threshold"] == pytest.approx(100 / 3 + 2)
    assert chance_check(get_task("mnli"), {"accuracy": 35.4})["at_chance"] is False
    # a balanced 3-class dev set: 1/3 beats its majority share only when that is lower
    assert chance_check(get_task("mnli"), {"accuracy": 30.0}, [0, 1, 2] * 100)["chance"] == pytest.approx(100 / 3)


def test_regression_and_span_chance():
    assert chance_check(get_task("stsb"), {"pearson": 5.0, "spearmanr": -9.9})["at_chance"] is True
    assert chance_check(get_task("stsb"), {"spearmanr": 10.0})["at_chance"] is False
    assert chance_check(get_task("squad"), {"exact_match": 1.0, "f1": 9.9})["at_chance"] is True
    assert chance_check(get_task("squad"), {"f1": 10.0})["at_chance"] is False
    # SQuAD v2.0: "no answer" everywhere scores ~50 F1 overall; the answerable questions decide
    v2 = chance_check(get_task("squad_v2"), {"f1": 50.1, "HasAns_f1": 2.0})
    assert v2["at_chance"] is True and v2["metric"] == "HasAns_f1"
    assert chance_check(get_task("sst2"), {"f1": 80.0}) is None  # the rule's metric is missing: no verdict
