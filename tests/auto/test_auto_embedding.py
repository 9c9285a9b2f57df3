"""compress auto --embedding on a tiny random sentence-transformers teacher with a fake timer.

One search is run for the module: it is cut by a crash at the final measurement and resumed, so the tests below
check the resumed run trains nothing again, and the folder, the report and the scores it ends with: the chosen
folder loads in SentenceTransformer and embeds as the toolkit's runtime does, every candidate's score equals the
mean cosine recomputed here with numpy (each sentence alone, no padding), the static candidate is there when
model2vec is installed. The STS-B score, the refusals and a missing model2vec are checked without a search.
"""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from compress.auto import embedding as auto_embedding
from compress.auto.config import AutoConfig
from compress.auto.embedding import EmbeddingSearch, load_check, prepare, score_folder
from compress.auto.run import auto
from compress.core.formats.artifacts import load_tokenizer
from compress.core.config import from_dict
from compress.core.errors import CompressError
from compress.core.formats.runtime import load_model
from compress.core.formats.sentence import encode, read_spec
from compress.core.checkpoints import work_dir_for
from compress.core.train import TrainConfig
from compress.eval.latency.row import Row
from tests.conftest import make_tiny_model, make_tokenizer, save_tiny
from tests.core.test_sentence import corpus, glue, st_folder

TEXTS = ["the movie was good .", "a cat sat on the mat", "what is the capital city of france ?", "dog"]
BUDGET = "speedup>=1.1x@b1,s32"  # the teacher takes 1.8 ms: 2 layers with the FFN cut by half or more fit
HAS_MODEL2VEC = importlib.util.find_spec("model2vec") is not None


def fake_timer(slow: dict[str, float] | None = None, calls: list | None = None):
    """Latency = 1 ms + 0.2 ms per layer x (1 + FFN / 37), int8 half of it, a static folder 0.5 ms: exact and
    noiseless; ``slow`` multiplies the final measurement of folders whose path holds a key."""
    def ms_of(path: Path) -> float:
        folder = next(f for f in (path, *path.parents) if (f / "config.json").is_file())
        config = json.loads((folder / "config.json").read_text())
        if config.get("model_type") == "model2vec":
            return 0.5
        ms = 1.0 + 0.2 * config["num_hidden_layers"] * (1 + config["intermediate_size"] / 37)
        return ms * (0.5 if "int8" in str(path) else 1.0)

    def timer(dirs, at, repeats, runs):
        if calls is not None:
            calls.append([str(d) for d in dirs])
        rows, first = [], None
        for d in dirs:
            ms = ms_of(Path(d))
            ms *= next((f for k, f in (slow or {}).items() if k in str(d) and "probe" not in str(d)), 1.0)
            first = first or ms
            for b, s in at:
                rows.append(Row.from_dict({
                    "model": str(d), "name": Path(d).name, "batch": b, "seq": s, "p50_ms": ms, "p90_ms": ms,
                    "p99_ms": ms, "mean_ms": ms, "throughput": b / ms * 1e3, "speedup": first / ms, "params": 0,
                    "runs_p50_ms": [ms] * runs, "speedup_min": first / ms,
                    "slowest_run": {k: ms for k in ("p50_ms", "p90_ms", "p99_ms", "mean_ms")}}))
        return rows
    return timer


def config(env, **changes) -> AutoConfig:
    base = {"embedding": True, "corpus": [str(env.text)], "budget": BUDGET, "backends": ["torch"], "probes": 4,
            "candidates": 3, "rounds": 2, "epochs": 1, "lr": 1e-3, "batch_size": 32, "repeats": 2, "final_runs": 1,
            "check_sentences": 40, "max_length": 32, "tie": 0.0}
    return from_dict(AutoConfig, {**base, **changes})


def by_hand(folder: Path, texts: list[str]) -> np.ndarray:
    """Each text alone through the transformer: the mean of its token states, L2-normalised (the folder's modules): (n, d)."""
    model, tokenizer = load_model(folder, head="base"), load_tokenizer(folder)
    rows = []
    for text in texts:
        enc = tokenizer(text.strip(), truncation=True, max_length=48, return_tensors="pt")
        with torch.inference_mode():
            vector = model(**enc).last_hidden_state[0].mean(0).double().numpy()
        rows.append(vector / np.linalg.norm(vector))
    return np.stack(rows)


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> SimpleNamespace:
    """The teacher (2 layers, mean pooling + Normalize), a 160-sentence text, and a search crashed, then resumed."""
    root = tmp_path_factory.mktemp("auto-embedding")
    tokenizer = make_tokenizer(root / "tok")
    env = SimpleNamespace(root=root, tokenizer=tokenizer, teacher=st_folder(root, tokenizer, name="teacher", seed=1),
                          text=corpus(root / "c.txt", n=160), glue=glue(root)[0])
    crash = fake_timer()

    def crashing(dirs, at, repeats, runs):  # the final run (not the probe, nor its teacher again) never happens
        if len(dirs) > 1 and not any("probe" in str(d) for d in dirs):
            raise RuntimeError("power cut")
        return crash(dirs, at, repeats, runs)

    env.out = root / "out"
    with pytest.raises(RuntimeError):
        auto(env.teacher, env.out, config(env), timer=crashing)
    env.trained_again, env.calls = [], []
    with pytest.MonkeyPatch.context() as mp:  # the resumed run: count every training
        for name in ("distill_embedding", "distill_static"):
            real = getattr(auto_embedding, name)
            mp.setattr(auto_embedding, name, lambda *a, real=real, **k: env.trained_again.append(a[1]) or real(*a, **k))
        auto(env.teacher, env.out, config(env, resume=True), timer=fake_timer(slow={"int8": 10.0}, calls=env.calls))
    env.report = json.loads((env.out / "search" / "search.json").read_text())
    return env


