"""The teacher stage end to end on tiny models: pretraining, fine-tuning, the grid, hub names."""

from __future__ import annotations

import json
import time

import pytest
import torch
from safetensors.torch import load_file

from compress.core.data import synthetic
from compress.core.formats.artifacts import load_tokenizer
from compress.core.formats.records import read_compression, read_metrics
from compress.core.compat import wordpiece_tokenizer
from compress.core.config import from_dict
from compress.core.errors import CompressError
from compress.core.formats.runtime import load_model
from compress.core.model.shapes import resolve_shape
from compress.teacher.create import create_model
from compress.teacher.finetune import FinetuneConfig, finetune, finetune_grid
from compress.teacher.pretrain import PretrainConfig, phase_steps, pretrain
from tests.conftest import make_tiny_model, save_tiny


def _corpus(path, n_docs=60, sentences=6, seed=0):
    rows = synthetic.examples(n_docs * sentences, seed=seed)
    docs = ["\n".join(text for text, _ in rows[d * sentences : (d + 1) * sentences]) for d in range(n_docs)]
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


def _pretrain_cfg(corpus, **overrides):
    options = {
        "corpus": [str(corpus)], "vocab_size": 120, "shape": "2L-32", "heads": 2, "max_positions": 64,
        "phase1_length": 32, "phase2_length": 64, "phase1_fraction": 0.75, "max_steps": 16, "batch_size": 16,
        "lr": 2e-3, "warmup_ratio": 0.1, "eval_every": 4, "save_every": 4, "log_every": 2, "seed": 5,
    }
    options.update(overrides)
    return from_dict(PretrainConfig, options)


def test_phase_split():
    assert phase_steps(1000, 0.9) == (900, 100)
    assert phase_steps(10, 1.0) == (10, 0)
    assert phase_steps(3, 0.1) == (1, 2)


def test_pretrain_defaults_follow_the_paper():
    cfg = from_dict(PretrainConfig, {"corpus": ["x.txt"]})
    t = cfg.train
    assert (t.lr, t.adam_beta1, t.adam_beta2, t.weight_decay) == (1e-4, 0.9, 0.999, 0.01)
    assert (cfg.phase1_length, cfg.phase2_length, cfg.phase1_fraction) == (128, 512, 0.9)
    assert cfg.mlm_probability == 0.15 and cfg.nsp_probability == 0.5
    # flags override the stage's own TrainConfig defaults, not TrainConfig's
    assert from_dict(PretrainConfig, {"corpus": ["x"], "lr": 5e-4}).train.batch_size == 256


@pytest.mark.versions
def test_pretrain_tiny_model(tmp_path):
    corpus = _corpus(tmp_path / "corpus.txt")
    out = pretrain(tmp_path / "bert", _pretrain_cfg(corpus))
    model = load_model(out)
    assert type(model).__name__ == "BertForPreTraining"
    assert model.config.hidden_act == "gelu" and model.config.hidden_dropout_prob == 0.1
    tokenizer = load_tokenizer(out)
    assert tokenizer.convert_tokens_to_ids(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]) == [0, 1, 2, 3, 4]
    training = next(r for r in read_metrics(out) if r["kind"] == "training")
    assert [p["name"] for p in training["phases"]] == ["seq32", "seq64"]
    assert [p["steps"] for p in training["phases"]] == [12, 4]
    phases = [h["phase"] for h in training["history"] if "phase" in h]
    assert phases[0] == "seq32" and phases[-1] == "seq64"
    losses = [h["loss"] for h in training["history"] if "loss" in h]
    assert losses[-1] < losses[0]
    masking = training["masking"]
    assert masking["special_selected"] == 0
    assert abs(masking["selected_fraction"] - 0.15) < 0.02
    assert abs(masking["not_next_fraction"] - 0.5) < 0.1
    assert (out / "pretraining_curves.png").stat().st_size > 1000
    assert read_compression(out)["stage"] == "pretrain"
    assert not (tmp_path / ".bert.work").exists()  # checkpoints are removed after success


