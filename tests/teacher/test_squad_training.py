"""SQuAD end to end on tiny models: fine-tune a span teacher, distil it, and SQuAD v2.0's no-answer path.

The generated questions (``synthetic.write_squad``) ask ``which is good ?`` of a review in
which exactly one adjective has that polarity: picking any adjective scores ~40% exact
match, reading the question and the words scores 100%.
"""

from __future__ import annotations

import pytest

from compress.core.data import synthetic
from compress.core.formats.records import read_compression, read_metrics
from compress.core.config import from_dict
from compress.core.formats.runtime import load_model
from compress.distill.task import DistillConfig, distill
from compress.core.model.shapes import resolve_shape
from compress.teacher.create import create_model
from compress.teacher.finetune import FinetuneConfig, finetune

CHANCE_EM = 50.0  # above what choosing among the review's 2-3 adjectives blindly gets


def _dev(out):
    return next(r for r in read_metrics(out) if r["kind"] == "eval")["metrics"]


@pytest.fixture(scope="module")
def squad(tmp_path_factory):
    root = tmp_path_factory.mktemp("squad")
    train = synthetic.write_squad(root / "train-v1.1.json", 2000, seed=1)
    dev = synthetic.write_squad(root / "dev-v1.1.json", 100, seed=2)
    vocab = synthetic.write_vocab(root / "vocab.txt")
    init = create_model(resolve_shape("2L-64"), root / "init", tokenizer=vocab, task="squad", max_positions=64, seed=3)
    cfg = from_dict(FinetuneConfig, {"task": "squad", "train_file": str(train), "dev_file": str(dev), "max_length": 48,
                                     "doc_stride": 16, "epochs": 10, "lr": 1e-3, "seed": 3})
    teacher = finetune(init, root / "teacher", cfg)
    return root, train, dev, teacher


@pytest.mark.e2e
def test_squad_finetune_learns_the_spans(squad):
    _, _, _, teacher = squad
    assert type(load_model(teacher)).__name__ == "BertForQuestionAnswering"
    dev = _dev(teacher)
    assert dev["exact_match"] >= 90 and dev["f1"] >= dev["exact_match"]
    training = next(r for r in read_metrics(teacher) if r["kind"] == "training")
    first = next(h["eval"] for h in training["history"] if "eval" in h)
    assert first["exact_match"] < dev["exact_match"]  # it learned; the best epoch is kept


@pytest.mark.e2e
def test_squad_distillation_on_start_end_logits(squad, tmp_path):
    root, train, dev, teacher = squad
    cfg = from_dict(DistillConfig, {"task": "squad", "student": "1L-64", "init": "teacher-layers",
                                    "losses": ["kd", "hard"], "train_file": str(train), "dev_file": str(dev),
                                    "max_length": 48, "doc_stride": 16, "epochs": 4, "lr": 1e-3, "seed": 3,
                                    "cache_dir": str(tmp_path / "cache")})
    out = distill(teacher, tmp_path / "student", cfg)
    assert type(load_model(out)).__name__ == "BertForQuestionAnswering"
    assert load_model(out).config.num_hidden_layers == 1
    dev_metrics = _dev(out)
    assert dev_metrics["exact_match"] > CHANCE_EM
    retention = next(r for r in read_metrics(out) if r["kind"] == "retention")
    assert retention["metric"] == "f1" and retention["teacher"] == pytest.approx(_dev(teacher)["f1"])
    assert retention["ratio"] == pytest.approx(dev_metrics["f1"] / retention["teacher"])
    record = read_compression(out)
    assert record["task"] == "squad" and record["losses"] == ["kd", "hard"]
    cache = next(r for r in read_metrics(out) if r["kind"] == "training")["cache"]
    assert cache and cache[0]["hit"] is False  # start and end logits were cached once


@pytest.mark.e2e
def test_squad_v2_finetune_reports_no_answer_breakdown(tmp_path):
    train = synthetic.write_squad(tmp_path / "train-v2.0.json", 2000, seed=1, version="2.0", no_answer_fraction=0.3)
    dev = synthetic.write_squad(tmp_path / "dev-v2.0.json", 100, seed=2, version="2.0", no_answer_fraction=0.3)
    vocab = synthetic.write_vocab(tmp_path / "vocab.txt")
    init = create_model(resolve_shape("2L-64"), tmp_path / "init", tokenizer=vocab, task="squad_v2", max_positions=64, seed=3)
    cfg = from_dict(FinetuneConfig, {"task": "squad_v2", "train_file": str(train), "dev_file": str(dev), "max_length": 48,
                                     "doc_stride": 16, "epochs": 10, "lr": 1e-3, "seed": 3})
    out = finetune(init, tmp_path / "v2", cfg)
    metrics = _dev(out)
    assert {"HasAns_exact", "NoAns_exact", "best_f1", "best_f1_thresh"} <= set(metrics)
    assert metrics["total"] == 100
    # it learned both to abstain (no adjective of the asked polarity) and to answer
    assert metrics["NoAns_exact"] > 50 and metrics["HasAns_exact"] > CHANCE_EM