# ---------------------------------------------------------------------------- the search


@pytest.mark.e2e
def test_a_resumed_search_trains_no_candidate_again(env):
    assert env.trained_again == [] and len(env.calls) == 1  # no training, no probe re-timed: the final run only
    assert env.calls[0][0] == str(env.teacher)


def test_the_chosen_folder_meets_the_budget_and_loads_in_sentence_transformers(env):
    st = pytest.importorskip("sentence_transformers")
    report = env.report
    chosen = next(r for r in report["results"] if r["name"] == report["chosen"]["name"])
    assert all(chosen["meets"].values()) and chosen["accuracy"] == max(
        r["accuracy"] for r in report["results"] if all(r["meets"].values()))
    assert chosen["variant"] == "torch-fp32"  # a distilled student (every int8 variant measured 10x slower: none fits)
    ours = encode(load_model(env.out, head="base"), load_tokenizer(env.out), TEXTS, read_spec(env.out))
    theirs = st.SentenceTransformer(str(env.out), device="cpu").encode(TEXTS)
    assert theirs.shape == ours.shape and np.isfinite(ours).all()
    np.testing.assert_allclose(theirs, ours, atol=1e-5)


def test_the_report_lists_every_candidate_with_its_score_and_says_which_score(env):
    report, text = env.report, (env.out / "search" / "report.md").read_text()
    assert report["task"] == "embedding" and report["score_column"] == "score"
    assert report["score"].startswith("mean cosine (x100) of the model's embeddings to the teacher's on 40 held-out")
    assert f"- score: {report['score']}" in text and "| shape | round | epochs | score | teacher | seconds |" in text
    rounds = [t["round"] for t in report["trained"] if t["label"] != "static"]
    assert rounds.count(0) == 3 and 1 <= rounds.count(1) <= 3  # successive halving: 3 candidates, the best went on
    for t in report["trained"]:
        assert f"| {t['label']} | {t['round']} | {t['epochs']} | {t['score']:.2f} | {t['teacher']:.2f} |" in text
        assert t["teacher"] == pytest.approx(100.0)  # the teacher's cosine to itself
    for r in report["results"]:
        assert f"| {r['name']} | {r['accuracy']:.2f} |" in text
    assert (env.out / "search" / "pareto.png").is_file()


@pytest.mark.skipif(not HAS_MODEL2VEC, reason="model2vec (the static extra) is not installed")
def test_the_static_candidate_is_trained_once_and_measured(env):
    (static,) = [t for t in env.report["trained"] if t["label"] == "static"]
    assert static["init"] == "model2vec" and np.isfinite(static["score"])
    (result,) = [r for r in env.report["results"] if r["label"] == "static"]
    assert result["name"] == "static model2vec" and result["predicted_p50_ms"] is None and result["measured_p50_ms"] == 0.5
    assert "| static model2vec |" in (env.out / "search" / "report.md").read_text()
    st = pytest.importorskip("sentence_transformers")  # a sentence-transformers folder too, embedding as the runtime does
    ours = encode(load_model(Path(static["dir"]), head="base"), load_tokenizer(static["dir"]), TEXTS, read_spec(static["dir"]))
    np.testing.assert_allclose(st.SentenceTransformer(static["dir"], device="cpu").encode(TEXTS), ours, atol=1e-5)