def test_pretrain_on_a_datasets_corpus_with_explicit_shape(tmp_path):
    import datasets

    text = _corpus(tmp_path / "corpus.txt").read_text(encoding="utf-8")
    datasets.Dataset.from_dict({"text": text.split("\n\n")}).save_to_disk(str(tmp_path / "ds"))
    cfg = _pretrain_cfg(tmp_path / "ds", shape="base", layers=1, hidden=32, heads=2, ffn=48, max_steps=4,
                        phase1_fraction=1.0)
    out = pretrain(tmp_path / "bert", cfg)
    c = load_model(out).config
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.intermediate_size) == (1, 32, 2, 48)
    # the WordPiece vocabulary was trained on the dataset's rows (synthetic words, not a reused vocabulary)
    vocab = load_tokenizer(out).get_vocab()
    assert len(vocab) <= 120 and synthetic.examples(1, seed=0)[0][0].split()[0].lower() in vocab
    assert not (tmp_path / ".bert.work").exists()


@pytest.mark.e2e
def test_pretrain_resume_after_crash_matches_uninterrupted(tmp_path, monkeypatch):
    import compress.teacher.pretrain as pt

    corpus = _corpus(tmp_path / "corpus.txt")
    reference = pretrain(tmp_path / "ref", _pretrain_cfg(corpus, tokenizer=None))
    ref_tok = tmp_path / "ref"  # reuse the trained vocabulary: WordPiece ties are hash-ordered
    reference = pretrain(tmp_path / "ref2", _pretrain_cfg(corpus, tokenizer=str(ref_tok)))

    calls = {"n": 0}
    real = pt.pretraining_loss

    def crash_at_step_10(model, batch):
        calls["n"] += 1
        if calls["n"] == 10:
            raise KeyboardInterrupt  # as if the process were stopped
        return real(model, batch)

    monkeypatch.setattr(pt, "pretraining_loss", crash_at_step_10)
    with pytest.raises(KeyboardInterrupt):
        pretrain(tmp_path / "run", _pretrain_cfg(corpus, tokenizer=str(ref_tok)))
    assert not (tmp_path / "run").exists()  # nothing published
    monkeypatch.setattr(pt, "pretraining_loss", real)
    # every checkpoint file read on resume goes through torch.load(weights_only=True): no code can run
    loads, real_load = [], torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **kw: loads.append(kw.get("weights_only")) or real_load(*a, **kw))
    out = pretrain(tmp_path / "run", _pretrain_cfg(corpus, tokenizer=str(ref_tok), resume=True))
    assert len(loads) >= 3 and all(w is True for w in loads)  # optimizer, scheduler, RNG states
    a, b = load_model(reference).state_dict(), load_model(out).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_pretrain_errors(tmp_path):
    with pytest.raises(CompressError, match="no corpus given"):
        from_dict(PretrainConfig, {})
    with pytest.raises(CompressError, match="--phase2-length 1024 exceeds --max-positions 512"):
        from_dict(PretrainConfig, {"corpus": ["x"], "phase2_length": 1024})
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"good line\n\nbad \xff byte\n")
    with pytest.raises(CompressError, match="bad.txt:3: not valid UTF-8"):
        pretrain(tmp_path / "out", _pretrain_cfg(bad))


# ---------------------------------------------------------------------------- fine-tuning


@pytest.fixture
def generated(tmp_path):
    data = synthetic.write_sst2_layout(tmp_path / "data", n_train=1200, n_dev=300, n_test=50)
    vocab = synthetic.write_vocab(tmp_path / "vocab.txt")
    init = create_model(resolve_shape("2L-64"), tmp_path / "init", tokenizer=vocab, task="sst2", max_positions=64)
    return data, init


def _ft_cfg(data, **train):
    options = {"task": "sst2", "data_dir": str(data), "epochs": 6, "lr": 2e-3, "batch_size": 32, "seed": 1}
    options.update(train)
    return from_dict(FinetuneConfig, options)


@pytest.mark.versions
@pytest.mark.e2e
def test_finetune_learns_a_separable_task(tmp_path, generated):
    data, init = generated
    out = finetune(init, tmp_path / "ft", _ft_cfg(data))
    (record,) = [r for r in read_metrics(out) if r["kind"] == "eval"]
    assert record["metrics"]["accuracy"] >= 90.0
    # the saved model is the best epoch, and evaluating it again gives the recorded number
    from compress.eval.evaluate import EvalConfig, evaluate

    (again,) = evaluate(out, EvalConfig(task="sst2", data_dir=str(data), record=False))
    assert again["metrics"]["accuracy"] == pytest.approx(record["metrics"]["accuracy"])
    config = json.loads((out / "config.json").read_text())
    assert config["id2label"] == {"0": "negative", "1": "positive"}
    assert read_compression(out)["parent"]["path"] == str(init.resolve())


