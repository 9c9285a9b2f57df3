"""The training loop: schedules, batching, exact resume, NaN handling."""

from __future__ import annotations

import json
import math
import pickle
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from compress.core.errors import CompressError
from compress.core.batches import epoch_order, global_batches
from compress.core.checkpoints import (
    PROGRESS_FILE,
    STATE_FILE,
    fingerprint,
    list_checkpoints,
    prepare_work_dir,
    work_dir_for,
)
from compress.core.train import TrainConfig, linear_schedule, param_groups, train
from tests.conftest import make_tiny_model

ROOT = Path(__file__).resolve().parents[2]


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


@pytest.mark.parametrize("change", [{"batch_size": 16}, {"seed": 7}, {"epochs": 3}, {"grad_accum": 2}, {"data": 40}])
def test_resume_refuses_other_settings(tmp_path, change):
    data = _toy_dataset(32)
    cfg = TrainConfig(epochs=2, batch_size=8, save_every=2, group_by_length=False)
    train(make_tiny_model(), data, _collate, cfg, loss_fn=_loss, work_dir=tmp_path / "w")
    other_data = _toy_dataset(change["data"]) if "data" in change else data
    other = TrainConfig(**{**cfg.__dict__, **{k: v for k, v in change.items() if k != "data"}})
    with pytest.raises(CompressError, match="made with other settings or data .only --lr, .* may change on --resume"):
        train(make_tiny_model(), other_data, _collate, other, loss_fn=_loss, work_dir=tmp_path / "w", resume=True)


def _nan_from_call(n):
    """A loss function whose loss is NaN from its ``n``-th call on (one call per step here)."""
    calls = {"n": 0}

    def loss_fn(model, batch):
        calls["n"] += 1
        loss, logs = _loss(model, batch)
        return (loss * math.nan if calls["n"] >= n else loss), logs

    return loss_fn


def test_nan_loss_stops_with_last_checkpoint(tmp_path):
    data = _toy_dataset(32)
    cfg = TrainConfig(epochs=4, batch_size=8, save_every=2, group_by_length=False)
    with pytest.raises(CompressError) as err:
        train(make_tiny_model(), data, _collate, cfg, loss_fn=_nan_from_call(5), work_dir=tmp_path / "w")
    message = str(err.value)
    assert "the loss became nan at step 5" in message and "step-00000004" in message and "\n" not in message
    assert "resume from it with the same options plus --resume and a lower --lr" in message
    assert [p.name for p in list_checkpoints(tmp_path / "w")] == ["step-00000002", "step-00000004"]  # kept to resume


def _schedule(peak, step, warmup, total):
    """The learning rate logged after ``step`` steps: linear_schedule's factor at that step times the peak."""
    return peak * ((step + 1) / warmup if step < warmup else max(0.0, (total - step) / (total - warmup)))


def test_resume_after_nan_with_lower_lr_finishes_and_records_it(tmp_path):
    data = _toy_dataset(32)
    work = tmp_path / "w"
    cfg = TrainConfig(epochs=4, batch_size=8, lr=1e-3, warmup_steps=2, save_every=4, log_every=1, seed=1,
                      group_by_length=False)
    with pytest.raises(CompressError, match="the loss became nan at step 6.*step-00000004.*a lower --lr"):
        train(make_tiny_model(seed=4), data, _collate, cfg, loss_fn=_nan_from_call(6), work_dir=work)
    # other data order or step count: still refused, and the checkpoint is left as it was
    with pytest.raises(CompressError, match="made with other settings or data"):
        train(make_tiny_model(seed=4), data, _collate, TrainConfig(**{**cfg.__dict__, "batch_size": 16}),
              loss_fn=_loss, work_dir=work, resume=True)
    # what the message advises: the same options plus --resume and a lower --lr
    lower = TrainConfig(**{**cfg.__dict__, "lr": 1e-4})
    model = make_tiny_model(seed=4)
    result = train(model, data, _collate, lower, loss_fn=_loss, work_dir=work, resume=True)
    assert result.steps == 16
    history = result.history
    changes = [h for h in history if "changed" in h]
    assert changes == [{"step": 4, "changed": {"lr": {"from": 1e-3, "to": 1e-4}}}]
    logged = {h["step"]: h["lr"] for h in history if "loss" in h}
    assert sorted(logged) == list(range(1, 17))  # steps 1-4 from the checkpoint, 5-16 after the resume
    for step, lr in logged.items():  # the schedule goes on from the new peak at the same point
        assert lr == pytest.approx(_schedule(1e-3 if step <= 4 else 1e-4, step, 2, 16), rel=1e-9)
    assert _progress(work)["history"] == [{k: v for k, v in h.items() if k != "examples_per_second"} for h in history]
    # the optimizer really stepped with the new rate: not the weights of the run at the old one
    reference = make_tiny_model(seed=4)
    train(reference, data, _collate, cfg, loss_fn=_loss, work_dir=tmp_path / "ref")
    ref, got = _weights(reference), _weights(model)
    assert any(not torch.equal(ref[k], got[k]) for k in ref)


