"""bench.peers.run: the one scorer, the Pareto front and the goal verdicts, on hand-made numbers (no model is loaded)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr

from bench.peers.run import FULL, PeersConfig, parse, timing_sample
from bench.peers import build
from bench.peers.build import STUDENT_VARIANTS, TEACHER_VARIANTS, Ctx, export_command, outputs, step_key
from bench.peers.contenders import BY_NAME, CONTENDERS, PEER, STEPS, TOOLKIT, select
from bench.peers.render import precision_line, render
from bench.peers.report import agreement, make_plan, pareto_front, peer_verdict, runtime_ratios, score, verdicts
from bench.peers.worker import _mean_normalise, embed_file, time_calls


def row(name, side, spearman, b1, b32, **extra):
    return {"name": name, "side": side, "label": name, "precision": "fp32", "venv": "main", "status": "ok",
            "spearman": spearman, "b1": b1, "b32": b32, **extra}


# ---------------------------------------------------------------------------- the scorer


def test_the_scorer_matches_scipy_on_hand_made_vectors():
    rng = np.random.default_rng(0)
    stsb = [("a", "b", 4.0), ("c", "d", 1.0), ("a", "e", 3.0), ("f", "b", 0.5), ("g", "c", 2.5)]
    mrpc = [("q1", "b", 1), ("q2", "x", 0), ("q3", "y", 1), ("a", "z", 1)]
    plan = make_plan(stsb, mrpc)
    assert plan.texts[:7] == ["a", "c", "f", "g", "b", "d", "e"]  # distinct: sentence1s, then sentence2s not seen
    assert len(plan.texts) == len(set(plan.texts))
    vectors = rng.normal(size=(len(plan.texts), 6)).astype(np.float32)
    at = {t: i for i, t in enumerate(plan.texts)}

    def cos(x, y):
        x, y = vectors[at[x]].astype(np.float64), vectors[at[y]].astype(np.float64)
        return x @ y / np.linalg.norm(x) / np.linalg.norm(y)

    cosines = [cos(a, b) for a, b, _ in stsb]
    gold = [s for _, _, s in stsb]
    got = score(vectors, plan)
    assert got["spearman"] == pytest.approx(100 * spearmanr(cosines, gold)[0])
    assert got["pearson"] == pytest.approx(100 * pearsonr(cosines, gold)[0])
    # MRPC: each positive pair's sentence1 ranks the distinct sentence2s (b, x, y, z); rank 1 + strictly better ones.
    candidates = ["b", "x", "y", "z"]
    ranks = [1 + sum(cos(q, c) > cos(q, own) for c in candidates) for q, own, label in mrpc if label]
    assert got["recall_at_1"] == pytest.approx(100 * np.mean([r == 1 for r in ranks]))
    assert got["mrr"] == pytest.approx(100 * np.mean([1 / r for r in ranks]))


def test_a_perfect_embedding_scores_100_and_agreement_reads_cosines():
    stsb = [("a", "b", 1.0), ("c", "d", 2.0), ("e", "f", 3.0)]
    plan = make_plan(stsb, [("a", "b", 1)])
    angles = {"a": 0, "b": 1.2, "c": 0, "d": 0.8, "e": 0, "f": 0.1}  # closer pairs have higher gold scores
    vectors = np.array([[np.cos(angles[t]), np.sin(angles[t])] for t in plan.texts], dtype=np.float32)
    assert score(vectors, plan)["spearman"] == pytest.approx(100.0)
    same = agreement(vectors * 3.0, vectors)  # the length does not matter
    assert same["mean"] == pytest.approx(1.0) and same["min"] == pytest.approx(1.0) and same["n"] == len(vectors)
    assert agreement(vectors[:, :1], vectors) is None  # another width: no comparison


def test_the_workers_pooling_batching_and_timing_keep_the_order():
    hidden = np.array([[[1.0, 0.0], [3.0, 0.0], [100.0, 100.0]]], dtype=np.float32)  # the third token is padding
    assert _mean_normalise(hidden, np.array([[1, 1, 0]])) == pytest.approx(np.array([[1.0, 0.0]]))
    texts = ["bb", "a", "dddd", "ccc"]
    calls = []

    def embed(chunk):
        calls.append(list(chunk))
        return np.array([[len(t), 1.0] for t in chunk], dtype=np.float32)

    out = embed_file(embed, texts, batch=3)
    assert calls == [["dddd", "ccc", "bb"], ["a"]]  # longest first
    assert out[:, 0].tolist() == [2, 1, 4, 3]  # rows back in the texts' order
    calls.clear()
    assert len(time_calls(embed, texts, 1)) == 4 and calls == [["bb"], ["a"], ["dddd"], ["ccc"]]
    calls.clear()
    assert len(time_calls(embed, texts, 3)) == 2 and calls == [["bb", "a", "dddd"], ["ccc"]]


# ---------------------------------------------------------------------------- front and verdicts


def test_the_pareto_front_keeps_what_nothing_beats():
    rows = [row("slow-best", PEER, 86.0, 100, 500), row("fast-worse", TOOLKIT, 80.0, 1000, 5000),
            row("beaten", TOOLKIT, 85.0, 90, 400), row("tie-acc-faster", TOOLKIT, 86.0, 120, 450),
            row("middle", PEER, 84.0, 500, 1000), row("failed", PEER, None, None, None)]
    assert pareto_front(rows, "b1") == ["fast-worse", "middle", "tie-acc-faster"]
    assert pareto_front(rows, "b32") == ["fast-worse", "middle", "slow-best"]
    # Equal accuracy at the printed decimals and equal speed: neither beats the other.
    assert pareto_front([row("x", PEER, 86.001, 10, 10), row("y", TOOLKIT, 85.999, 10, 10)]) == ["x", "y"]


def test_a_peer_is_matched_only_by_a_toolkit_model_as_accurate_and_as_fast_at_both_batch_sizes():
    peer = row("ct2-int8", PEER, 86.0, 200, 900)
    toolkit = [row("fast-b1-only", TOOLKIT, 86.5, 300, 800), row("less-accurate", TOOLKIT, 85.9, 900, 9000),
               row("both", TOOLKIT, 86.0, 250, 950), row("both-faster", TOOLKIT, 86.2, 400, 1000)]
    v = peer_verdict(peer, toolkit)
    assert v["met"] and v["by"] == ["both-faster", "both"]
    miss = peer_verdict(peer, toolkit[:2])
    assert not miss["met"] and miss["by"] == []
    assert miss["as_accurate"]["name"] == "fast-b1-only"
    assert miss["as_accurate"]["b32_ratio"] == pytest.approx(800 / 900)
    assert miss["as_fast"] == {"name": "less-accurate", "points": pytest.approx(-0.1)}


def test_each_peer_is_judged_against_the_toolkits_best_of_its_precision_class_at_each_batch_size():
    ct2_fp32 = {**row("ct2-fp32", PEER, 86.72, 109, 166)}
    ct2_int8 = {**row("ct2-int8", PEER, 86.48, 108, 159), "precision": "int8"}
    toolkit = [row("tk-teacher-fused", TOOLKIT, 86.72, 118, 81), row("tk-teacher-ct2", TOOLKIT, 86.72, 120, 170),
               row("tk-3L-ct2", TOOLKIT, 85.54, 300, 400),
               {**row("tk-teacher-fused-int8", TOOLKIT, 86.60, 144, 85), "precision": "int8"},
               {**row("tk-teacher-ct2-int8", TOOLKIT, 86.50, 125, 175), "precision": "int8"},
               {**row("tk-int8-faster-than-all", TOOLKIT, 86.90, 500, 900), "precision": "int8"}]
    fp32 = peer_verdict(ct2_fp32, toolkit[:5])
    assert fp32["class"] == "float" and fp32["met"] and fp32["by"] == ["tk-teacher-ct2"]
    assert fp32["b1"] == {"met": True, "best": "tk-teacher-ct2", "ratio": pytest.approx(120 / 109)}
    assert fp32["b32"] == {"met": True, "best": "tk-teacher-ct2", "ratio": pytest.approx(170 / 166)}
    # An int8 model faster and more accurate than every float one does not match a float peer.
    assert peer_verdict(ct2_fp32, toolkit)["by"] == ["tk-teacher-ct2"]
    int8 = peer_verdict(ct2_int8, toolkit[:5])
    assert int8["class"] == "int8" and int8["by"] == ["tk-teacher-ct2-int8"]  # the fp32 tk-teacher-ct2 takes no part
    assert int8["b1"] == {"met": True, "best": "tk-teacher-fused-int8", "ratio": pytest.approx(144 / 108)}
    assert int8["b32"] == {"met": True, "best": "tk-teacher-ct2-int8", "ratio": pytest.approx(175 / 159)}
    slower = peer_verdict({**ct2_int8, "b32": 180}, toolkit[:5])
    assert not slower["met"] and slower["b1"]["met"]
    assert slower["b32"] == {"met": False, "best": "tk-teacher-ct2-int8", "ratio": pytest.approx(175 / 180)}
    alone = peer_verdict(ct2_int8, toolkit[:3])  # no int8 toolkit model: unmatched though the fp32 ones beat it
    assert not alone["met"] and alone["b1"] == alone["b32"] == {"met": False, "best": None}
    assert "as_accurate" not in alone and "as_fast" not in alone
    goal = verdicts([ct2_fp32, ct2_int8, *toolkit[:5]])
    assert goal["peers"]["met"] and [v["by"] for v in goal["peers"]["each"]] == [["tk-teacher-ct2"], ["tk-teacher-ct2-int8"]]
    from bench.peers.render import goal_lines

    text = "\n".join(goal_lines(goal, [ct2_fp32, ct2_int8, *toolkit[:5]]))
    assert ("- ct2-int8 (int8; 86.48, 108 / 159 sent/s): b1 matched (best as accurate: tk-teacher-fused-int8, 1.33x); "
            "b32 matched (best as accurate: tk-teacher-ct2-int8, 1.10x); matched at both by tk-teacher-ct2-int8") in text


def test_each_toolkit_runtime_is_held_to_90_percent_of_the_fastest_peer_of_its_class_on_the_same_weights():
    from bench.peers.render import runtime_lines

    rows = [row("ort-fused", PEER, 86.72, 243, 213, model="teacher"), row("ct2-fp32", PEER, 86.72, 132, 383, model="teacher"),
            {**row("ct2-int8", PEER, 86.54, 116, 668, model="teacher"), "precision": "int8"},
            row("model2vec", PEER, 79.19, 7802, 15781, model="static"),  # other weights: never the reference
            row("tk-teacher-fused", TOOLKIT, 86.72, 219, 316, model="teacher"),
            row("tk-teacher-ct2", TOOLKIT, 86.72, 80, 372, model="teacher"),
            {**row("tk-teacher-ct2-int8", TOOLKIT, 86.54, 127, 724, model="teacher"), "precision": "int8"},
            row("tk-3L-fused", TOOLKIT, 84.47, 394, 610, model="3L")]  # a student: not the peers' weights
    ratios = {r["name"]: r for r in runtime_ratios(rows)}
    assert sorted(ratios) == ["tk-teacher-ct2", "tk-teacher-ct2-int8", "tk-teacher-fused"]
    fused = ratios["tk-teacher-fused"]
    assert fused["b1"] == {"peer": "ort-fused", "ratio": pytest.approx(219 / 243), "met": True}  # 0.901
    assert fused["b32"] == {"peer": "ct2-fp32", "ratio": pytest.approx(316 / 383), "met": False}  # 0.825
    assert ratios["tk-teacher-ct2-int8"]["b1"]["peer"] == "ct2-int8" and ratios["tk-teacher-ct2-int8"]["b32"]["met"]
    text = "\n".join(runtime_lines(rows))
    assert "| tk-teacher-fused | float | 0.90x ort-fused | 0.83x ct2-fp32 (below) |" in text
    assert "| tk-teacher-ct2 | float | 0.33x ort-fused (below) | 0.97x ct2-fp32 |" in text
    assert "Within 10% at both batch sizes: tk-teacher-ct2-int8." in text
    assert runtime_ratios([rows[4]])[0]["b1"] is None  # no peer of the class ran


def test_the_header_says_which_precisions_the_cpu_runs_natively_present_or_not():
    zen4 = {"bf16": True, "amx_bf16": False, "amx_int8": False, "vnni": True, "int8_preset": "avx512_vnni",
            "arch": "x86_64", "source": "/proc/cpuinfo flags"}
    assert precision_line(zen4) == (
        "- native precisions (compress.core.hardware, from /proc/cpuinfo flags): int8 dot products (AVX512-VNNI or "
        "AVX-VNNI) yes, bf16 (AVX512_BF16 or AMX-BF16) yes, AMX-BF16 no, AMX-INT8 no; ONNX Runtime's int8 preset "
        "avx512_vnni")


def test_the_goal_needs_every_peer_matched_and_the_static_student_judged_on_its_own_numbers():
    rows = [row("st-onnx", PEER, 86.7, 100, 400), row("model2vec", PEER, 70.0, 20000, 90000),
            row("tk-teacher-int8", TOOLKIT, 86.7, 150, 500),
            row("tk-static", TOOLKIT, 70.0, 25000, 80000), row("tk-static-refined", TOOLKIT, 72.5, 25000, 80000)]
    goal = verdicts(rows)
    assert not goal["peers"]["met"]  # model2vec is faster at batch 32 than any toolkit model as accurate
    assert [v["met"] for v in goal["peers"]["each"]] == [True, False]
    assert goal["static"]["met"] and goal["static"]["points"] == pytest.approx(0.0)
    assert goal["refine"] == {"met": True, "gain": 2.5, "static": 70.0, "refined": 72.5}
    rows[-2]["b32"] = rows[-1]["b32"] = 95000
    assert verdicts(rows)["peers"]["met"]
    rows[-1]["spearman"] = 71.99  # +1.99: short of 2 points
    assert verdicts(rows)["refine"]["met"] is False
    # A peer that failed is not quietly dropped: the goal is then unmet and it is named.
    failed = verdicts(rows + [{**row("ct2-fp32", PEER, None, None, None), "status": "failed: no"}])
    assert not failed["peers"]["met"] and failed["peers"]["missing"] == ["ct2-fp32"]
    nothing = verdicts([row("tk-static", TOOLKIT, 70.0, 1, 1)])
    assert nothing["static"]["met"] is None and nothing["refine"]["met"] is None


# ---------------------------------------------------------------------------- the plumbing's pure parts


def test_contenders_steps_and_selection():
    names = [c.name for c in CONTENDERS]
    assert len(names) == len(set(names))
    steps = [s.name for s in STEPS]
    assert all(c.step in steps for c in CONTENDERS)
    assert {c.side for c in CONTENDERS} == {PEER, TOOLKIT}
    models = {c.name: c.model for c in CONTENDERS}
    assert models["ct2-int8"] == models["tk-teacher-fused"] == "teacher" and models["tk-3L-ov-int8"] == "3L"
    assert models["model2vec"] == models["tk-static-refined-m2v"] == "static" and models["tk-teacher-static-int8"] == "teacher"
    assert [c.name for c in select(only=("ctranslate2",))] == ["ct2-fp32", "ct2-int8"]
    assert "tk-static" not in [c.name for c in select(skip=("tk-static",))]
    with pytest.raises(SystemExit, match="unknown contender"):
        select(only=("nope",))
    assert step_key("tk-3L", {"distill_sentences": 10, "rounds": 3})["distill_sentences"] == 10
    assert "rounds" not in step_key("tk-3L", {"rounds": 3})
    assert "toolkit/student-3L-384" in outputs("tk-3L") and outputs("st-torch") == []


def test_the_toolkits_ctranslate2_exports_are_selected_by_their_step_and_their_names():
    teacher = [c.name for c in select(only=("tk-teacher",))]
    assert teacher[-2:] == ["tk-teacher-ct2", "tk-teacher-ct2-int8"] and len(teacher) == 9
    cfg = parse(["--out", "x", "--only", "tk-teacher-ct2,tk-teacher-ct2-int8,tk-3L-ct2,tk-3L-ct2-int8"])
    chosen = select(cfg.only)
    assert [(c.name, c.step, c.precision, c.model, c.loader, c.side) for c in chosen] == [
        ("tk-teacher-ct2", "tk-teacher", "fp32", "teacher", "toolkit", TOOLKIT),
        ("tk-teacher-ct2-int8", "tk-teacher", "int8", "teacher", "toolkit", TOOLKIT),
        ("tk-3L-ct2", "tk-3L", "fp32", "3L", "toolkit", TOOLKIT),
        ("tk-3L-ct2-int8", "tk-3L", "int8", "3L", "toolkit", TOOLKIT)]
    assert "tk-3L-ct2-int8" in [c.name for c in select(only=("tk-3L",))]
    assert not any("ct2" in c.name for c in select(only=("tk-2L",)))
    assert "tk-teacher-ct2" not in [c.name for c in select(only=("tk-teacher",), skip=("tk-teacher-ct2",))]
    assert BY_NAME["tk-3L-ct2-int8"].label.endswith("compress export --format ctranslate2 --quantization int8")
    assert {"toolkit/teacher-ct2", "toolkit/teacher-ct2-int8"} <= set(outputs("tk-teacher"))
    assert {"toolkit/3L-ct2", "toolkit/3L-ct2-int8"} <= set(outputs("tk-3L"))
    assert not any("ct2" in path for path in outputs("tk-2L"))


def test_the_ctranslate2_contenders_are_made_by_compress_export_with_their_quantization(tmp_path, monkeypatch):
    from compress.cli import build_parser
    from compress.core.config import from_args
    from compress.export_config import ExportConfig

    calls = []
    monkeypatch.setattr(build, "run_cli", calls.append)
    wanted = ("tk-teacher-ct2", "tk-teacher-ct2-int8", "tk-3L-ct2-int8")
    ctx = Ctx(tmp_path, tmp_path / "data", tmp_path / "st", {"calibration_examples": 8}, "avx512_vnni", wanted)
    teacher, student = tmp_path / "toolkit" / "teacher-all-minilm-l6-v2", tmp_path / "toolkit" / "student-3L-384"
    records = build._toolkit_variants(ctx, teacher, "teacher", TEACHER_VARIANTS)
    assert list(records) == ["tk-teacher-ct2", "tk-teacher-ct2-int8"]  # the step makes only what the run selected
    records.update(build._toolkit_variants(ctx, student, "3L", STUDENT_VARIANTS["3L"]))
    out = tmp_path / "toolkit"
    assert calls == [
        ["export", "--model", str(teacher), "--out", str(out / "teacher-ct2"), "--format", "ctranslate2",
         "--quantization", "float32", "--overwrite"],
        ["export", "--model", str(teacher), "--out", str(out / "teacher-ct2-int8"), "--format", "ctranslate2",
         "--quantization", "int8", "--overwrite"],
        ["export", "--model", str(student), "--out", str(out / "3L-ct2-int8"), "--format", "ctranslate2",
         "--quantization", "int8", "--overwrite"]]
    assert records["tk-teacher-ct2-int8"]["made_with"] == "compress export --format ctranslate2 --quantization int8"
    assert records["tk-3L-ct2-int8"]["folder"] == str((out / "3L-ct2-int8").resolve())
    # The command is one the toolkit's own command line reads as it is.
    args = build_parser("export").parse_args(export_command(teacher, out / "x", "int8"))
    cfg = from_args(ExportConfig, args, None)
    assert (cfg.format, cfg.quantization, args.model, args.overwrite) == ("ctranslate2", "int8", str(teacher), True)
    # A folder already made is kept: no second export.
    (out / "teacher-ct2").mkdir(parents=True)
    (out / "teacher-ct2" / "compression.json").write_text("{}")
    calls.clear()
    build._toolkit_variants(ctx, teacher, "teacher", TEACHER_VARIANTS)
    assert [c[4] for c in calls] == [str(out / "teacher-ct2-int8")]


def test_the_coordinator_asks_a_step_for_the_selected_contenders_alone(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from bench.peers import run as peers_run

    commands = []

    def fake_run(command, **kwargs):
        commands.append(command)
        names = command[command.index("--contenders") + 1].split(",")
        settings = json.loads(command[command.index("--settings") + 1])
        (tmp_path / "builds").mkdir(exist_ok=True)
        for name in names:
            (tmp_path / "builds" / f"{name}.json").write_text(json.dumps(
                {"folder": str(tmp_path / name), "key": step_key("tk-teacher", settings), "step_seconds": 1.0}))
        return SimpleNamespace(returncode=0)

    monkeypatch.setattr(peers_run.subprocess, "run", fake_run)
    cfg = PeersConfig(work=str(tmp_path), only=("tk-teacher-ct2", "tk-teacher-ct2-int8"))
    builds, steps = peers_run.build_all(cfg, select(cfg.only), tmp_path / "st", {"main": "py"}, "avx512_vnni")
    assert len(commands) == 1 and commands[0][:4] == ["py", "-m", "bench.peers.build", "tk-teacher"]
    assert commands[0][commands[0].index("--contenders") + 1] == "tk-teacher-ct2,tk-teacher-ct2-int8"
    assert set(builds) == {"tk-teacher-ct2", "tk-teacher-ct2-int8"} and steps["tk-teacher"]["cached"] is False
    peers_run.build_all(cfg, select(cfg.only), tmp_path / "st", {"main": "py"}, "avx512_vnni")
    assert len(commands) == 1  # the records are there with the same settings: nothing rebuilt
    # A rebuild removes every record of the step: one the run did not select would name a removed folder.
    (tmp_path / "builds" / "tk-teacher-onnx.json").write_text("{}")
    (tmp_path / "toolkit" / "teacher-ct2").mkdir(parents=True)
    build.remove_outputs(tmp_path, "tk-teacher")
    assert not (tmp_path / "toolkit" / "teacher-ct2").exists() and list((tmp_path / "builds").iterdir()) == []


def test_the_timing_sample_is_seeded_distinct_and_capped():
    stsb = [(f"s{i}", f"t{i}", 1.0) for i in range(30)] + [("s0", "t0", 2.0)]
    first = timing_sample(stsb, 10)
    assert first == timing_sample(stsb, 10) and len(set(first)) == 10
    assert len(timing_sample(stsb, 1000)) == 60


def test_the_command_line_reads_lists_and_marks_nothing_reduced_by_default():
    cfg = parse(["--out", "x", "--only", "tk-static,model2vec", "--stsb-pairs", "200", "--threads", "1"])
    assert cfg.only == ("tk-static", "model2vec") and cfg.stsb_pairs == 200 and cfg.threads == 1
    assert PeersConfig(out="x").rounds == FULL.rounds


def test_the_report_renders_the_table_and_the_verdicts(tmp_path):
    rows = [row("st-torch", PEER, 86.72, 100, 400, mb=90.9, b1_ms=9.5, agreement={"mean": 1.0, "min": 1.0, "n": 3}),
            row("model2vec", PEER, 70.0, 20000, 90000, mb=15.4), row("tk-static", TOOLKIT, 70.1, 25000, 95000, mb=30.7),
            row("tk-static-refined", TOOLKIT, 71.0, 25000, 95000),
            {**row("ct2-int8", PEER, None, None, None), "status": "failed: build step ctranslate2 failed"}]
    cfg = {**FULL.__dict__, "out": "x"}
    precisions = {"bf16": False, "amx_bf16": False, "amx_int8": False, "vnni": False, "int8_preset": "avx2",
                  "arch": "x86_64", "source": "/proc/cpuinfo flags"}
    header = {"date": "today", "cpu": "AMD EPYC", "cores": 2, "flags": ["avx2"], "precisions": precisions, "threads": 2,
              "command": "python -m bench.peers",
              "note": "", "config": cfg, "full": cfg, "reduced": {"rounds": 1},
              "environments": {"main": {"python": "py", "packages": {"torch": "2.13"}}},
              "data": {"stsb_pairs": 1500, "mrpc_pairs": 408, "scored_sentences": 3, "mrpc_queries": 1, "mrpc_candidates": 1,
                       "timing_sentences": 3, "timing_tokens": {"mean": 10.0, "median": 9, "max": 20}},
              "load_average": {"before": [0.1, 0, 0], "after": [0.2, 0, 0]}, "minutes": {"build": 1.0, "total": 2.0},
              "steps": {"model2vec": {"seconds": 60, "cached": False, "error": None, "venv": "main"}}}
    result = {"header": header, "rows": rows, "front": {"b1": ["tk-static"], "b32": []}, "goal": verdicts(rows)}
    text = render(json.loads(json.dumps(result)))
    assert "| tk-static | toolkit | fp32 | 70.10 |" in text and "ct2-int8 (failed)" in text
    assert "NOT met" in text and "REDUCED run" in text
    assert text.splitlines()[3] == precision_line(precisions)  # beside the CPU's flags
    assert "(the gap: 1.10 points short)" in text


def test_only_the_environments_the_selection_uses_are_asked_for_and_a_missing_one_is_refused_first(tmp_path):
    from bench.peers.run import interpreters

    main_only = select(only=("ctranslate2",))
    assert all(c.venv == "main" for c in main_only)
    missing = str(tmp_path / "no-such-venv" / "bin" / "python")
    assert set(interpreters(PeersConfig(python_t4=missing), main_only)) == {"main"}
    t4 = [c for c in CONTENDERS if c.venv == "t4"]
    assert t4, "the transformers 4.57 contenders"
    with pytest.raises(SystemExit, match=r"run under .*no-such-venv/bin/python, which does not exist"):
        interpreters(PeersConfig(python_t4=missing), t4[:1])


def test_each_round_is_reported_as_it_lands():
    from bench.peers.timing import rounds

    class Clock:
        def __init__(self):
            self.timings = {"1": [], "32": []}

        def request(self, message):
            return {"seconds": 1.0, "calls": [0.01]}

    landed = []
    rounds({"a": Clock(), "b": Clock()}, 3, Path("texts.json"), landed=landed.append)
    assert landed == [1, 2, 3]