def test_finetune_from_a_bare_encoder_draws_its_head_from_the_seed(tmp_path):
    # The classifier a bare encoder lacks is new; it must come from --seed, not from the generator's state
    # (at random in a fresh process), or one command gives a different teacher each run.
    data = synthetic.write_sst2_layout(tmp_path / "data", n_train=64, n_dev=16, n_test=4)
    tok = wordpiece_tokenizer(synthetic.write_vocab(tmp_path / "vocab.txt"))
    encoder = save_tiny(make_tiny_model(head="base", vocab_size=len(tok)), tok, tmp_path / "encoder")

    def run(name: str, seed: int, noise: int) -> dict[str, torch.Tensor]:
        torch.manual_seed(noise)
        return load_file(finetune(encoder, tmp_path / name, _ft_cfg(data, epochs=1, seed=seed)) / "model.safetensors")

    a, b, c = run("a", 1, 10), run("b", 1, 20), run("c", 2, 10)
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["classifier.weight"], c["classifier.weight"])


def test_finetune_from_a_pretraining_output(tmp_path):
    corpus = _corpus(tmp_path / "corpus.txt")
    bert = pretrain(tmp_path / "bert", _pretrain_cfg(corpus, max_steps=4, phase1_fraction=1.0))
    data = synthetic.write_sst2_layout(tmp_path / "data", n_train=64, n_dev=32, n_test=8)
    out = finetune(bert, tmp_path / "ft", _ft_cfg(data, epochs=1))
    model = load_model(out)
    assert type(model).__name__ == "BertForSequenceClassification"
    pre = load_model(bert)
    # the encoder came from the pretrained model (the embedding trains too, so compare shapes and a frozen-ish part)
    assert model.bert.embeddings.word_embeddings.weight.shape == pre.bert.embeddings.word_embeddings.weight.shape


def test_regression_and_qa_heads(tmp_path, generated):
    from compress.core.formats.runtime import load_model_for_task
    from compress.core.data.tasks import get_task

    _, init = generated
    stsb = load_model_for_task(init, get_task("stsb"))
    assert stsb.config.num_labels == 1 and stsb.config.problem_type == "regression"
    qa = load_model_for_task(init, get_task("squad"))
    assert type(qa).__name__ == "BertForQuestionAnswering"


@pytest.mark.e2e
def test_grid_selects_best_on_dev(tmp_path, generated):
    data, init = generated
    grid = {"batch_size": (32,), "lr": (1e-5, 2e-3), "epochs": (2,)}
    out = finetune_grid(init, tmp_path / "grid", _ft_cfg(data), grid=grid)
    table = (out / "grid.md").read_text()
    assert "bs32-lr1e-05-ep2" in table and "bs32-lr0.002-ep2" in table
    runs = json.loads((out / "grid.json").read_text())["runs"]
    best = max(runs, key=lambda r: r["accuracy"])
    assert json.loads((out / "grid.json").read_text())["best"] == best["run"] == "bs32-lr0.002-ep2"
    assert "(selected)" in table.splitlines()[[i for i, l in enumerate(table.splitlines()) if best["run"] in l][0]]
    assert not (tmp_path / ".grid.grid").exists()


def test_finetune_refuses_existing_output(tmp_path, generated):
    data, init = generated
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("x")
    with pytest.raises(CompressError, match="not empty; pass --overwrite"):
        finetune(init, tmp_path / "taken", _ft_cfg(data))


def test_hub_names_fail_fast_offline(monkeypatch):
    from compress.teacher.presets import resolve_model

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.monotonic()
    with pytest.raises(CompressError) as err:
        resolve_model("bert-base")
    assert time.monotonic() - start < 10
    assert "google-bert/bert-base-uncased" in str(err.value) and "local model directory" in str(err.value)
    with pytest.raises(CompressError, match="neither a directory nor a known hub model"):
        resolve_model("no-such-model")
