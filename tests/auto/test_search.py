"""The model-free core of ``compress auto``: budgets, latency model, NNLS, pricing a round, choice."""

from __future__ import annotations

import math

import numpy as np
import pytest

from compress.core.errors import CompressError
from compress.core.model.shapes import Shape
from compress.eval.latency.row import Row
from compress.auto.search import (Budget, Sample, choose, fastest, room, features, fit_latency_model, held_out_error, round_seconds,
                             measurement, nnls, pareto_front, parse_budgets, points)

# ---------------------------------------------------------------------------- budgets


@pytest.mark.parametrize("text, kind, stat, limit, batch, seq", [
    ("p50<=6ms@b1,s128", "latency", "p50", 6.0, 1, 128),
    ("P90 <= 0.5 s", "latency", "p90", 500.0, 1, 128),
    ("p99<=800us@b8,s64", "latency", "p99", 0.8, 8, 64),
    ("mean<=12.5ms", "latency", "mean", 12.5, 1, 128),
    ("throughput>=500/s@b32,s128", "throughput", None, 500.0, 32, 128),
    ("Throughput >= 1.5e3/s", "throughput", None, 1500.0, 32, 128),
    ("throughput>=40/s @ b4, s256", "throughput", None, 40.0, 4, 256),
    ("size<=20MB", "size", None, 20e6, None, None),
    ("size<=300kb", "size", None, 3e5, None, None),
    ("size<=2GB", "size", None, 2e9, None, None),
    ("size <= 512 KiB", "size", None, 524288.0, None, None),
    ("size<=1.5GiB", "size", None, 1.5 * 1073741824, None, None),
    ("size<=64MiB", "size", None, 67108864.0, None, None),
    ("speedup>=10x", "speedup", None, 10.0, 1, 128),
    ("SpeedUp >= 4.5X @b8,s256", "speedup", None, 4.5, 8, 256),
])
def test_every_budget_form_parses_to_the_right_numbers(text, kind, stat, limit, batch, seq):
    (b,) = parse_budgets(text)
    assert (b.kind, b.stat, b.batch, b.seq) == (kind, stat, batch, seq)
    assert b.limit == pytest.approx(limit, rel=1e-12)
    assert b.text == text.strip()


def test_several_budgets_by_semicolon_or_list_and_their_points():
    budgets = parse_budgets(["p50<=6ms; size<=20MB", "speedup>=2x@b8,s64;throughput>=100/s"])
    assert [b.kind for b in budgets] == ["latency", "size", "speedup", "throughput"]
    assert [b.text for b in budgets] == ["p50<=6ms", "size<=20MB", "speedup>=2x@b8,s64", "throughput>=100/s"]
    assert points(budgets) == {(1, 128), (8, 64), (32, 128)}
    assert parse_budgets("p50<=6ms;") == parse_budgets(["p50<=6ms"])


@pytest.mark.parametrize("text, piece", [
    ("p50>=6ms", "'>='"),
    ("size>=1MB", "'>='"),
    ("throughput<=500/s", "'<='"),
    ("p50<6ms", "'<'"),
    ("latency<=6ms", "'latency'"),
    ("p50<=0ms", "'0'"),
    ("p50<=-3ms", "'-3'"),
    ("p50<=6", "unit ''"),
    ("p50<=6mb", "'mb'"),
    ("size<=20MBs", "'mbs'"),
    ("throughput>=fast", "'fast'"),
    ("p50<=6ms@b1", "'@b1'"),
    ("p50<=6ms@b0,s128", "'@b0,s128'"),
    ("size<=20MB@b1,s128", "'@b1,s128'"),
    ("p50 6ms", "comparison"),
])
def test_bad_budgets_name_the_offending_piece_and_show_the_grammar(text, piece):
    with pytest.raises(CompressError) as caught:
        parse_budgets(text)
    message = str(caught.value)
    assert piece in message and text.strip() in message
    assert "budgets look like" in message and "\n" not in message


@pytest.mark.parametrize("text", ["", " ; ", []])
def test_no_budget_at_all_is_refused(text):
    with pytest.raises(CompressError, match="no budget given"):
        parse_budgets(text)


def _measured(p50, size, speedup=1.0, point=(1, 128)):
    return {"size_bytes": size, "points": {point: {"p50_ms": p50, "p90_ms": p50 * 1.2, "throughput": 1e3 / p50,
                                                   "speedup": speedup}}}


