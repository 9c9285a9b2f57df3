"""The teacher-output cache: each example's stored outputs are the teacher's for that example alone."""

from __future__ import annotations

import logging
import random
import threading
import time

import numpy as np
import torch
from datasets import Dataset

from compress.core.data.features import collate
from compress.distill.teacher_cache import load_or_build
from tests.conftest import make_tiny_model, make_tokenizer


def _features(n: int, seed: int = 0) -> Dataset:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):  # lengths 3..40 in no order, so that batches by length differ from batches in dataset order
        length = rng.randint(3, 40)
        ids = [2] + [rng.randint(5, 90) for _ in range(length - 2)] + [3]
        rows.append({"input_ids": ids, "attention_mask": [1] * length, "token_type_ids": [0] * length, "labels": 0})
    return Dataset.from_list(rows)


def test_cached_outputs_are_each_examples_own_and_the_pass_is_logged(tmp_path, caplog):
    model = make_tiny_model(num_labels=2, num_hidden_layers=2)
    features = _features(37)
    pad = collate(make_tokenizer(tmp_path / "tok"))
    with caplog.at_level(logging.INFO, logger="compress.distill.teacher_cache"):
        cache = load_or_build(model, "h", features, pad, outputs=["logits"], layers=[1], cache_dir=tmp_path / "c",
                              batch_size=8)
    assert cache.hit is False
    assert any("scoring 37 training examples once" in r.getMessage() for r in caplog.records)
    lengths = [len(x) for x in features["input_ids"]]
    assert cache.offsets.tolist() == np.concatenate([[0], np.cumsum(lengths)]).tolist()
    with torch.inference_mode():
        for i in range(len(features)):  # the teacher on example i alone, unpadded
            row = {k: torch.tensor([features[i][k]]) for k in ("input_ids", "attention_mask", "token_type_ids")}
            out = model(**row, output_hidden_states=True)
            assert torch.allclose(cache.batch_outputs([i], "logits")[0], out.logits[0], atol=1e-5)
            hidden = cache.batch_hidden([i], lengths[i])[0, 0]  # layer 1, this example, its tokens
            assert torch.allclose(hidden, out.hidden_states[1][0], atol=2e-3)  # float16 on disk
    again = load_or_build(model, "h", features, pad, outputs=["logits"], layers=[1], cache_dir=tmp_path / "c", batch_size=8)
    assert again.hit is True and np.array_equal(again.outputs["logits"], cache.outputs["logits"])


def test_runs_started_together_run_the_teacher_once(tmp_path, monkeypatch):
    import compress.distill.teacher_cache as tc

    model = make_tiny_model(num_labels=2, num_hidden_layers=2)
    features = _features(12)
    pad = collate(make_tokenizer(tmp_path / "tok"))
    passes, real = [], tc._compute

    def counted(*args, **kwargs):  # slow enough that the second run arrives while the first scores
        passes.append(1)
        time.sleep(0.5)
        return real(*args, **kwargs)

    monkeypatch.setattr(tc, "_compute", counted)
    go, got = threading.Barrier(2), []

    def run():
        go.wait()
        got.append(load_or_build(model, "h", features, pad, outputs=["logits"], cache_dir=tmp_path / "c", batch_size=4))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert passes == [1]  # the teacher ran once; the second run waited and read the cache
    assert sorted(c.hit for c in got) == [False, True]
    assert np.array_equal(got[0].outputs["logits"], got[1].outputs["logits"])
    assert [p.name for p in (tmp_path / "c").iterdir()] == [got[0].path.name]  # no lock or temporary folder left
