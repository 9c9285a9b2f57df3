"""Structured pruning: gate gradients, physical removal, reloading, ONNX parity, the full command."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from compress.core.model import structure as st
from compress.core.data import synthetic
from compress.core.formats.records import read_compression, read_metrics
from compress.core.compat import STOCK_PRUNED_HEADS
from compress.core.config import from_dict
from compress.core.errors import CompressError
from compress.core.model.importance import (
    ffn_gates,
    ffn_importance_magnitude,
    head_gates,
    head_importance_gradient,
    head_importance_magnitude,
    heads_to_remove,
    layer_importance_gradient,
    masked_heads,
)
from compress.core.formats.runtime import load_model
from compress.prune import PruneConfig, ffn_to_keep, head_count, layers_to_keep, prune, summarize
from tests.conftest import VOCAB, make_tiny_model, save_tiny

# Depends on the installed transformers version: the transformers 4.57 set runs it too (make test-transformers4).
pytestmark = pytest.mark.versions


def _batch(seed=0, batch=4, seq=10, vocab=len(VOCAB)):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (batch, seq), generator=g)
    mask = torch.ones_like(ids)
    mask[1, -3:] = 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids),
            "labels": torch.tensor([0, 1, 1, 0])[:batch]}


def _logits(model, batch):
    with torch.no_grad():
        return model(**{k: v for k, v in batch.items() if k != "labels"}).logits


# ---------------------------------------------------------------------------- importance


def test_gate_gradients_equal_finite_differences():
    model = make_tiny_model(num_hidden_layers=2).double()  # float64: finite differences need the precision
    batch = _batch()
    (scores,) = [head_importance_gradient(model, [batch], normalize=False)]

    def loss_at(layer, head, value):
        gates = [torch.ones(4, dtype=torch.float64) for _ in range(2)]
        gates[layer][head] = value
        with head_gates(model, gates), torch.no_grad():
            return float(model(**batch).loss)

    eps = 1e-5
    for layer in range(2):
        for head in range(4):
            numeric = (loss_at(layer, head, 1 + eps) - loss_at(layer, head, 1 - eps)) / (2 * eps)
            assert float(scores[layer][head]) == pytest.approx(abs(numeric), rel=1e-4, abs=1e-9)


def test_hooks_are_always_removed():
    model = make_tiny_model()
    layer = st.layers(model)[0]
    with pytest.raises(RuntimeError):
        with head_gates(model, [torch.zeros(4), torch.zeros(4)]):
            raise RuntimeError("boom")
    assert not layer.output._forward_pre_hooks  # gates sit on the projections' inputs
    with ffn_gates(model, [torch.ones(37), torch.ones(37)]):
        pass
    assert not layer.ffn_out._forward_pre_hooks


def test_pruning_a_zeroed_head_matches_masking_it():
    model = make_tiny_model()
    batch = _batch(1)
    keep = [[True, False, True, True], [True, True, True, False]]
    with masked_heads(model, keep):
        masked = _logits(model, batch)
    st.prune_heads(model, {0: [1], 1: [3]})
    assert torch.allclose(masked, _logits(model, batch), atol=1e-6)
    assert st.heads_per_layer(model) == [3, 3]


def test_magnitude_scores_by_hand():
    model = make_tiny_model(num_hidden_layers=1)
    attn = st.layers(model)[0].attention
    with torch.no_grad():
        for lin in (attn.query, attn.key, attn.value, st.layers(model)[0].output):
            lin.weight.zero_()
        attn.value.weight[8:16] = 1.0  # head 1: 8 rows x 32 inputs of ones -> norm sqrt(256) = 16
    scores = head_importance_magnitude(model)[0]
    assert scores.tolist() == pytest.approx([0.0, 16.0, 0.0, 0.0])
    ffn = ffn_importance_magnitude(model)[0]
    assert ffn.shape == (37,)


def test_layer_gate_zero_skips_the_layer():
    model = make_tiny_model(num_hidden_layers=3)
    batch = _batch(2)
    from compress.core.model.importance import layer_gates

    with layer_gates(model, torch.tensor([1.0, 0.0, 1.0])):
        skipped = _logits(model, batch)
    st.drop_layers(model, [0, 2])
    assert torch.allclose(skipped, _logits(model, batch), atol=1e-5)
    assert layer_importance_gradient(make_tiny_model(num_hidden_layers=3), [batch]).shape == (3,)


def test_entropy_scores_by_hand():
    from compress.core.model.importance import head_importance_entropy

    model = make_tiny_model(num_hidden_layers=2)
    model.config._attn_implementation = "eager"  # attentions are returned
    batch = _batch(3)
    with torch.no_grad():
        att = model(**{k: v for k, v in batch.items() if k != "labels"}, output_attentions=True).attentions
    mask = batch["attention_mask"].bool()  # (batch, seq): padded query rows do not count
    scores = head_importance_entropy(model, [batch])
    for layer in range(2):
        for head in range(4):
            rows = att[layer][:, head][mask]  # (unpadded queries, seq) attention distributions
            entropy = float(sum(-(p[p > 0] * p[p > 0].log()).sum() for p in rows) / len(rows))
            assert float(scores[layer][head]) == pytest.approx(-entropy, rel=1e-5)  # spread-out heads score low


def test_ffn_taylor_scores_by_hand():
    from compress.core.model.importance import ffn_importance_taylor

    model = make_tiny_model(num_hidden_layers=2).double()
    model.eval()
    batch = _batch(4)
    acts = []
    handles = [layer.ffn_out.register_forward_pre_hook(lambda _m, args: acts.append(args[0]))
               for layer in st.layers(model)]
    loss = model(**batch).loss
    grads = torch.autograd.grad(loss, acts)  # dL/da for every activation, (batch, seq, ffn) per layer
    for h in handles:
        h.remove()
    scores = ffn_importance_taylor(model, [batch])
    for layer in range(2):
        expected = (acts[layer] * grads[layer]).sum(dim=(0, 1)).abs()  # |sum over tokens of a_i dL/da_i|
        assert torch.allclose(scores[layer].double(), expected, rtol=1e-6, atol=1e-12)


def test_layer_gradients_equal_finite_differences():
    from compress.core.model.importance import layer_gates

    model = make_tiny_model(num_hidden_layers=3).double()
    model.eval()
    batch = _batch(5)
    scores = layer_importance_gradient(model, [batch])

    def loss_at(layer, value):
        gates = torch.ones(3, dtype=torch.float64)
        gates[layer] = value
        with layer_gates(model, gates), torch.no_grad():
            return float(model(**batch).loss)

    eps = 1e-5
    for layer in range(3):
        numeric = (loss_at(layer, 1 + eps) - loss_at(layer, 1 - eps)) / (2 * eps)
        assert float(scores[layer]) == pytest.approx(abs(numeric), rel=1e-4, abs=1e-9)


# ---------------------------------------------------------------------------- choosing


def test_heads_to_remove_keeps_one_per_layer():
    scores = [[0.1, 0.2, 0.3], [0.0, 0.05, 0.9]]
    assert heads_to_remove(scores, 3) == {0: [0], 1: [0, 1]}  # global: the 3 lowest
    assert heads_to_remove(scores, 4) == {0: [0, 1], 1: [0, 1]}  # every removable head
    with pytest.raises(CompressError, match="only 4 can go while keeping one per layer"):
        heads_to_remove(scores, 5)
    assert heads_to_remove(scores, 2, scope="layer") == {0: [0], 1: [0]}
    assert head_count(144, 0.5) == 72 and head_count(144, 10) == 10


def test_layer_strategies():
    assert layers_to_keep("top:2", 6) == [0, 1, 2, 3]
    assert layers_to_keep("bottom:2", 6) == [2, 3, 4, 5]
    assert layers_to_keep("alternate", 6) == [0, 2, 4]
    assert layers_to_keep("1,3", 6) == [0, 2, 4, 5]
    assert layers_to_keep("importance:2", 4, [0.5, 0.1, 0.9, 0.2]) == [0, 2]
    with pytest.raises(CompressError, match="can drop 1 to 5 of 6 layers"):
        layers_to_keep("top:6", 6)
    with pytest.raises(CompressError, match="layer ids must be in 0..5"):
        layers_to_keep("7", 6)


def test_ffn_selection():
    scores = [[0.9, 0.1, 0.5, 0.3], [0.2, 0.8, 0.7, 0.6]]
    assert ffn_to_keep(scores, 0.5, "uniform") == [[0, 2], [1, 2]]
    glob = ffn_to_keep(scores, 0.5, "global")  # remove 0.1, 0.2, 0.3, 0.5
    assert glob == [[0], [1, 2, 3]]


# ---------------------------------------------------------------------------- artifacts


def test_non_uniform_pruned_model_saves_loads_and_exports(tmp_path, tokenizer):
    import numpy as np
    import onnxruntime as ort

    from compress.core.formats.onnx import export_onnx

    model = make_tiny_model(num_hidden_layers=3)
    st.prune_heads(model, {0: [0, 1], 2: [3]})
    st.resize_ffn(model, 1, range(0, 37, 3))
    st.drop_layers(model, [0, 1])
    out = save_tiny(model, tokenizer, tmp_path / "pruned")
    loaded = load_model(out)
    batch = _batch(3)
    assert torch.equal(_logits(model, batch), _logits(loaded, batch))
    assert st.heads_per_layer(loaded) == [2, 4] and st.ffn_widths(loaded) == [37, 13]
    # parameter count drops by exactly the removed rows and columns
    full = make_tiny_model(num_hidden_layers=2)
    removed_heads = 2 * (3 * (8 * 32 + 8) + 32 * 8)  # Q,K,V rows (+bias) and output columns of 2 heads
    removed_ffn = (37 - 13) * (32 + 1) + 32 * (37 - 13)
    assert st.count_parameters(loaded) == st.count_parameters(full) - removed_heads - removed_ffn

    onnx_dir = export_onnx(out, tmp_path / "onnx")
    session = ort.InferenceSession(str(onnx_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    feeds = {k: v.numpy() for k, v in batch.items() if k != "labels"}
    assert np.allclose(session.run(None, feeds)[0], _logits(loaded, batch).numpy(), atol=1e-5)
    assert read_compression(onnx_dir)["structure"]["heads"] == [2, 4]


# ---------------------------------------------------------------------------- the command


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from compress.core.model.shapes import resolve_shape
    from compress.teacher.create import create_model
    from compress.teacher.finetune import FinetuneConfig, finetune

    root = tmp_path_factory.mktemp("prune")
    data = synthetic.write_sst2_layout(root / "data", n_train=800, n_dev=200, n_test=10)
    vocab = synthetic.write_vocab(root / "vocab.txt")
    init = create_model(resolve_shape("2L-64-128-4H"), root / "init", tokenizer=vocab, task="sst2", max_positions=64, seed=3)
    cfg = from_dict(FinetuneConfig, {"task": "sst2", "data_dir": str(data), "epochs": 4, "lr": 2e-3, "seed": 3})
    return data, finetune(init, root / "model", cfg)


def _prune_cfg(data, **options):
    return from_dict(PruneConfig, {"task": "sst2", "data_dir": str(data), "importance_examples": 128, **options})


@pytest.mark.e2e
def test_prune_half_the_heads(trained, tmp_path):
    data, model_dir = trained
    out = prune(model_dir, tmp_path / "p", _prune_cfg(data, remove_heads=0.5))
    model = load_model(out)
    assert sum(st.heads_per_layer(model)) == 4 and min(st.heads_per_layer(model)) >= 1
    summary = next(r for r in read_metrics(out) if r["kind"] == "prune")
    assert summary["params_after"] <= summary["params_before"]
    assert summary["teacher_at_chance"] is False and summary["teacher_warning"] is None  # fine-tuned: no flag
    assert "MEAN NOTHING" not in summarize(out, _prune_cfg(data, remove_heads=0.5), {})[0].upper()


@pytest.mark.e2e
def test_prune_heads_ffn_layers_and_recover(trained, tmp_path):
    from compress.core.model.shapes import resolve_shape
    from compress.teacher.create import create_model
    from compress.teacher.finetune import FinetuneConfig, finetune

    data, _ = trained
    vocab = synthetic.write_vocab(tmp_path / "vocab.txt")
    init = create_model(resolve_shape("3L-64-128-4H"), tmp_path / "init", tokenizer=vocab, task="sst2", max_positions=64, seed=5)
    base = finetune(init, tmp_path / "base", from_dict(FinetuneConfig, {"task": "sst2", "data_dir": str(data), "epochs": 3, "lr": 2e-3, "seed": 5}))
    cfg = _prune_cfg(data, remove_heads=0.5, remove_ffn=0.25, remove_layers="top:1", recovery="finetune", epochs=1, lr=1e-3)
    out = prune(base, tmp_path / "p", cfg)
    model = load_model(out)
    assert model.config.num_hidden_layers == 2
    assert sum(st.heads_per_layer(model)) == 4 and all(h >= 1 for h in st.heads_per_layer(model))
    assert st.ffn_widths(model) == [96, 96]
    summary = next(r for r in read_metrics(out) if r["kind"] == "prune")
    # The recovered score is the dev score the last step measured (a number, not just present).
    assert summary["after_recovery"] == summary["steps"][-1]["dev"][summary["metric"]]
    assert 0 <= summary["after_recovery"] <= 100
    assert summary["params_after"] < summary["params_before"]
    record = read_compression(out)
    assert record["structure"]["heads"] == st.heads_per_layer(model) and record["structure"]["kept_layers"] == [0, 1]
    # uniform FFN width + config.pruned_heads: stock transformers 4.x reloads it with identical
    # logits; 5.x cannot express narrower heads and must refuse, never load random attention.
    from transformers import AutoModelForSequenceClassification

    if not STOCK_PRUNED_HEADS:
        with pytest.raises(RuntimeError, match="mismatch"):
            AutoModelForSequenceClassification.from_pretrained(out)
        return
    stock = AutoModelForSequenceClassification.from_pretrained(out)
    batch = _batch(4, vocab=model.config.vocab_size)
    assert torch.allclose(_logits(model, batch), _logits(stock, batch), atol=1e-5)


@pytest.mark.e2e
def test_iterative_heads_with_distillation_recovery_and_layer_importance(trained, tmp_path):
    data, model_dir = trained
    cfg = _prune_cfg(data, remove_heads=0.5, iterations=2, recovery="distill", head_criterion="entropy",
                     remove_layers="importance:1", epochs=1, lr=1e-3)
    out = prune(model_dir, tmp_path / "p", cfg)
    model = load_model(out)
    assert model.config.num_hidden_layers == 1 and sum(st.heads_per_layer(model)) == 2  # 4 heads left, halved
    summary = next(r for r in read_metrics(out) if r["kind"] == "prune")
    names = [s["step"] for s in summary["steps"]]
    assert "heads 1/2" in names and "heads 2/2" in names and names[-1] == "recovered (distill)"
    # each step removed half of the remaining target: 1 head, then 1 head
    removed = [sum(len(v) for v in s["removed"].values()) for s in summary["steps"] if s["step"].startswith("heads ")]
    assert removed == [1, 1]
    # The recovered score is the dev score the last step measured (a number, not just present).
    assert summary["after_recovery"] == summary["steps"][-1]["dev"][summary["metric"]]
    assert 0 <= summary["after_recovery"] <= 100
    assert "recovery:distill" in read_compression(out)["method"]


@pytest.mark.e2e
def test_distillation_recovery_learns_from_the_recovery_teacher_when_given(trained, tmp_path, monkeypatch):
    import compress.prune as prune_module
    from compress.teacher.finetune import FinetuneConfig, finetune

    data, model_dir = trained
    # Another fine-tuned model of the same task stands for the student's own teacher.
    teacher = finetune(model_dir, tmp_path / "teacher", from_dict(FinetuneConfig, {"task": "sst2", "data_dir": str(data),
                                                                                   "epochs": 1, "lr": 1e-3, "seed": 4}))
    calls = []
    real = prune_module.distill

    def spy(teacher_dir, out, cfg, **kw):
        calls.append((Path(teacher_dir).resolve(), Path(cfg.shape.init)))
        return real(teacher_dir, out, cfg, **kw)

    monkeypatch.setattr(prune_module, "distill", spy)
    out = prune(model_dir, tmp_path / "p", _prune_cfg(data, remove_ffn=0.5, recovery="distill",
                                                      recovery_teacher=str(teacher), epochs=1, lr=1e-3))
    assert [c[0] for c in calls] == [Path(teacher).resolve()]  # the given teacher, not the unpruned model
    assert st.ffn_widths(load_model(out)) == [64, 64]  # the student distilled is the pruned one
    assert next(r for r in read_metrics(out) if r["kind"] == "prune")["after_recovery"] is not None
    assert read_compression(out)["config"]["recovery_teacher"] == str(Path(teacher).resolve())

    calls.clear()
    prune(model_dir, tmp_path / "q", _prune_cfg(data, remove_ffn=0.5, recovery="distill", epochs=1, lr=1e-3))
    assert [c[0] for c in calls] == [Path(model_dir).resolve()]  # without it: the unpruned model


def test_recovery_teacher_needs_distillation_recovery_and_an_existing_model(trained, tmp_path):
    data, model_dir = trained
    with pytest.raises(CompressError, match="add --recovery distill"):
        _prune_cfg(data, remove_ffn=0.5, recovery="finetune", recovery_teacher=str(model_dir)).validate()
    with pytest.raises(CompressError, match="neither a directory nor a known hub model"):
        prune(model_dir, tmp_path / "p", _prune_cfg(data, remove_ffn=0.5, recovery="distill",
                                                    recovery_teacher=str(tmp_path / "missing")))
    assert not (tmp_path / "p").exists()


def test_until_threshold(trained, tmp_path):
    from compress.core.model.shapes import resolve_shape
    from compress.teacher.create import create_model

    data, model_dir = trained
    vocab = synthetic.write_vocab(tmp_path / "vocab.txt")
    init = create_model(resolve_shape("2L-64-128-8H"), tmp_path / "init", tokenizer=vocab, task="sst2", max_positions=64)
    cfg = _prune_cfg(data, until=0.0001, until_step=0.25)
    out = prune(init, tmp_path / "p", cfg)
    summary = next(r for r in read_metrics(out) if r["kind"] == "prune")
    step = next(s for s in summary["steps"] if s["step"] == "heads (until)")
    assert [c["removed"] for c in step["curve"]] == [4, 8, 12]  # 25% of 16 heads per step, 14 removable
    assert st.heads_per_layer(load_model(out)) != [8, 8]
    # an untrained model: at chance on dev by the rule, computed here by hand; recorded and printed
    labels = [int(line.rsplit("\t", 1)[1]) for line in (data / "SST-2" / "dev.tsv").read_text().splitlines()[1:]]
    rate = max(labels.count(0), labels.count(1)) / len(labels)
    threshold = 100 * rate + max(2.0, 200 * (rate * (1 - rate) / len(labels)) ** 0.5)
    assert summary["before"] <= threshold and summary["teacher_at_chance"] is True
    check = read_compression(out)["teacher_check"]
    assert check["chance"]["threshold"] == pytest.approx(threshold) and check["chance"]["value"] == summary["before"]
    text, notes = summarize(out, cfg, {})
    assert text.endswith("THE MODEL BEFORE PRUNING WAS AT CHANCE: these numbers mean nothing")
    assert notes == [f"warning: {summary['teacher_warning']}"] and f"the model to prune {init} does not look" in notes[0]


def test_prune_errors(trained, tmp_path):
    data, model_dir = trained
    with pytest.raises(CompressError, match="nothing to prune"):
        _prune_cfg(data)
    with pytest.raises(CompressError, match="--remove-heads must be a fraction"):
        _prune_cfg(data, remove_heads=1.5)
    with pytest.raises(CompressError, match="--remove-ffn must be a fraction in \\(0, 1\\)"):
        _prune_cfg(data, remove_ffn=1.0)
    with pytest.raises(CompressError, match="would remove 8 of 8 heads, but every one of the 2 layers keeps at least one"):
        prune(model_dir, tmp_path / "x", _prune_cfg(data, remove_heads=8))
    assert not (tmp_path / "x").exists()