def test_every_score_is_the_mean_cosine_to_the_teacher_on_the_held_out_sentences(env):
    target = load_check(work_dir_for(env.out))
    check = target.check_sentences()
    train = (target.root / "train.txt").read_text().split("\n\n")
    assert len(check) == 40 and len(train) == 120 and not {s.strip() for s in train} & set(check)
    teacher = by_hand(env.teacher, check)  # (40, d), unit rows
    for t in env.report["trained"]:
        if t["label"] == "static":  # model2vec's own encoder: the mean of token vectors, normalised
            from model2vec import StaticModel

            mine = StaticModel.from_pretrained(t["dir"]).encode(check).astype(np.float64)
            mine /= np.linalg.norm(mine, axis=1, keepdims=True)
        else:
            mine = by_hand(Path(t["dir"]), check)
        assert t["score"] == pytest.approx(100 * np.mean(np.sum(mine * teacher, axis=1)), abs=1e-4), t["label"]
    for r in env.report["results"]:  # an int8 variant is scored itself, not given its fp32 model's score
        if "int8" in r["variant"]:
            assert r["accuracy"] == pytest.approx(100 * np.mean(np.sum(by_hand(Path(r["dir"]), check) * teacher, axis=1)),
                                                  abs=1e-4)


# ---------------------------------------------------------------------------- the score and the static candidate


def test_stsb_scores_every_model_when_data_dir_holds_it(env, tmp_path):
    from scipy.stats import spearmanr

    options = EmbeddingSearch(embedding=True, corpus=(str(env.text),), check_sentences=40)
    target = prepare(env.teacher, options, str(env.glue), 0, tmp_path / "work")  # auto: STS-B is under --data-dir
    assert target.score == "stsb" and target.description.startswith("STS-B dev Spearman")
    _, pairs, _ = glue(tmp_path)
    emb = by_hand(env.teacher, [t for a, b, _ in pairs for t in (a, b)])
    expected = 100 * spearmanr(np.sum(emb[0::2] * emb[1::2], axis=1), [s for *_, s in pairs])[0]
    assert target.teacher == pytest.approx(expected, abs=1e-6) and score_folder(env.teacher, target) == target.teacher
    assert load_check(tmp_path / "work") == target  # what a worker process reads
    elsewhere = prepare(env.teacher, options, str(tmp_path / "nothing"), 0, tmp_path / "other")
    assert elsewhere.score == "cosine" and elsewhere.teacher == pytest.approx(100.0)


def test_without_model2vec_the_static_candidate_is_skipped_with_a_log_line(env, monkeypatch, caplog):
    def missing():
        raise CompressError("compress distill-static builds on model2vec, which cannot be imported here")

    monkeypatch.setattr(auto_embedding, "model2vec", missing)
    with caplog.at_level(logging.INFO, logger="compress.auto.embedding"):
        assert auto_embedding.train_static(env.teacher, load_check(work_dir_for(env.out)), TrainConfig(),
                                           env.root / "static") is None
    assert "no static candidate: compress distill-static builds on model2vec" in caplog.text
    assert not (env.root / "static").exists()


# ---------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("changes, words", [
    ({"task": "sst2"}, "--embedding searches sentence-embedding students, which have no task: drop --task sst2"),
    ({"corpus": []}, "--embedding distils on unlabelled sentences: pass --corpus FILE_OR_DIR[,...]"),
    ({"embedding": False}, "--corpus belongs to a search of sentence-embedding students: add --embedding"),
    ({"backends": ["inc"]}, "--backends inc cannot calibrate a sentence-embedding folder"),
    ({"train_file": "train.csv", "dev_file": "dev.csv"}, "--train-file/--dev-file are a task's data"),
    ({"losses": ["kd"]}, "unknown embedding distillation loss 'kd'"),
    ({"check_sentences": 0}, "--check-sentences must be at least 1"),
    ({"sentences_from": ["squad"]}, "--sentences-from takes GLUE tasks"),
])
def test_incompatible_options_are_refused_in_one_line(env, changes, words):
    with pytest.raises(CompressError) as err:
        config(env, **changes)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_teacher_of_the_wrong_kind_and_a_narrower_shape_are_refused_before_any_work(env, tmp_path):
    classifier = save_tiny(make_tiny_model("sequence-classification"), env.tokenizer, tmp_path / "classifier")
    refusals = [
        (classifier, config(env), "is a sequence-classification model, not a sentence-embedding one"),
        (env.teacher, from_dict(AutoConfig, {"budget": BUDGET}), "is a sentence-embedding model (a sentence-transformers "
                                                                "folder) with no task: pass --embedding"),
        (env.teacher, config(env, shapes=["1L-16"]), "--shapes 1L-16: an embedding student keeps the teacher's width 32"),
    ]
    for teacher, cfg, words in refusals:
        with pytest.raises(CompressError) as err:
            auto(teacher, tmp_path / "out", cfg, timer=fake_timer())
        assert words in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_the_command_line_refuses_in_one_line(env, tmp_path, capsys):
    from compress.cli import main

    argv = ["auto", "--teacher", str(env.teacher), "--embedding", "--budget", BUDGET, "--out", str(tmp_path / "out")]
    assert main([*argv, "--task", "sst2", "--corpus", str(env.text)]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "drop --task sst2" in err
    assert main(argv) != 0
    assert "--embedding distils on unlabelled sentences" in capsys.readouterr().err