def test_resume_with_unchanged_settings_records_no_change(tmp_path):
    data = _toy_dataset(32)
    cfg = TrainConfig(epochs=2, batch_size=8, save_every=2, group_by_length=False)
    with pytest.raises(CompressError):
        train(make_tiny_model(), data, _collate, cfg, loss_fn=_nan_from_call(4), work_dir=tmp_path / "w")
    result = train(make_tiny_model(), data, _collate, cfg, loss_fn=_loss, work_dir=tmp_path / "w", resume=True)
    assert result.steps == 8 and not [h for h in result.history if "changed" in h]


def test_checkpoint_keyed_with_the_lr_still_resumes(tmp_path):
    """A checkpoint written before the optimizer settings left the run key resumes as before, to the same weights."""
    data = _toy_dataset(32)
    cfg = TrainConfig(epochs=2, batch_size=8, lr=1e-3, save_every=2, seed=2, group_by_length=False)
    reference = make_tiny_model(seed=3)
    train(reference, data, _collate, cfg, loss_fn=_loss, work_dir=tmp_path / "ref")
    with pytest.raises(CompressError):
        train(make_tiny_model(seed=3), data, _collate, cfg, loss_fn=_nan_from_call(6), work_dir=tmp_path / "w")
    for checkpoint in list_checkpoints(tmp_path / "w"):  # as the loop wrote them before: every setting in the key
        state = json.loads((checkpoint / STATE_FILE).read_text())
        del state["settings"]
        state["key"] = fingerprint(asdict(cfg) | {"device": None, "keep_checkpoints": None}, [(32, 8, 8)], 1, None)
        (checkpoint / STATE_FILE).write_text(json.dumps(state))
    model = make_tiny_model(seed=3)
    result = train(model, data, _collate, cfg, loss_fn=_loss, work_dir=tmp_path / "w", resume=True)
    assert result.steps == 8 and not [h for h in result.history if "changed" in h]
    ref, got = _weights(reference), _weights(model)
    assert all(torch.equal(ref[k], got[k]) for k in ref)
    with pytest.raises(CompressError, match="made with other settings or data"):  # and the key still guards it
        train(make_tiny_model(seed=3), data, _collate, TrainConfig(**{**cfg.__dict__, "seed": 9}), loss_fn=_loss,
              work_dir=tmp_path / "w", resume=True)


def test_overflowing_lr_stops_like_a_nan_and_a_lower_one_resumes(tmp_path):
    data = _toy_dataset(32)
    work = tmp_path / "w"
    cfg = TrainConfig(epochs=2, batch_size=8, lr=1e-3, warmup_steps=0, save_every=2, group_by_length=False)

    class Stop(Exception):
        pass

    def stop_at_step_3(items, step):
        if step == 2:
            raise Stop()
        return _collate(items, step)

    with pytest.raises(Stop):
        train(make_tiny_model(), data, stop_at_step_3, cfg, loss_fn=_loss, work_dir=work)
    # Adam's step size at step 3, lr x 0.75 (the schedule) / (1 - 0.9**3), does not fit in a float32 (3.4e38):
    # torch raises "value cannot be converted to type float without overflow" inside optimizer.step()
    huge = TrainConfig(**{**cfg.__dict__, "lr": 1e39})
    with pytest.raises(CompressError) as err:
        train(make_tiny_model(), data, _collate, huge, loss_fn=_loss, work_dir=work, resume=True)
    message = str(err.value)
    assert message.startswith("the optimizer step overflowed") and "at step 3" in message and "\n" not in message
    assert "step-00000002" in message and "--resume and a lower --lr" in message
    assert isinstance(err.value.__cause__, RuntimeError) and "overflow" in str(err.value.__cause__)
    result = train(make_tiny_model(), data, _collate, cfg, loss_fn=_loss, work_dir=work, resume=True)
    assert result.steps == 8


