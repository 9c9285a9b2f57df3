"""bench.teachers: the options it is given reach the fine-tuning (the training itself is faked)."""

from __future__ import annotations

import json
from pathlib import Path

import bench.teachers as teachers


def test_the_seed_and_recipe_reach_the_fine_tuning_and_the_table(tmp_path, monkeypatch):
    seen = {}

    def fake_finetune(model, out, cfg, overwrite):
        seen.update(seed=cfg.train.seed, epochs=cfg.train.epochs, lr=cfg.train.lr, task=cfg.task)
        Path(out).mkdir(parents=True)
        (Path(out) / "config.json").write_text("{}")
        records = [{"kind": "training", "n_train": 2490, "seconds": 60.0, "best_step": 7, "steps": 10},
                   {"kind": "eval", "split": "dev", "metrics": {"accuracy": 59.57}, "n": 277}]
        (Path(out) / "metrics.json").write_text(json.dumps({"results": records}))

    monkeypatch.setattr(teachers, "finetune", fake_finetune)
    monkeypatch.setattr(teachers, "minilm_path", lambda: tmp_path / "minilm")
    args = ["--data", str(tmp_path), "--models", str(tmp_path / "models"), "--out", str(tmp_path / "out"),
            "--tasks", "rte", "--epochs", "10", "--lr", "2e-5", "--seed", "7"]
    assert teachers.main(args) == 0
    assert seen == {"seed": 7, "epochs": 10, "lr": 2e-5, "task": "rte"}
    table = (tmp_path / "out" / "teachers.md").read_text()
    assert "--seed 7" in table and "| RTE | accuracy | 59.57 |" in table
