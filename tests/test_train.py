"""The training loop: schedules, batching, exact resume, NaN handling."""

from __future__ import annotations

import json
import math

import pytest
import torch

from compress.core.errors import CompressError
from compress.core.train import (
    PROGRESS_FILE,
    TrainConfig,
    epoch_order,
    global_batches,
    linear_schedule,
    list_checkpoints,
    param_groups,
    train,
)
from tests.conftest import make_tiny_model


def _toy_dataset(n=64, seq=8, seed=0):
    """Sequences whose label is whether token 10 appears: learnable by a tiny BERT."""
    g = torch.Generator().manual_seed(seed)
    items = []
    for i in range(n):
        ids = torch.randint(11, 60, (seq,), generator=g)
        label = i % 2
        if label:
            ids[int(torch.randint(1, seq, (1,), generator=g))] = 10
        items.append({"input_ids": torch.cat([torch.tensor([2]), ids]), "labels": label})
    return items


def _collate(items, step):
    ids = torch.stack([x["input_ids"] for x in items])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": torch.tensor([x["labels"] for x in items])}


def _loss(model, batch):
    out = model(**batch)
    acc = (out.logits.argmax(-1) == batch["labels"]).float().mean()
    return out.loss, {"accuracy": acc}


def _weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_linear_schedule_by_hand():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    sched = linear_schedule(opt, warmup=4, total=10)
    lrs = []
    for _ in range(10):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    # warm-up (s+1)/4 for s < 4, then (10 - s)/6
    assert lrs == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6])