def test_overflowing_lr_without_a_checkpoint_leaves_nothing(tmp_path):
    work = prepare_work_dir(work_dir_for(tmp_path / "out"), resume=False)
    cfg = TrainConfig(epochs=1, batch_size=8, lr=1e38, warmup_steps=0, group_by_length=False)
    with pytest.raises(CompressError, match="the optimizer step overflowed .* at step 1; training stopped and no "
                                           "checkpoint was written yet; run again with a lower --lr"):
        train(make_tiny_model(), _toy_dataset(16), _collate, cfg, loss_fn=_loss, work_dir=work)
    assert not work.exists()


def test_nan_weights_are_never_checkpointed(tmp_path):
    data = _toy_dataset(32)
    calls = {"n": 0}

    def nan_gradient_at_step_4(model, batch):
        calls["n"] += 1
        loss, logs = _loss(model, batch)
        if calls["n"] == 4:  # a finite loss whose gradient is nan: sqrt'(0) = inf, times 0
            w = next(model.parameters())
            loss = loss + 0 * torch.sqrt(w - w.detach()).sum()
        return loss, logs

    cfg = TrainConfig(epochs=4, batch_size=8, save_every=2, max_grad_norm=0, group_by_length=False)
    with pytest.raises(CompressError) as err:
        train(make_tiny_model(), data, _collate, cfg, loss_fn=nan_gradient_at_step_4, work_dir=tmp_path / "w")
    message = str(err.value)
    assert message.startswith("the weights became inf or nan at step 4") and "step-00000002" in message
    assert [p.name for p in list_checkpoints(tmp_path / "w")] == ["step-00000002"]  # none of the nan weights


