"""compress auto on tiny models with a fake timer: the choice meets the budget, nothing fitting is one clear
error naming the fastest model, a resumed search trains no finished candidate again."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from compress.auto import halving as auto_halving
from compress.auto import probe as auto_probe
from compress.auto import targets as auto_targets
from compress.auto.config import AutoConfig, parse_minutes
from compress.auto.probe import probe_shapes, rank_by_prior
from compress.auto.run import auto
from compress.auto.state import Earlier, SearchState, best_round
from compress.auto.targets import candidate_shapes
from compress.core.data import synthetic
from compress.core.formats.artifacts import load_config
from compress.core.config import from_dict
from compress.core.errors import CompressError
from compress.core.model.shapes import Shape
from compress.core.checkpoints import work_dir_for
from compress.eval.latency.row import Row


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    from compress.core.model.shapes import resolve_shape
    from compress.teacher.create import create_model
    from compress.teacher.finetune import FinetuneConfig, finetune

    root = tmp_path_factory.mktemp("auto")
    data = synthetic.write_sst2_layout(root / "data", n_train=300, n_dev=64, n_test=8)
    vocab = synthetic.write_vocab(root / "vocab.txt")
    init = create_model(resolve_shape("2L-64-128-4H"), root / "init", tokenizer=vocab, task="sst2", max_positions=64, seed=1)
    cfg = from_dict(FinetuneConfig, {"task": "sst2", "data_dir": str(data), "epochs": 2, "lr": 1e-3, "max_length": 32})
    return finetune(init, root / "teacher", cfg), data


def _shape_of(path: Path) -> tuple[int, int]:
    for folder in (path, *path.parents):
        if (folder / "config.json").is_file():
            c = load_config(folder)
            return c.num_hidden_layers, c.hidden_size
    raise AssertionError(f"no config.json above {path}")


def fake_timer(slow: dict[str, float] | None = None, calls: list | None = None, flaky: dict[str, float] | None = None):
    """Latency = 1 ms + 0.05 ms per layer x width unit (int8: half), exact and noiseless; ``slow`` multiplies
    the final measurement of folders whose path contains a key (a model slower than its probe predicted),
    ``flaky`` only their second run of several (the median of three runs is unchanged)."""
    def timer(dirs, at, repeats, runs):
        runs_asked.append(runs)
        if calls is not None:
            calls.append([str(d) for d in dirs])
        rows = []
        first = None
        for d in dirs:
            layers, hidden = _shape_of(Path(d))
            ms = 1.0 + 0.05 * layers * hidden / 16 * (0.5 if "int8" in str(d) else 1.0)
            for key, factor in (slow or {}).items():
                if key in str(d) and "probe" not in str(d) and d != dirs[0]:  # finalists only
                    ms *= factor
            per_run = [ms * next((f for k, f in (flaky or {}).items() if k in str(d) and d != dirs[0]), 1.0) if i == 1 else ms
                       for i in range(runs)]
            for b, s in at:
                first = first if first is not None else ms
                rows.append(Row.from_dict({
                    "model": str(d), "name": Path(d).name, "batch": b, "seq": s, "p50_ms": ms, "p90_ms": ms,
                    "p99_ms": ms, "mean_ms": ms, "throughput": b / ms * 1e3, "speedup": first / ms, "params": 0,
                    "runs_p50_ms": per_run, "speedup_min": first / max(per_run),
                    "slowest_run": {k: max(per_run) for k in ("p50_ms", "p90_ms", "p99_ms", "mean_ms")}}))
        return rows
    runs_asked: list = []
    timer.runs = runs_asked
    return timer


def _cfg(data, budget, **extra):
    base = {"task": "sst2", "budget": budget, "backends": ["torch"], "data_dir": str(data), "max_length": 32,
            "probes": 4, "candidates": 3, "rounds": 2, "epochs": 1, "lr": 1e-3, "repeats": 2, "max_drop": None,
            "cache": True}
    base.pop("cache")
    base.update(extra)
    return from_dict(AutoConfig, base)


def test_finalists_start_from_each_shape_best_round():
    nan = float("nan")
    entries = [{"label": "4L", "round": 0, "score": 80.27}, {"label": "4L", "round": 1, "score": 84.09},
               {"label": "4L", "round": 2, "score": 83.75}, {"label": "3L", "round": 0, "score": 80.0},
               {"label": "3L", "round": 1, "score": 80.0}, {"label": "2L", "round": 0, "score": 76.0},
               {"label": "2L", "round": 1, "score": nan}]
    best = best_round(entries)
    assert (best["4L"]["round"], best["3L"]["round"], best["2L"]["round"]) == (1, 1, 0)  # best; ties: later; never NaN


def test_time_limit_and_grid():
    assert parse_minutes("90m") == 90 and parse_minutes("1.5h") == 90 and parse_minutes("600s") == 10 and parse_minutes("45") == 45
    for bad in ("", "-5m", "ten minutes", "0"):
        with pytest.raises(CompressError, match="time-limit"):
            parse_minutes(bad)

    class C:  # a MiniLM-like teacher: 6 layers, 384 wide, 12 heads of 32, FFN 4x
        hidden_size, num_attention_heads, num_hidden_layers, intermediate_size = 384, 12, 6, 1536
        model_type = "bert"

    shapes = candidate_shapes(C)
    assert {s.hidden for s in shapes} == {384, 288, 192, 128} and {s.layers for s in shapes} == {1, 2, 3, 4, 6}
    assert all(s.hidden // s.heads == 32 for s in shapes)
    # every depth x width twice: the teacher's FFN ratio (4x) and half of it (2x), labels distinct
    assert sorted({s.ffn // s.hidden for s in shapes}) == [2, 4] and len(shapes) == 2 * 4 * 5 == len({s.label for s in shapes})
    assert {"3L-384-768", "2L-384", "1L-128-256"} <= {s.label for s in shapes}
    wider = Shape(2, 512, 16, 2048)  # more parameters than 2L-384, but no teacher weights to start from
    ranked = rank_by_prior([*shapes, wider], C)
    assert [s.label for s in ranked[:3]] == ["6L-384", "6L-384-768", "4L-384"]  # cut from the teacher first, by parameters, then depth
    order = [s.label for s in ranked]
    assert order.index("3L-384-768") == order.index("2L-384") - 1  # the same parameters: the deeper first
    assert ranked[-1] == wider
    named = candidate_shapes(C, ("2L-384", "3L-192", "1L-100"))
    assert [(s.label, s.heads) for s in named] == [("2L-384", 12), ("3L-192", 6), ("1L-100", 1)]  # 32-wide heads where they fit
    fit, held = probe_shapes(shapes, 8)
    assert len(fit) == 8 and len(held) == 3 and not set(fit) & set(held)
    sizes = sorted(s.layers * s.hidden**2 for s in shapes)
    assert min(s.layers * s.hidden**2 for s in fit) == sizes[0] and max(s.layers * s.hidden**2 for s in fit) == sizes[-1]


@pytest.mark.versions
@pytest.mark.e2e
def test_search_chooses_the_most_accurate_model_that_meets_the_budget(teacher, tmp_path):
    teacher_dir, data = teacher
    calls: list = []
    timer = fake_timer(calls=calls)
    out = auto(teacher_dir, tmp_path / "out", _cfg(data, "p50<=2.2ms@b1,s32"), timer=timer)
    report = json.loads((out / "search" / "search.json").read_text())
    chosen = next(r for r in report["results"] if r["name"] == report["chosen"]["name"])
    assert chosen["measured_p50_ms"] <= 2.2 and all(chosen["meets"].values())
    fitting = [r for r in report["results"] if all(r["meets"].values())]
    assert chosen["accuracy"] == max(r["accuracy"] for r in fitting)
    assert (out / "config.json").is_file() and (out / "search" / "report.md").is_file() and (out / "search" / "pareto.png").is_file()
    # The probe's held-out shapes are predicted exactly by a model fitted on a linear (noiseless) timer.
    assert report["latency_model_error"]["worst"] < 1.0
    # Round 0 trained every shortlisted shape; round 1 continued those in the best half of their rung when they reached it
    # (asynchronous successive halving: the first always, ties too), each candidate one Optuna trial.
    rounds = [t["round"] for t in report["trained"]]
    assert rounds.count(0) == 3 and 1 <= rounds.count(1) <= 3
    assert sorted(t["label"] for t in report["trials"]) == sorted({t["label"] for t in report["trained"]})
    # the probe run (teacher first), the teacher again after it, and one final run (teacher first)
    assert len(calls) == 3 and calls[1] == [str(teacher_dir)] and str(teacher_dir) == calls[0][0] == calls[2][0]
    assert timer.runs == [2, 1, 3]  # the probe in 2 runs, the final run repeated --final-runs times (default 3)
    assert chosen["slowest_p50_ms"] == chosen["measured_p50_ms"]  # a noiseless timer: every run alike
    assert not (tmp_path / ".out.auto-tmp").exists()
    # the teacher (2 layers x 64: 1 + 0.05 x 2 x 4 = 1.40 ms) as the final runs and the probe timed it
    assert "torch fp32: 1.40 ms in the final runs, 1.40 ms in the latency probe)" in (out / "search" / "report.md").read_text()


@pytest.mark.e2e
def test_given_models_are_measured_in_the_final_run_and_reported_never_chosen(teacher, tmp_path):
    teacher_dir, data = teacher
    calls: list = []
    out = auto(teacher_dir, tmp_path / "out", _cfg(data, "p50<=2.2ms@b1,s32", compare=[str(teacher_dir)]),
               timer=fake_timer(calls=calls))
    report = json.loads((out / "search" / "search.json").read_text())
    assert calls[2][-1] == str(teacher_dir)  # measured in the final run, after the finalists
    given = report["compared"][-1]
    # the teacher's dev accuracy from its metrics.json; the fake timer's 1 + 0.05 * 2 layers * 64/16 = 1.4 ms
    from compress.core.formats.records import read_metrics

    teacher_dev = next(r for r in reversed(read_metrics(teacher_dir)) if r.get("kind") == "eval")
    assert given["accuracy"] == teacher_dev["metrics"]["accuracy"] and given["measured_p50_ms"] == pytest.approx(1.4)
    assert given["meets"] == {"p50<=2.2ms@b1,s32": True} and report["chosen"]["dir"] != str(teacher_dir)
    assert "## Beside the teacher and the given models" in (out / "search" / "report.md").read_text()
    with pytest.raises(CompressError, match="missing"):
        _cfg(data, "p50<=2ms@b1,s32", compare=[str(tmp_path / "missing")]).validate()


@pytest.mark.e2e
def test_a_model_slower_than_predicted_is_not_chosen(teacher, tmp_path):
    teacher_dir, data = teacher
    # Every torch-fp32 finalist (a trained candidate folder) measures 3x its prediction at the end: only int8 can fit.
    out = auto(teacher_dir, tmp_path / "out", _cfg(data, "p50<=2.2ms@b1,s32"), timer=fake_timer(slow={"candidates": 3.0}))
    report = json.loads((out / "search" / "search.json").read_text())
    assert report["chosen"]["name"].endswith("torch-int8")
    assert all(r["measured_p50_ms"] > 2.2 for r in report["results"] if r["name"].endswith("torch-fp32"))


@pytest.mark.e2e
def test_a_model_that_misses_the_budget_in_one_final_run_is_not_chosen(teacher, tmp_path):
    teacher_dir, data = teacher
    # Every torch-fp32 finalist measures 3x in the second of three final runs: its median still fits, its worst does not.
    out = auto(teacher_dir, tmp_path / "out", _cfg(data, "p50<=2.2ms@b1,s32"), timer=fake_timer(flaky={"candidates": 3.0}))
    report = json.loads((out / "search" / "search.json").read_text())
    fp32 = [r for r in report["results"] if r["name"].endswith("torch-fp32")]
    assert fp32 and all(r["measured_p50_ms"] <= 2.2 < r["slowest_p50_ms"] and not any(r["meets"].values()) for r in fp32)
    assert report["chosen"]["name"].endswith("torch-int8")
    assert "slowest run p50 ms" in (out / "search" / "report.md").read_text()
    # one final run: the flaky run never happens and fp32 can be chosen again
    single = auto(teacher_dir, tmp_path / "one", _cfg(data, "p50<=2.2ms@b1,s32", final_runs=1),
                  timer=fake_timer(flaky={"candidates": 3.0}))
    assert any(r["meets"]["p50<=2.2ms@b1,s32"] for r in json.loads((single / "search" / "search.json").read_text())["results"]
               if r["name"].endswith("torch-fp32"))


@pytest.mark.e2e
def test_when_every_finalist_misses_the_other_candidates_are_timed_in_a_second_run(teacher, tmp_path):
    teacher_dir, data = teacher
    # The first final run measures every finalist 10x slower than predicted; the second run is exact.
    timers = [fake_timer(), fake_timer(), fake_timer(slow={"": 10.0}), fake_timer()]  # probe, its teacher again, 2 runs
    calls: list = []

    def timer(dirs, at, repeats, runs):
        calls.append([str(d) for d in dirs])
        return timers[min(len(calls) - 1, 3)](dirs, at, repeats, runs)

    out = auto(teacher_dir, tmp_path / "out", _cfg(data, "p50<=2.2ms@b1,s32"), timer=timer)
    report = json.loads((out / "search" / "search.json").read_text())
    first = [r for r in report["results"] if not r.get("second_run")]
    second = [r for r in report["results"] if r.get("second_run")]
    assert first and not any(r["meets"]["p50<=2.2ms@b1,s32"] for r in first)
    trained = {t["label"] for t in report["trained"]}
    finalists = {r["label"] for r in first}
    # every trained shape that was not a finalist, in the second run only, after the teacher
    assert {r["label"] for r in second} == trained - finalists and len(calls) == 4 and calls[3][0] == str(teacher_dir)
    chosen = next(r for r in report["results"] if r["name"] == report["chosen"]["name"])
    assert chosen.get("second_run") and chosen["meets"]["p50<=2.2ms@b1,s32"]
    assert "(second run)" in (out / "search" / "report.md").read_text()


@pytest.mark.e2e
def test_a_probe_sample_slowed_in_one_run_is_taken_at_its_fastest_run(teacher, tmp_path):
    teacher_dir, data = teacher
    exact = fake_timer()

    def timer(dirs, at, repeats, runs):  # the probe's second run 3x slow for every shape: the median would be 2x
        rows = exact(dirs, at, repeats, runs)
        out = []
        for r in rows:
            if "probe" in r.model and runs == 2:
                per_run = (r.p50_ms, 3 * r.p50_ms)
                r = replace(r, runs_p50_ms=per_run, p50_ms=float(np.median(per_run)))
            out.append(r)
        return out

    with pytest.raises(CompressError, match="no student shape is predicted"):  # stop after the probe
        auto(teacher_dir, tmp_path / "out", _cfg(data, "p50<=0.5ms@b1,s32"), timer=timer)
    probe = json.loads((work_dir_for(tmp_path / "out") / "state.json").read_text())["probe"]
    for sample in probe["samples"]:  # exactly the noiseless timer's 1 ms + 0.05 ms per layer x width unit (int8: half)
        shape = sample["shape"]
        expected = 1.0 + 0.05 * shape["layers"] * shape["hidden"] / 16 * (0.5 if "int8" in sample["variant"] else 1.0)
        assert sample["ms"] == pytest.approx(expected)
    assert probe["error"]["worst"] < 1.0


@pytest.mark.e2e
def test_nothing_fits_names_the_fastest_model_measured(teacher, tmp_path):
    teacher_dir, data = teacher
    with pytest.raises(CompressError, match=r"the fastest model probed was .* at 1\.\d\d ms"):
        auto(teacher_dir, tmp_path / "none", _cfg(data, "p50<=0.5ms@b1,s32"), timer=fake_timer())
    with pytest.raises(CompressError, match=r"nothing measured meets .* the fastest was .* ms"):
        auto(teacher_dir, tmp_path / "late", _cfg(data, "p50<=2.2ms@b1,s32"), timer=fake_timer(slow={"": 10.0}))
    assert not (tmp_path / "none").exists() or not any((tmp_path / "none").iterdir())


@pytest.mark.e2e
def test_a_slow_spell_during_the_teachers_probe_timing_does_not_loosen_speedup_budgets(teacher, tmp_path):
    teacher_dir, data = teacher
    exact, calls = fake_timer(), []

    def timer(dirs, at, repeats, runs):  # the probe's first timing of the teacher 3x slow (4.20 ms instead of 1.40)
        calls.append(len(calls))
        rows = exact(dirs, at, repeats, runs)
        return [replace(r, p50_ms=r.p50_ms * 3, runs_p50_ms=tuple(ms * 3 for ms in r.runs_p50_ms))
                if len(calls) == 1 and r.model == str(teacher_dir) else r for r in rows]

    # The fastest probe shape, 1L-32 as torch int8, takes 1 + 0.05 x 1 x 32/16 x 0.5 = 1.05 ms: 1.33x the true 1.40 ms,
    # 4.0x the slow one. 1.5x is out of reach, and the search says so before training anything.
    with pytest.raises(CompressError, match="no student shape is predicted to meet speedup>=1.5x"):
        auto(teacher_dir, tmp_path / "out", _cfg(data, "speedup>=1.5x@b1,s32", margin=0.0), timer=timer)
    probe = json.loads((work_dir_for(tmp_path / "out") / "state.json").read_text())["probe"]
    assert probe["teacher_timings"]["1,32"] == [pytest.approx(4.2), pytest.approx(1.4)]
    assert probe["teacher"]["1,32"] == pytest.approx(1.4) and len(calls) == 2


@pytest.mark.e2e
def test_resume_trains_no_finished_candidate_again(teacher, tmp_path, monkeypatch):
    teacher_dir, data = teacher
    cfg = _cfg(data, "p50<=2.2ms@b1,s32")

    def crash(dirs, at, repeats, runs):
        if len(dirs) > 1 and not any("probe" in str(d) for d in dirs):  # the final run (not the probe's teacher again)
            raise RuntimeError("power cut")
        return fake_timer()(dirs, at, repeats, runs)

    with pytest.raises(RuntimeError):
        auto(teacher_dir, tmp_path / "out", cfg, timer=crash)
    trained = []
    real = auto_targets.distill

    def counting(*args, **kwargs):
        trained.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(auto_targets, "distill", counting)
    probed = []
    out = auto(teacher_dir, tmp_path / "out", AutoConfig(**{**cfg.__dict__, "resume": True}), timer=fake_timer(calls=probed))
    assert trained == [] and len(probed) == 1  # no candidate trained, no probe re-timed: only the final measurement
    assert (out / "config.json").is_file()


@pytest.mark.e2e
def test_init_from_starts_the_candidates_that_fit_inside_it(teacher, tmp_path):
    from compress.core.model.shapes import resolve_shape
    from compress.teacher.create import create_model

    teacher_dir, data = teacher
    # a 1-layer encoder (say, a general-distilled student): 1-layer candidates are cut from it, 2-layer ones from the teacher
    general = create_model(resolve_shape("1L-64-128-4H"), tmp_path / "general", tokenizer=teacher_dir,
                           max_positions=64, seed=2)
    cfg = _cfg(data, "p50<=9ms@b1,s32", shapes=["2L-64-128-4H", "1L-64-128-4H", "1L-32-64-2H"], candidates=3, rounds=1, init_from=str(general))
    out = auto(teacher_dir, tmp_path / "out", cfg, timer=fake_timer())
    trained = {t["label"]: t["init"] for t in json.loads((out / "search" / "search.json").read_text())["trained"]}
    assert trained == {"2L-64-128": "teacher", "1L-64-128": str(general), "1L-32-64": str(general)}
    with pytest.raises(CompressError, match=f"--init-from {tmp_path} is not a model directory"):
        _cfg(data, "p50<=9ms@b1,s32", init_from=str(tmp_path)).validate()


def test_a_round_that_cannot_finish_before_the_time_limit_is_not_started(tmp_path):
    import time

    search = SearchState(tmp_path, {"trained": {"x/0": {"label": "x", "round": 0, "epochs": 1, "seconds": 60.0},
                                                        "y/0": {"label": "y", "round": 0, "epochs": 1, "seconds": 20.0}}})
    now = time.monotonic()
    none = Earlier(None, {})
    shapes = {"x": Shape(2, 64, 4, 128), "y": Shape(1, 64, 4, 128), "z": Shape(1, 64, 4, 128)}
    assert not auto_halving.affordable(1, [("x", 2), ("y", 2)], search, none, now + 150, shapes)  # 2 x 60 + 2 x 20 = 160 s
    assert auto_halving.affordable(1, [("x", 2), ("y", 2)], search, none, now + 170, shapes)
    assert not auto_halving.affordable(0, [("z", 1)], search, none, now - 1, shapes)  # past the limit: nothing starts
    # z, never trained, is priced per parameter at the median of x's and y's rates (x's is 1.5x y's): 25 s per epoch, 100 s
    assert not auto_halving.affordable(0, [("z", 4)], search, none, now + 90, shapes)
    assert auto_halving.affordable(0, [("z", 4)], search, none, now + 110, shapes)
    # what an earlier search trained alike costs nothing: it is copied
    earlier = Earlier(None, {("x", 1, 2): {"label": "x", "round": 1, "epochs": 2, "seconds": 120.0}})
    assert auto_halving.affordable(1, [("x", 2), ("y", 2)], search, earlier, now + 50, shapes)


def test_a_round_cut_to_one_keeps_the_round_befores_runner_up_as_a_finalist():
    latest = {"a": 0.7, "b": 0.9, "c": 0.8}
    assert auto_halving.with_runner_up((("a", "b", "c"), ("b",)), latest) == ["b", "c"]
    assert auto_halving.with_runner_up((("a", "b", "c"), ("a", "b")), latest) == ["a", "b"]
    assert auto_halving.with_runner_up((("b",),), latest) == ["b"]


def test_models_an_earlier_search_trained_further_join_the_finalists_when_they_fit_and_score_higher(tmp_path):
    def entry(label, round_, score):
        folder = tmp_path / "earlier" / f"{label}-r{round_}"
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
        return {"label": label, "round": round_, "epochs": 2**round_, "score": score, "dir": str(folder), "teacher": 1.0,
                "seconds": 1.0, "init": "teacher"}

    earlier = Earlier(None, {(e["label"], e["round"], e["epochs"]): e for e in (
        entry("X", 0, 0.70), entry("X", 2, 0.90),  # X's best round counts
        entry("W", 1, 0.92), entry("W", 2, 0.60),  # W's too, though its latest scored lower
        entry("Y", 1, 0.95),  # predicted not to fit this budget
        entry("Z", 1, 0.50),  # below every finalist of this search
        entry("F", 1, 0.99),  # a finalist already
    )})
    (tmp_path / "work").mkdir()
    search = SearchState(tmp_path / "work", {"trained": {"F/0": {"label": "F", "round": 0, "score": 0.6},
                                                                 "F/1": {"label": "F", "round": 1, "score": 0.8},
                                                                 "G/1": {"label": "G", "round": 1, "score": 0.99}}})
    predicted = {"X": {"variants": ["openvino-int8"]}, "Y": {"variants": []}, "Z": {"variants": ["openvino-int8"]},
                 "F": {"variants": ["openvino-int8"]}, "W": {"variants": ["openvino-int8"]}}
    # W (.92) and X (.90) beat F's best round (.8), the weakest finalist, though not G; Z (.5) beats none
    assert auto_halving.earlier_finalists(earlier, ["F", "G"], predicted, search) == ["W", "X"]
    assert search.state["trained"]["W/1"]["score"] == 0.92 and "W/2" not in search.state["trained"]
    adopted = search.state["trained"]["X/2"]
    assert adopted["score"] == 0.90 and adopted["reused_from"].endswith("X-r2")
    assert (Path(adopted["dir"]) / "config.json").is_file() and Path(adopted["dir"]).parent == tmp_path / "work" / "candidates"


@pytest.mark.e2e
def test_a_resumed_search_that_trains_further_quantizes_the_best_round(teacher, tmp_path):
    teacher_dir, data = teacher
    cfg = _cfg(data, "p50<=2.2ms@b1,s32", rounds=1)
    auto(teacher_dir, tmp_path / "out", cfg, timer=fake_timer())
    out = auto(teacher_dir, tmp_path / "out", AutoConfig(**{**cfg.__dict__, "rounds": 2, "resume": True}), overwrite=True,
               timer=fake_timer())
    report = json.loads((out / "search" / "search.json").read_text())
    assert {t["round"] for t in report["trained"]} == {0, 1}
    int8 = [r for r in report["results"] if r["variant"] == "torch-int8"]
    for r in int8:  # made from the label's best-scoring round (the later on a tie), named by it
        rounds = [t for t in report["trained"] if t["label"] == r["label"]]
        best = max(rounds, key=lambda t: (t["score"], t["round"]))["round"]
        assert f"{r['label']}-r{best}-torch-int8" == Path(r["dir"]).name
    assert int8


@pytest.mark.e2e
def test_another_budget_reuses_the_probe_and_the_candidates_trained_with_the_same_settings(teacher, tmp_path, monkeypatch):
    teacher_dir, data = teacher
    first = auto(teacher_dir, tmp_path / "a", _cfg(data, "p50<=2.2ms@b1,s32"), timer=fake_timer())
    before = {(t["label"], t["round"], t["epochs"]) for t in json.loads((first / "search" / "search.json").read_text())["trained"]}
    trained, calls = [], []
    real = auto_targets.distill

    def counting(*args, **kwargs):
        trained.append(Path(args[1]).name)
        return real(*args, **kwargs)

    monkeypatch.setattr(auto_targets, "distill", counting)
    out = auto(teacher_dir, tmp_path / "b", _cfg(data, "p50<=2.6ms@b1,s32", reuse=[str(tmp_path / "a")]),
               timer=fake_timer(calls=calls))
    report = json.loads((out / "search" / "search.json").read_text())
    assert len(calls) == 1 and report["probe_reused_from"] == str(tmp_path / "a")  # only the final run was timed
    for t in report["trained"]:  # reused exactly when the first search trained (shape, round, epochs)
        assert bool(t.get("reused_from")) == ((t["label"], t["round"], t["epochs"]) in before)
    fresh = [f"{t['label']}-r{t['round']}" for t in report["trained"] if not t.get("reused_from")]
    assert sorted(trained) == sorted(fresh) and len(fresh) < len(report["trained"])
    assert "(an earlier search's)" in (out / "search" / "report.md").read_text()
    # Other training settings: the probe is still reused, no candidate is.
    trained.clear()
    other = auto(teacher_dir, tmp_path / "c", _cfg(data, "p50<=2.6ms@b1,s32", lr=5e-4, reuse=[str(tmp_path / "a")]),
                 timer=fake_timer())
    report = json.loads((other / "search" / "search.json").read_text())
    assert report["probe_reused_from"] and not any(t.get("reused_from") for t in report["trained"])
    assert len(trained) == len(report["trained"])
    with pytest.raises(CompressError, match="no search was found"):
        _cfg(data, "p50<=2ms@b1,s32", reuse=[str(tmp_path / "nowhere")]).validate()


def test_bad_budgets_are_refused_before_any_work(teacher, tmp_path):
    teacher_dir, data = teacher
    for bad, piece in (("p50>=6ms", ">="), ("latency<=6ms", "latency"), ("", "no budget")):
        with pytest.raises(CompressError, match=piece):
            auto(teacher_dir, tmp_path / "x", _cfg(data, bad), timer=fake_timer())
    with pytest.raises(CompressError, match="unknown backend"):
        _cfg(data, "size<=20MB", backends=["tensorrt"]).validate()
    with pytest.raises(CompressError, match="--tie must be 0"):
        _cfg(data, "size<=20MB", tie=-0.5).validate()
    assert not (tmp_path / "x").exists()


def test_shape_dataclass_round_trip():
    s = Shape(3, 384, 12, 1536)
    assert Shape(**{k: v for k, v in s.__dict__.items() if k != "origin"}) == s


def test_the_default_timer_takes_turns_in_bursts_unless_it_times_dozens(monkeypatch, tmp_path):
    """The final run's few models are timed in bursts (all loaded at once); the probe's dozens one after another."""
    seen = []
    monkeypatch.setattr(auto_probe, "measure_latency", lambda dirs, cfg: seen.append((len(dirs), cfg.bursts, cfg.repeat_runs)) or {"rows": []})
    auto_probe.measured_latency([tmp_path] * 6, [(1, 128)], repeats=40, runs=3)
    auto_probe.measured_latency([tmp_path] * 40, [(1, 128)], repeats=20, runs=1)
    auto_probe.measured_latency([tmp_path] * 2, [(1, 128)], repeats=3, runs=1)
    assert seen == [(6, auto_probe.BURSTS, 3), (40, 1, 1), (2, 3, 1)]  # never more bursts than passes


# ---------------------------------------------------------------------------- a user's own task


@pytest.fixture(scope="module")
def ner_teacher(tmp_path_factory):
    """A tiny tagger fine-tuned on generated CoNLL files (token classification: the task travels in its folder)."""
    from compress.teacher.finetune import FinetuneConfig, finetune
    from tests.conftest import make_tiny_model, make_tokenizer, save_tiny
    from tests.own_data import own_task_files

    root = tmp_path_factory.mktemp("auto-ner")
    files = own_task_files(root / "data")["token-classification"]
    base = save_tiny(make_tiny_model(head="base"), make_tokenizer(root / "tok"), root / "base")
    cfg = from_dict(FinetuneConfig, {"task": "token-classification", "task_name": "ner", "train_file": str(files["train"]),
                                     "dev_file": str(files["dev"]), "epochs": 3, "lr": 1e-3, "max_length": 32})
    return finetune(base, root / "teacher", cfg), files


@pytest.mark.e2e
def test_a_search_on_the_teachers_own_task_needs_no_task_name(ner_teacher, tmp_path):
    from compress.core.formats.artifacts import saved_head
    from compress.core.formats.records import read_compression, read_metrics

    teacher_dir, files = ner_teacher
    cfg = from_dict(AutoConfig, {"budget": "p50<=1.15ms@b1,s32", "backends": ["torch"], "train_file": str(files["train"]),
                                 "dev_file": str(files["dev"]), "max_length": 32, "probes": 3, "candidates": 2, "rounds": 1,
                                 "epochs": 1, "lr": 1e-3, "repeats": 2, "max_drop": None, "final_runs": 1})
    out = auto(teacher_dir, tmp_path / "out", cfg, timer=fake_timer())
    report = json.loads((out / "search" / "search.json").read_text())
    assert report["task"] == "ner" and report["chosen"] and "compress auto: ner," in (out / "search" / "report.md").read_text()
    chosen = next(r for r in report["results"] if r["name"] == report["chosen"]["name"])
    assert chosen["measured_p50_ms"] <= 1.15 and all(chosen["meets"].values())
    # The chosen folder is a tagger of the teacher's task; every candidate was distilled and scored on it (entity F1).
    assert saved_head(out) == "token-classification" and read_compression(out)["task_spec"]["name"] == "ner"
    for trained in report["trained"]:
        dev = next(r for r in read_metrics(Path(trained["dir"])) if r["kind"] == "eval" and r["split"] == "dev")
        assert dev["task"] == "ner" and "entity_f1" in dev["metrics"]
    int8 = [r for r in report["results"] if r["variant"] == "torch-int8"]
    assert int8 and all(r["accuracy"] == next(e for e in read_metrics(Path(r["dir"])) if e["kind"] == "eval")["metrics"]["entity_f1"]
                        for r in int8)  # an int8 variant's score is its own, measured on the task's dev file
    teacher_row = report["compared"][0]
    assert teacher_row["accuracy"] == next(r for r in read_metrics(teacher_dir) if r["kind"] == "eval")["metrics"]["entity_f1"]
    # Without the task's files the search stops before any work: a user's task is trained on its files.
    with pytest.raises(CompressError, match="your own token-classification task ner: pass its --train-file"):
        auto(teacher_dir, tmp_path / "nowhere", from_dict(AutoConfig, {"budget": "size<=20MB"}), timer=fake_timer())
    assert not (tmp_path / "nowhere").exists()