def test_no_weight_decay_on_bias_and_layernorm():
    model = make_tiny_model()
    decay, no_decay = param_groups(model, 0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(not names[id(p)].endswith("bias") and "LayerNorm" not in names[id(p)] for p in decay["params"])
    assert any("LayerNorm.weight" in names[id(p)] for p in no_decay["params"])
    assert no_decay["weight_decay"] == 0.0 and decay["weight_decay"] == 0.01


def test_global_batches_preserve_size_and_trim_for_processes():
    assert global_batches(10, 4, 1) == [(0, 4), (4, 8), (8, 10)]
    assert global_batches(10, 4, 2) == [(0, 4), (4, 8), (8, 10)]
    assert global_batches(11, 4, 2) == [(0, 4), (4, 8), (8, 10)]  # one example dropped for 2 processes
    assert global_batches(9, 4, 4) == [(0, 4), (4, 8)]


def test_epoch_order_is_a_seeded_permutation():
    a = epoch_order(100, seed=1, epoch=0)
    assert sorted(a) == list(range(100))
    assert a == epoch_order(100, seed=1, epoch=0)
    assert a != epoch_order(100, seed=1, epoch=1)
    assert epoch_order(5, 0, 0, shuffle=False) == [0, 1, 2, 3, 4]


def test_group_by_length_batches_hold_similar_lengths():
    lengths = [(i * 37) % 100 + 1 for i in range(400)]
    order = epoch_order(400, seed=0, epoch=0, lengths=lengths, batch_size=8)
    assert sorted(order) == list(range(400))
    batches = [order[i : i + 8] for i in range(0, 400, 8)]
    # Padding waste: grouped batches pad far less than random ones.
    def waste(bs):
        return sum(max(lengths[i] for i in b) * len(b) - sum(lengths[i] for i in b) for b in bs)

    random_order = epoch_order(400, seed=0, epoch=0)
    assert waste(batches) < 0.2 * waste([random_order[i : i + 8] for i in range(0, 400, 8)])
    assert max(lengths[i] for i in batches[0]) == max(lengths)  # longest batch first


def test_loss_decreases_and_model_learns(tmp_path):
    model = make_tiny_model()
    data = _toy_dataset(128)
    cfg = TrainConfig(epochs=8, batch_size=16, lr=2e-3, warmup_ratio=0.1, log_every=4, seed=0, group_by_length=False)
    result = train(model, data, _collate, cfg, loss_fn=_loss, work_dir=tmp_path / "w")
    losses = [h["loss"] for h in result.history if "loss" in h]
    assert losses[-1] < 0.5 * losses[0]
    assert result.steps == 8 * 8


def test_resume_after_interruption_gives_identical_weights(tmp_path):
    data = _toy_dataset(48)
    cfg = TrainConfig(epochs=3, batch_size=8, lr=1e-3, save_every=4, seed=3, log_every=2, group_by_length=False)
    reference = make_tiny_model(seed=1, hidden_dropout_prob=0.1)  # dropout exercises the RNG state
    train(reference, data, _collate, cfg, loss_fn=_loss, work_dir=tmp_path / "ref")

    class Crash(Exception):
        pass

    def crashing(items, step):
        if step == 10:  # after the checkpoint at step 8
            raise Crash()
        return _collate(items, step)

    model = make_tiny_model(seed=1, hidden_dropout_prob=0.1)
    with pytest.raises(Crash):
        train(model, data, crashing, cfg, loss_fn=_loss, work_dir=tmp_path / "w")
    assert [p.name for p in list_checkpoints(tmp_path / "w")] == ["step-00000004", "step-00000008"]
    crashed = _progress(tmp_path / "w")  # what a person reading the work directory saw when it stopped
    fresh = make_tiny_model(seed=1, hidden_dropout_prob=0.1)
    result = train(fresh, data, _collate, cfg, loss_fn=_loss, work_dir=tmp_path / "w", resume=True)
    assert result.steps == 18
    ref, got = _weights(reference), _weights(fresh)
    assert all(torch.equal(ref[k], got[k]) for k in ref)
    # the history, written while the runs went, is the uninterrupted run's too (timings aside)
    expected, resumed = _progress(tmp_path / "ref"), _progress(tmp_path / "w")
    assert crashed["status"] == "running" and crashed["history"] == expected["history"][: len(crashed["history"])]
    assert resumed["status"] == "done" and resumed["history"] == expected["history"]
    assert [h["step"] for h in expected["history"]] == list(range(2, 19, 2))


def _progress(work_dir):
    """The training record in the work directory's metrics.json, without the timings."""
    (record,) = json.loads((work_dir / PROGRESS_FILE).read_text())["results"]
    record["history"] = [{k: v for k, v in h.items() if k != "examples_per_second"} for h in record["history"]]
    return record


def test_resume_refuses_other_settings(tmp_path):
    data = _toy_dataset(32)
    cfg = TrainConfig(epochs=2, batch_size=8, save_every=2, group_by_length=False)
    train(make_tiny_model(), data, _collate, cfg, loss_fn=_loss, work_dir=tmp_path / "w")
    other = TrainConfig(epochs=2, batch_size=8, save_every=2, lr=1e-3, group_by_length=False)
    with pytest.raises(CompressError, match="made with other settings"):
        train(make_tiny_model(), data, _collate, other, loss_fn=_loss, work_dir=tmp_path / "w", resume=True)


def test_nan_loss_stops_with_last_checkpoint(tmp_path):
    data = _toy_dataset(32)
    cfg = TrainConfig(epochs=4, batch_size=8, save_every=2, group_by_length=False)

    def exploding(model, batch):
        loss, logs = _loss(model, batch)
        return (loss * math.nan if exploding.calls >= 5 else loss), logs.update() or logs

    exploding.calls = 0

    def counting(model, batch):
        exploding.calls += 1
        return exploding(model, batch)

    with pytest.raises(CompressError) as err:
        train(make_tiny_model(), data, _collate, cfg, loss_fn=counting, work_dir=tmp_path / "w")
    message = str(err.value)
    assert "the loss became nan at step 5" in message and "step-00000004" in message and "\n" not in message


def test_best_checkpoint_is_kept(tmp_path):
    data = _toy_dataset(32)
    cfg = TrainConfig(epochs=3, batch_size=8, group_by_length=False)
    scores = iter([50.0, 80.0, 60.0])
    result = train(
        make_tiny_model(), data, _collate, cfg, loss_fn=_loss, work_dir=tmp_path / "w",
        evaluate=lambda m: {"accuracy": next(scores)}, select="accuracy",
    )
    assert result.best == {"accuracy": 80.0} and result.best_step == 8
    assert result.best_weights is not None and result.best_weights.is_file()


def test_config_validation():
    from compress.core.config import from_dict

    with pytest.raises(CompressError, match="--batch-size 10 is not divisible by --grad-accum 3"):
        from_dict(TrainConfig, {"batch_size": 10, "grad_accum": 3})
    with pytest.raises(CompressError, match="--lr must be a positive number"):
        from_dict(TrainConfig, {"lr": 0})
    with pytest.raises(CompressError, match="fp16 needs a CUDA GPU"):
        train(make_tiny_model(), _toy_dataset(8), _collate, TrainConfig(precision="fp16", device="cpu"),
              loss_fn=_loss, work_dir="/tmp/unused")


def test_grad_accumulation_matches_full_batch(tmp_path):
    data = _toy_dataset(32)
    base = dict(epochs=1, batch_size=8, lr=1e-3, seed=0, group_by_length=False)
    full, accum = make_tiny_model(seed=2), make_tiny_model(seed=2)
    train(full, data, _collate, TrainConfig(**base), loss_fn=_loss, work_dir=tmp_path / "a")
    train(accum, data, _collate, TrainConfig(**base, grad_accum=2), loss_fn=_loss, work_dir=tmp_path / "b")
    a, b = _weights(full), _weights(accum)
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)