class _Payload:
    """Unpickling this creates the file ``marker``: stands for any code a malicious checkpoint would run."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


@pytest.mark.parametrize("name", ["optimizer.pt", "scheduler.pt", "rng.pt"])
@pytest.mark.parametrize("writer", ["torch.save", "pickle.dump"])
def test_untrusted_checkpoint_is_refused_and_never_run(tmp_path, name, writer):
    # the payload is live: read without weights_only, it runs
    control = tmp_path / "control.pt"
    torch.save(_Payload(tmp_path / "ran-control"), control)
    torch.load(control, weights_only=False).close()
    assert (tmp_path / "ran-control").exists()

    data = _toy_dataset(16)
    cfg = TrainConfig(epochs=2, batch_size=8, save_every=1, keep_checkpoints=1, group_by_length=False)
    work = tmp_path / "w"
    with pytest.raises(CompressError):
        train(make_tiny_model(), data, _collate, cfg, loss_fn=_nan_from_call(3), work_dir=work)
    (checkpoint,) = list_checkpoints(work)
    marker = tmp_path / "ran"
    if writer == "torch.save":
        torch.save(_Payload(marker), checkpoint / name)
    else:
        with open(checkpoint / name, "wb") as fh:
            pickle.dump(_Payload(marker), fh)
    with pytest.raises(CompressError) as err:
        train(make_tiny_model(), data, _collate, cfg, loss_fn=_loss, work_dir=work, resume=True)
    assert str(err.value) == (
        f"the checkpoint at {checkpoint} is not trusted: {name} holds more than plain tensors and could run code if "
        f"read; it was not read, remove {work} to start over"
    )
    assert not marker.exists()  # the payload did not run
    assert list_checkpoints(work) == [checkpoint]  # and nothing was deleted behind the user's back


def test_failed_start_leaves_no_work_dir(tmp_path):
    """--precision fp16 on a CPU: refused before any step, and the work directory made for the run is gone."""
    work = prepare_work_dir(work_dir_for(tmp_path / "out"), resume=False)
    assert work.is_dir()
    with pytest.raises(CompressError, match="fp16 needs a CUDA GPU"):
        train(make_tiny_model(), _toy_dataset(8), _collate, TrainConfig(precision="fp16", device="cpu"),
              loss_fn=_loss, work_dir=work)
    assert not work.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("stage", [None, "joint"])  # distillation trains in a subdirectory per stage
def test_nan_before_the_first_checkpoint_leaves_no_work_dir(tmp_path, stage):
    work = prepare_work_dir(work_dir_for(tmp_path / "out"), resume=False)
    (work / "tokenizer").mkdir()  # what a stage keeps there besides checkpoints (a trained vocabulary)
    cfg = TrainConfig(epochs=2, batch_size=8, save_every=4, group_by_length=False)
    with pytest.raises(CompressError, match="the loss became nan at step 2; training stopped and no checkpoint"):
        train(make_tiny_model(), _toy_dataset(32), _collate, cfg, loss_fn=_nan_from_call(2),
              work_dir=work / stage if stage else work)
    assert list(tmp_path.iterdir()) == []


def test_failure_keeps_a_work_dir_that_holds_checkpoints(tmp_path):
    work = prepare_work_dir(work_dir_for(tmp_path / "out"), resume=False)
    cfg = TrainConfig(epochs=2, batch_size=8, save_every=2, group_by_length=False)
    with pytest.raises(CompressError):  # the intermediate stage checkpointed, the prediction stage fails at once
        train(make_tiny_model(), _toy_dataset(32), _collate, cfg, loss_fn=_nan_from_call(3), work_dir=work / "intermediate")
    with pytest.raises(CompressError):
        train(make_tiny_model(), _toy_dataset(32), _collate, cfg, loss_fn=_nan_from_call(1), work_dir=work / "prediction")
    assert [p.name for p in list_checkpoints(work / "intermediate")] == ["step-00000002"]
    assert not (work / "prediction").exists()


def test_library_work_dir_made_by_a_failed_run_is_removed(tmp_path):
    cfg = TrainConfig(epochs=2, batch_size=8, save_every=4, group_by_length=False)
    with pytest.raises(CompressError):
        train(make_tiny_model(), _toy_dataset(32), _collate, cfg, loss_fn=_nan_from_call(2), work_dir=tmp_path / "w")
    assert not (tmp_path / "w").exists()
    mine = tmp_path / "mine"  # a directory that was there before: only the run's own files go
    mine.mkdir()
    (mine / "notes.txt").write_text("kept")
    with pytest.raises(CompressError):
        train(make_tiny_model(), _toy_dataset(32), _collate, cfg, loss_fn=_nan_from_call(2), work_dir=mine)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


@pytest.mark.e2e
def test_work_dir_of_a_command_failing_before_training_is_removed_at_exit(tmp_path):
    """A command that fails after prepare_work_dir (a bad option found later) leaves no empty work directory."""
    kept = work_dir_for(tmp_path / "kept")  # an interrupted run's checkpoint: --resume continues it, so it stays
    (kept / "checkpoints" / "step-00000002").mkdir(parents=True)
    (kept / "checkpoints" / "step-00000002" / "trainer_state.json").write_text("{}")
    script = (
        "import sys; from pathlib import Path; from compress.core.checkpoints import prepare_work_dir, work_dir_for\n"
        "for name, resume in (('fresh', False), ('kept', True), ('made', True)):\n"
        "    assert prepare_work_dir(work_dir_for(Path(sys.argv[1]) / name), resume).is_dir()\n"
        "raise SystemExit('a later validation failed')\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1 and "a later validation failed" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [".kept.work"]
    assert list_checkpoints(kept)


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


def test_config_validation(tmp_path):
    from compress.core.config import from_dict

    with pytest.raises(CompressError, match="--batch-size 10 is not divisible by --grad-accum 3"):
        from_dict(TrainConfig, {"batch_size": 10, "grad_accum": 3})
    with pytest.raises(CompressError, match="--lr must be a positive number"):
        from_dict(TrainConfig, {"lr": 0})
    with pytest.raises(CompressError, match="fp16 needs a CUDA GPU"):
        train(make_tiny_model(), _toy_dataset(8), _collate, TrainConfig(precision="fp16", device="cpu"),
              loss_fn=_loss, work_dir=tmp_path / "unused")


def test_grad_accumulation_matches_full_batch(tmp_path):
    data = _toy_dataset(32)
    base = dict(epochs=1, batch_size=8, lr=1e-3, seed=0, group_by_length=False)
    full, accum = make_tiny_model(seed=2), make_tiny_model(seed=2)
    train(full, data, _collate, TrainConfig(**base), loss_fn=_loss, work_dir=tmp_path / "a")
    train(accum, data, _collate, TrainConfig(**base, grad_accum=2), loss_fn=_loss, work_dir=tmp_path / "b")
    a, b = _weights(full), _weights(accum)
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)