def test_budget_value_met_and_describe():
    p50, p90, size, speed, thr = parse_budgets("p50<=6ms; p90<=6ms; size<=20MB; speedup>=3x; throughput>=180/s@b1,s128")
    m = _measured(5.5, 19e6, speedup=3.0)
    assert p50.value(m) == 5.5 and p50.met(m)
    assert p90.value(m) == pytest.approx(6.6) and not p90.met(m)
    assert size.met(m) and not size.met(_measured(5.5, 21e6))
    assert speed.met(m) and not speed.met(_measured(5.5, 1, speedup=2.9))
    assert thr.value(m) == pytest.approx(1e3 / 5.5) and thr.met(m)
    assert not p50.met(_measured(float("nan"), 1))
    assert p50.describe() == "p50 latency <= 6 ms at batch 1, seq 128"
    assert size.describe() == "size <= 20 MB"
    assert speed.describe() == "speedup >= 3 x at batch 1, seq 128"


def test_a_budget_at_an_untimed_point_says_which_point():
    (b,) = parse_budgets("p50<=6ms@b8,s64")
    with pytest.raises(CompressError, match="p50_ms at batch 8, seq 64"):
        b.met(_measured(1.0, 1))
    with pytest.raises(CompressError, match="size_bytes"):
        parse_budgets("size<=1MB")[0].met({"points": {}})


def test_measurement_from_latency_rows():
    rows = [Row.from_dict({"batch": 1, "seq": 128, "p50_ms": 4.0, "p90_ms": 5.0, "throughput": 250.0, "name": "x"}),
            Row(batch=32, seq=128, p50_ms=60.0, throughput=533.0)]
    m = measurement(rows, 12e6)  # a figure a row lacks is left out
    assert m == {"size_bytes": 12e6, "points": {(1, 128): {"p50_ms": 4.0, "p90_ms": 5.0, "throughput": 250.0},
                                               (32, 128): {"p50_ms": 60.0, "throughput": 533.0}}}
    assert parse_budgets("throughput>=500/s")[0].met(m)


def test_repeated_runs_are_judged_on_the_worst_run():
    # Three runs at b1: p50 1.30, 1.66, 1.31 ms -> median 1.31, slowest 1.66 (throughput 1000/1.66 per s).
    row = {"batch": 1, "seq": 128, "p50_ms": 1.31, "p99_ms": 1.5, "throughput": 1e3 / 1.31, "speedup": 17.0,
           "runs_p50_ms": [1.30, 1.66, 1.31], "speedup_min": 13.6,
           "slowest_run": {"p50_ms": 1.66, "p90_ms": 1.8, "p99_ms": 2.0, "mean_ms": 1.7}}
    m = measurement([Row.from_dict(row)], 7e6)
    slowest = m["points"][(1, 128)]["slowest"]
    assert slowest["p50_ms"] == 1.66 and slowest["throughput"] == pytest.approx(602.41, abs=0.01)
    assert slowest["speedup"] == 13.6
    p50, p99, rate, fast = parse_budgets("p50<=1.36ms@b1,s128; p99<=2.5ms@b1,s128; throughput>=700/s@b1,s128; "
                                         "speedup>=15x@b1,s128")
    assert p50.value(m) == 1.31 and p50.value(m, worst=True) == 1.66
    assert not p50.met(m)  # met by the median, missed in one run
    assert p99.met(m)  # 2.0 <= 2.5 in the worst run
    assert not rate.met(m) and parse_budgets("throughput>=600/s@b1,s128")[0].met(m)
    assert not fast.met(m) and parse_budgets("speedup>=13x@b1,s128")[0].met(m)
    # a single run has no worst run apart from itself
    single = measurement([Row.from_dict({**row, "runs_p50_ms": [1.31]})], 7e6)
    assert "slowest" not in single["points"][(1, 128)] and p50.met(single)


# ---------------------------------------------------------------------------- latency model

TRUE = {("torch", 1, 128): np.array([0.8, 0.05, 9.0, 11.0, 25.0]),  # ms, ms/layer, ms/GFLOP x 3
        ("onnxruntime", 8, 64): np.array([0.3, 0.02, 4.0, 6.0, 7.0])}


def _shapes(n, seed, tied=False):
    rng = np.random.default_rng(seed)
    shapes = []
    for _ in range(n):
        heads = int(rng.integers(2, 13))
        hidden = heads * int(rng.choice([32, 64]))
        ffn = 4 * hidden if tied else int(rng.integers(hidden // 64, 5 * hidden // 64 + 1)) * 64
        shapes.append(Shape(int(rng.integers(1, 13)), hidden, heads, ffn))
    return shapes


def _samples(shapes, noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    return [Sample(g[0], g[1], g[2], s, float(features(g[1], g[2], s) @ c) * math.exp(noise * rng.standard_normal()))
            for g, c in TRUE.items() for s in shapes]


def test_latency_model_recovers_known_costs_and_predicts_held_out_shapes():
    fit_shapes, new_shapes = _shapes(20, seed=1), _shapes(6, seed=2)
    model = fit_latency_model(_samples(fit_shapes))
    for g, c in TRUE.items():
        assert model.basis[g] == "full"
        np.testing.assert_allclose(model.coefs[g], c, rtol=1e-2)
        for s in new_shapes:
            per_layer = float(features(g[1], g[2], s)[1:] @ c[1:]) / s.layers
            assert model.per_layer_ms(*g, s) == pytest.approx(per_layer, rel=1e-2)
            assert model.predict(*g, s) == pytest.approx(float(features(g[1], g[2], s) @ c), rel=1e-2)


def test_latency_model_with_five_percent_noise_predicts_held_out_within_five_percent():
    shapes = _shapes(40, seed=3)
    held = set(shapes[30:])
    report = held_out_error(_samples(shapes, noise=0.05, seed=4), lambda s: s.shape in held)
    assert len(report["errors"]) == 2 * len(held)
    assert report["median"] < 5.0
    assert report["worst"] >= report["median"]
    noiseless = held_out_error(_samples(shapes), lambda s: s.shape in held)
    assert noiseless["worst"] < 1e-3


def test_latency_model_refuses_a_point_it_was_not_fitted_on():
    model = fit_latency_model(_samples(_shapes(8, seed=5)))
    with pytest.raises(CompressError, match=r"torch@b8,s128 .*fitted: onnxruntime@b8,s64, torch@b1,s128"):
        model.predict("torch", 8, 128, Shape(2, 64, 2, 256))
    with pytest.raises(CompressError, match="openvino@b1,s128"):
        model.per_layer_ms("openvino", 1, 128, Shape(2, 64, 2, 256))


def test_latency_model_falls_back_to_fewer_features_and_never_crashes():
    c = TRUE[("torch", 1, 128)]
    tied = _shapes(8, seed=6, tied=True)  # ffn = 4*hidden: projections and FFN cannot be told apart
    model = fit_latency_model([s for s in _samples(tied) if s.backend == "torch"])
    assert model.basis[("torch", 1, 128)] == "dense"
    other = Shape(3, 256, 4, 1024)
    assert model.predict("torch", 1, 128, other) == pytest.approx(float(features(1, 128, other) @ c), rel=1e-2)

    few = [s for s in _samples(_shapes(3, seed=7)) if s.backend == "torch"]
    for n, rung in [(3, "flops"), (2, "flops+overhead"), (1, "flops only")]:
        model = fit_latency_model(few[:n])
        assert model.basis[("torch", 1, 128)] == rung
        coefs = np.array(model.coefs[("torch", 1, 128)])
        assert (coefs >= 0).all() and np.isfinite(coefs).all()
        assert model.predict("torch", 1, 128, few[0].shape) > 0
    # one sample: latency proportional to FLOPs through it
    assert model.predict("torch", 1, 128, few[0].shape) == pytest.approx(few[0].ms, rel=1e-9)
    with pytest.raises(CompressError, match="no latency samples"):
        fit_latency_model([])
    with pytest.raises(CompressError, match="must be positive"):
        fit_latency_model([Sample("torch", 1, 128, other, 0.0)])


# ---------------------------------------------------------------------------- NNLS


def test_nnls_is_never_negative_and_satisfies_the_optimality_conditions():
    rng = np.random.default_rng(8)
    clipped = 0
    for _ in range(30):
        A, b = rng.standard_normal((15, 6)), rng.standard_normal(15)
        x = nnls(A, b)
        assert (x >= 0).all()
        w = A.T @ (b - A @ x)  # KKT: zero gradient where x > 0, no gain from raising x where x = 0
        assert np.abs(w[x > 0]).max(initial=0) < 1e-8
        assert (w[x == 0] < 1e-8).all()
        clipped += (np.linalg.lstsq(A, b, rcond=None)[0] < 0).any()
    assert clipped > 0  # the constraint did bind in some problems


def test_nnls_matches_least_squares_when_that_is_already_non_negative():
    rng = np.random.default_rng(9)
    A = rng.random((25, 5))
    b = A @ np.array([1.0, 2.0, 0.5, 3.0, 0.25]) + 1e-3 * rng.standard_normal(25)
    unconstrained = np.linalg.lstsq(A, b, rcond=None)[0]
    assert (unconstrained > 0).all()
    np.testing.assert_allclose(nnls(A, b), unconstrained, rtol=1e-8, atol=1e-10)


# ---------------------------------------------------------------------------- pricing a round


def test_a_round_costs_each_candidates_latest_seconds_per_unit_times_its_units():
    history = [("a", 1, 100.0), ("b", 1, 40.0), ("a", 2, 180.0)]  # a: 90 s per unit now, b: 40
    assert round_seconds([("a", 4), ("b", 4)], history) == pytest.approx(4 * 90 + 4 * 40)
    assert round_seconds([("c", 2)], history) == 0.0 and round_seconds([], history) == 0.0
    # priced by size: a 90 s per unit at size 10 (9 per size), b 40 at size 2 (20): median 14.5; c (size 4) x 2 units
    size = {"a": 10.0, "b": 2.0, "c": 4.0}.get
    assert round_seconds([("c", 2)], history, size) == pytest.approx(14.5 * 4 * 2)
    assert round_seconds([("c", 2)], [], size) == 0.0  # nothing to price it by


# ---------------------------------------------------------------------------- choosing


def test_pareto_front_on_a_hand_made_set():
    pts = [(0.80, 10), (0.85, 20), (0.78, 5), (0.80, 12), (0.85, 25), (0.90, 40), (0.70, 6), (0.80, 10)]
    # (0.80, 12) loses to (0.80, 10); (0.85, 25) to (0.85, 20); (0.70, 6) to (0.78, 5); equal points both stay
    assert pareto_front(pts) == [0, 1, 2, 5, 7]
    assert pareto_front([]) == [] and pareto_front([(0.5, 1.0)]) == [0]


RESULTS = [
    {"name": "A", "accuracy": 0.90, "measurement": _measured(8.0, 15e6)},  # too slow
    {"name": "B", "accuracy": 0.86, "measurement": _measured(5.0, 25e6)},  # too big
    {"name": "C", "accuracy": 0.84, "measurement": _measured(5.5, 18e6)},
    {"name": "D", "accuracy": 0.84, "measurement": _measured(4.0, 19e6)},  # ties C, faster
    {"name": "E", "accuracy": 0.80, "measurement": _measured(3.0, 10e6)},
    {"name": "F", "accuracy": float("nan"), "measurement": _measured(1.0, 1e6)},  # evaluation failed
]


def test_choose_the_most_accurate_result_that_fits():
    assert choose(RESULTS, parse_budgets("p50<=6ms; size<=20MB"))["name"] == "D"
    assert choose(RESULTS, parse_budgets("p50<=6ms"))["name"] == "B"
    assert choose(RESULTS, parse_budgets("size<=16MB"))["name"] == "A"
    assert choose(RESULTS, parse_budgets("p50<=2ms")) is None
    assert choose([], parse_budgets("p50<=2ms")) is None
    assert fastest(RESULTS)["name"] == "F" and fastest(RESULTS[:5])["name"] == "E" and fastest([]) is None


def test_choose_within_a_tie_takes_the_one_with_room():
    # The MRPC 1/16 case: two int8 variants of one student, 0.26 point apart; the more accurate fits 16x by a hair.
    narrow = {"name": "ort", "accuracy": 76.57, "measurement": _measured(1.75, 10e6, speedup=16.3)}
    wide = {"name": "ov", "accuracy": 76.31, "measurement": _measured(0.99, 10e6, speedup=28.8)}
    worse = {"name": "far", "accuracy": 75.00, "measurement": _measured(0.50, 10e6, speedup=57.0)}
    budgets = parse_budgets("speedup>=16x@b1,s128")
    assert room(narrow, budgets) == pytest.approx(0.3 / 16) and room(wide, budgets) == pytest.approx(12.8 / 16)
    assert room(narrow, parse_budgets("p50<=2ms; size<=20MB")) == pytest.approx(0.25 / 2)  # sizes do not count
    assert room(narrow, parse_budgets("size<=20MB")) == float("inf")
    assert choose([narrow, wide, worse], budgets)["name"] == "ort"  # no tie: accuracy alone
    assert choose([narrow, wide, worse], budgets, tie=0.4)["name"] == "ov"  # 0.26 apart: equal; ov has the room
    assert choose([narrow, wide, worse], budgets, tie=0.2)["name"] == "ort"
    assert choose([narrow, wide, worse], budgets, tie=2.0)["name"] == "far"  # within 2 points, the most room
    assert choose([narrow, wide, worse], parse_budgets("speedup>=20x@b1,s128"), tie=0.4)["name"] == "ov"  # narrow misses
