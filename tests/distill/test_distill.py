"""Distillation end to end on tiny models: KD against a hard-label twin, the cache, every term."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import replace

import pytest
import torch

from compress.core.data import synthetic
from compress.core.formats.artifacts import load_config
from compress.core.formats.records import read_compression, read_metrics
from compress.core.config import from_dict
from compress.core.errors import CompressError
from compress.core.formats.runtime import load_model
from compress.core.model.shapes import StudentShape, resolve_shape
from compress.distill.task import DistillConfig, distill
from compress.teacher.create import create_model
from compress.teacher.finetune import FinetuneConfig, finetune


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    """A 2-layer teacher fine-tuned on the generated sentiment task (shared by the tests here).

    15% of the training labels are flipped. The teacher still learns the task's rule
    (dev accuracy ~99.7%), so its soft targets are better than the gold labels: the
    setting where a student trained by distillation clearly beats its twin trained on
    the labels alone (seen: 84.7% vs 54.7-64.3% over three seeds).
    """
    root = tmp_path_factory.mktemp("distill")
    data = synthetic.write_sst2_layout(root / "data", n_train=1200, n_dev=300, n_test=20, label_noise=0.15)
    vocab = synthetic.write_vocab(root / "vocab.txt")
    init = create_model(resolve_shape("2L-64"), root / "init", tokenizer=vocab, task="sst2", max_positions=64, seed=3)
    cfg = from_dict(FinetuneConfig, {"task": "sst2", "data_dir": str(data), "epochs": 8, "lr": 1e-3, "seed": 3})
    teacher = finetune(init, root / "teacher", cfg)
    return root, data, teacher


def _cfg(setting, **options):
    root, data, _ = setting
    base = {"task": "sst2", "student": "2L-32", "heads": 2, "init": "random", "data_dir": str(data), "epochs": 4,
            "lr": 2e-3, "seed": 3, "cache_dir": str(root / "cache"), "relation_heads": 4}
    base.update(options)
    return from_dict(DistillConfig, base)


def _dev(out):
    return next(r for r in read_metrics(out) if r["kind"] == "eval")["metrics"]["accuracy"]


@pytest.mark.e2e
def test_kd_student_matches_teacher_and_beats_hard_label_twin(setting, tmp_path):
    root, _, teacher = setting
    teacher_acc = _dev(teacher)
    assert teacher_acc >= 95.0
    kd = distill(teacher, tmp_path / "kd", _cfg(setting, losses=["kd"]))
    twin = distill(teacher, tmp_path / "hard", _cfg(setting, losses=["hard"]))
    assert _dev(kd) >= _dev(twin) + 10.0
    retention = next(r for r in read_metrics(kd) if r["kind"] == "retention")
    assert retention["teacher"] == pytest.approx(teacher_acc)
    assert retention["ratio"] == pytest.approx(_dev(kd) / teacher_acc)
    assert retention["teacher_at_chance"] is False and retention["teacher_warning"] is None  # a real teacher: no flag
    assert read_compression(kd)["teacher_at_chance"] is False


def test_compression_record_describes_the_run(setting, tmp_path):
    _, _, teacher = setting
    out = distill(teacher, tmp_path / "s", _cfg(setting, epochs=1, student="1L-64", heads=None, init="teacher-layers",
                                                 init_layers=[0]))
    record = read_compression(out)
    assert record["stage"] == "distill" and record["losses"] == ["kd", "hard"]
    assert record["teacher"]["path"] == str(teacher.resolve()) and record["teacher"]["hash"].startswith("sha256:")
    assert record["student_shape"]["layers"] == 1 and record["init"]["teacher_layers"] == [0]
    assert record["layer_map"] == [[0, 0], [1, 2]]
    model = load_model(out)
    assert model.config.num_hidden_layers == 1 and model.config.id2label == {0: "negative", 1: "positive"}


@pytest.mark.e2e
def test_teacher_cache_hits_and_invalidates(setting, tmp_path):
    root, _, teacher = setting
    cache = tmp_path / "cache"
    first = distill(teacher, tmp_path / "a", _cfg(setting, epochs=1, cache_dir=str(cache)))
    second = distill(teacher, tmp_path / "b", _cfg(setting, epochs=1, cache_dir=str(cache)))
    third = distill(teacher, tmp_path / "c", _cfg(setting, epochs=1, cache_dir=str(cache), max_length=8))

    def info(out):
        return next(r for r in read_metrics(out) if r["kind"] == "training")["cache"][0]

    assert info(first)["hit"] is False and info(second)["hit"] is True
    assert info(second)["path"] == info(first)["path"]
    assert info(third)["hit"] is False and info(third)["path"] != info(first)["path"]  # truncation changes the token ids
    assert len(list(cache.iterdir())) == 2

    # the key is the teacher's content: a byte-identical copy hits, a teacher with one weight changed misses
    import shutil

    from safetensors.torch import load_file, save_file

    copy = shutil.copytree(teacher, tmp_path / "teacher-copy")
    assert info(distill(copy, tmp_path / "d", _cfg(setting, epochs=1, cache_dir=str(cache))))["hit"] is True
    weights = load_file(copy / "model.safetensors")
    name = next(k for k in weights if k.endswith("classifier.bias"))
    weights[name] = weights[name] + 0.5
    save_file(weights, copy / "model.safetensors", metadata={"format": "pt"})
    fifth = distill(copy, tmp_path / "e", _cfg(setting, epochs=1, cache_dir=str(cache)))
    assert info(fifth)["hit"] is False and len(list(cache.iterdir())) == 3


@pytest.mark.e2e
def test_cached_and_online_teacher_give_the_same_student(setting, tmp_path):
    import torch

    _, _, teacher = setting
    cached = distill(teacher, tmp_path / "cached", _cfg(setting, epochs=1, cache_dir=str(tmp_path / "c")))
    online = distill(teacher, tmp_path / "online", _cfg(setting, epochs=1, cache=False))
    a, b = load_model(cached).state_dict(), load_model(online).state_dict()
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)


@pytest.mark.e2e
@pytest.mark.parametrize(
    "losses", [["kd", "hidden", "attention", "embedding"], ["kd", "cosine"], ["kd", "minilm"]],
)
def test_intermediate_terms_across_widths(setting, tmp_path, losses):
    _, _, teacher = setting
    out = distill(teacher, tmp_path / "s", _cfg(setting, losses=losses, epochs=1))
    training = next(r for r in read_metrics(out) if r["kind"] == "training")
    logged = [h for h in training["history"] if "loss" in h]
    for term in losses:
        assert all(f"loss_{term}" in h and h[f"loss_{term}"] >= 0 for h in logged)
    assert training["cache"] == []  # attention / hidden terms need the teacher online


def test_hidden_cache_feeds_hidden_terms(setting, tmp_path):
    _, _, teacher = setting
    out = distill(teacher, tmp_path / "s", _cfg(setting, losses=["kd", "hidden"], cache_hidden=True, epochs=1,
                                                 student="1L-64", heads=None, cache_dir=str(tmp_path / "c")))
    cache = next(r for r in read_metrics(out) if r["kind"] == "training")["cache"][0]
    assert cache["layers"] == [0, 2] and cache["hit"] is False


@pytest.mark.e2e
def test_two_stage_tinybert_order(setting, tmp_path):
    _, _, teacher = setting
    out = distill(teacher, tmp_path / "s", _cfg(setting, losses=["kd", "hidden", "attention"], two_stage=True,
                                                 intermediate_epochs=1, epochs=1))
    history = next(r for r in read_metrics(out) if r["kind"] == "training")["history"]
    stages = [h["stage"] for h in history]
    assert stages[0] == "intermediate" and stages[-1] == "prediction"
    first = [h for h in history if h["stage"] == "intermediate" and "loss" in h]
    assert all("loss_kd" not in h and "loss_hidden" in h for h in first)


def test_regression_kd(tmp_path):
    from tests.conftest import make_tiny_model, make_tokenizer, save_tiny

    tok = make_tokenizer(tmp_path / "tok")
    teacher = save_tiny(make_tiny_model(num_labels=1, problem_type="regression", num_hidden_layers=2), tok, tmp_path / "t")
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    rows = "".join(f"{i}\tg\tf\ty\t0\tn\tn\tthe cat sat {i % 7}\tthe dog {i % 5}\t{(i % 6):.1f}\n" for i in range(64))
    (tmp_path / "STS-B").mkdir()
    for split in ("train", "dev"):
        (tmp_path / "STS-B" / f"{split}.tsv").write_text(header + rows)
    cfg = from_dict(DistillConfig, {"task": "stsb", "student": "1L-32", "heads": 4, "init": "random",
                                    "data_dir": str(tmp_path), "epochs": 1, "cache_dir": str(tmp_path / "c")})
    out = distill(teacher, tmp_path / "s", cfg)
    metrics = next(r for r in read_metrics(out) if r["kind"] == "eval")["metrics"]
    assert set(metrics) >= {"pearson", "spearmanr"}


def test_errors(setting, tmp_path):
    _, data, teacher = setting
    with pytest.raises(CompressError, match="hidden size 32 vs teacher 64; .*--init random"):
        distill(teacher, tmp_path / "x", _cfg(setting, student="1L-32", init="teacher-layers"))
    with pytest.raises(CompressError, match="has 2 outputs but MNLI has 3 labels"):
        distill(teacher, tmp_path / "y", _cfg(setting, task="mnli"))
    with pytest.raises(CompressError, match="unknown distillation loss 'kl'"):
        _cfg(setting, losses=["kl"])
    with pytest.raises(CompressError, match="--two-stage needs intermediate terms"):
        _cfg(setting, two_stage=True)
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


@pytest.mark.versions
def test_distill_cli(setting, tmp_path, capsys):
    from compress.cli import main

    _, data, teacher = setting
    code = main(["distill", "--teacher", str(teacher), "--task", "sst2", "--student", "1L-64", "--data-dir", str(data),
                 "--epochs", "1", "--lr", "2e-3", "--cache-dir", str(tmp_path / "c"), "--out", str(tmp_path / "s")])
    assert code == 0
    out = capsys.readouterr().out
    assert "retention:" in out and "accuracy" in out and "TEACHER" not in out
    assert json.loads((tmp_path / "s" / "compression.json").read_text())["stage"] == "distill"


class _Seen(logging.Handler):
    """Keeps the messages a logger emits."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_a_teacher_at_chance_is_said_before_training_and_flagged(setting, tmp_path, monkeypatch):
    import compress.distill.task as D

    root, data, _ = setting
    vocab = synthetic.write_vocab(tmp_path / "vocab.txt")
    untrained = create_model(resolve_shape("2L-64"), tmp_path / "untrained", tokenizer=vocab, task="sst2", max_positions=64, seed=3)
    seen, logger = _Seen(), logging.getLogger("compress.distill.task")
    logger.addHandler(seen)
    monkeypatch.setattr(logger, "level", logging.WARNING)
    started = []  # what had been logged when training began
    import compress.distill.steps as steps

    real_train = steps.train_phases
    monkeypatch.setattr(steps, "train_phases", lambda *a, **k: (started.append(list(seen.messages)), real_train(*a, **k))[1])
    try:
        out = distill(untrained, tmp_path / "s", _cfg(setting, epochs=1, max_train_examples=64))
    finally:
        logger.removeHandler(seen)
    assert len(started) == 1 and len(started[0]) == 1 and "at chance" in started[0][0]
    assert f"teacher {untrained} does not look fine-tuned for SST-2" in started[0][0]
    # the rule by hand: majority share of the dev labels, plus two standard errors over the dev set
    labels = [int(line.rsplit("\t", 1)[1]) for line in (data / "SST-2" / "dev.tsv").read_text().splitlines()[1:]]
    rate = max(labels.count(0), labels.count(1)) / len(labels)
    threshold = 100 * rate + max(2.0, 200 * math.sqrt(rate * (1 - rate) / len(labels)))
    check = read_compression(out)["teacher_check"]
    assert check["chance"]["threshold"] == pytest.approx(threshold)
    retention = next(r for r in read_metrics(out) if r["kind"] == "retention")
    assert retention["teacher"] <= threshold and retention["teacher_source"] == "measured"
    assert retention["teacher_at_chance"] is True and read_compression(out)["teacher_at_chance"] is True
    text, notes = D.summarize(out, _cfg(setting), {})
    lines = [line for line in text.splitlines() if line.startswith("retention:")]
    assert lines and all(line.endswith("TEACHER AT CHANCE: this ratio means nothing") for line in lines)
    assert f"{100 * retention['ratio']:.1f}% of the teacher's accuracy" in lines[0]
    assert notes == [f"warning: {retention['teacher_warning']}"]


def test_teacher_problems_read_from_its_files(tmp_path):
    from compress.core.data.tasks import get_task
    from compress.core.formats.folder import open_folder
    from compress.distill.task import teacher_problems
    from tests.conftest import make_tiny_model, make_tokenizer, save_tiny

    tok = make_tokenizer(tmp_path / "tok")
    sst2 = get_task("sst2")
    fine = save_tiny(make_tiny_model(), tok, tmp_path / "fine", extra={"task": "sst-2"})  # an alias of sst2
    assert teacher_problems(open_folder(fine), sst2) == []
    bare = save_tiny(make_tiny_model("base"), tok, tmp_path / "bare")
    assert teacher_problems(open_folder(bare), sst2) == ["it has no sequence-classification head (a base model), so its head is random"]
    (bare / "modules.json").write_text("[]")
    assert "(a sentence-transformers folder)" in teacher_problems(open_folder(bare), sst2)[0]
    wide = save_tiny(make_tiny_model(num_labels=3), tok, tmp_path / "wide")
    assert teacher_problems(open_folder(wide), sst2) == ["its classifier has 3 outputs, not 2, so a new random one is used"]
    other = save_tiny(make_tiny_model(), tok, tmp_path / "other", extra={"task": "qnli"})
    assert teacher_problems(open_folder(other), sst2) == ["its compression.json says it was made for qnli"]
    assert teacher_problems(open_folder(other), get_task("squad"))[0].startswith("it has no question-answering head")


# ---------------------------------------------------------------------------- general distillation


def _corpus(path):
    rows = synthetic.examples(240, seed=5)
    docs = ["\n".join(t for t, _ in rows[i : i + 6]) for i in range(0, 240, 6)]
    path.write_text("\n\n".join(docs) + "\n")
    return path


@pytest.mark.versions
@pytest.mark.e2e
def test_general_distillation_minilm_then_task(setting, tmp_path):
    from compress.distill.general import GeneralDistillConfig, distill_general

    _, data, teacher = setting
    corpus = _corpus(tmp_path / "corpus.txt")
    cfg = from_dict(GeneralDistillConfig, {"corpus": [str(corpus)], "student": "2L-32", "heads": 2, "relation_heads": 4, "init": "random",
                                           "max_length": 32, "max_steps": 30, "batch_size": 16, "eval_every": 10,
                                           "heldout_fraction": 0.2})
    general = distill_general(teacher, tmp_path / "general", cfg)
    model = load_model(general)
    assert type(model).__name__ == "BertModel" and model.config.hidden_size == 32
    history = next(r for r in read_metrics(general) if r["kind"] == "training")["history"]
    evals = [h["eval"]["heldout_loss"] for h in history if "eval" in h]
    assert evals[-1] < evals[0]  # the student's attention/value relations move towards the teacher's
    # and the general student is a starting point for task distillation
    out = distill(teacher, tmp_path / "task", _cfg(setting, init=str(general), epochs=1, student="3L-64"))
    record = read_compression(out)
    assert record["init"]["method"] == "pretrained"
    # the recorded shape is the general student's (2 layers, 2 heads), not the --student preset's
    assert record["student_shape"] == {"layers": 2, "hidden": 32, "heads": 2, "ffn": model.config.intermediate_size, "origin": ""}


def test_init_from_cuts_the_student_from_another_encoder(setting, tmp_path):
    from compress.distill.general import GeneralDistillConfig, distill_general

    _, _, teacher = setting
    cfg = from_dict(GeneralDistillConfig, {"corpus": [str(_corpus(tmp_path / "corpus.txt"))], "student": "2L-32", "heads": 2,
                                           "relation_heads": 4, "init": "random", "max_length": 32, "max_steps": 4, "batch_size": 16})
    general = distill_general(teacher, tmp_path / "general", cfg)
    # a 1-layer student from the general student's second layer; lr ~0 so the weights stay where they started
    out = distill(teacher, tmp_path / "cut", _cfg(setting, student="1L-32", heads=2, init="teacher-layers", init_layers=[1],
                                                 init_from=str(general), epochs=1, lr=1e-12))
    record = read_compression(out)
    assert record["init"]["method"] == "teacher-layers" and record["init"]["teacher_layers"] == [1]
    assert record["init"]["from"] == str(general)
    student, source = load_model(out), load_model(general)
    got = student.bert.encoder.layer[0].attention.self.query.weight
    assert torch.allclose(got, source.encoder.layer[1].attention.self.query.weight, atol=1e-6)
    assert not torch.allclose(got, load_model(teacher).bert.encoder.layer[1].attention.self.query.weight[:32, :32], atol=1e-3)
    assert student.config.id2label == {0: "negative", 1: "positive"}  # the teacher's task and labels, a new head
    with pytest.raises(CompressError, match=f"--init-from {general} stands in for the teacher here: a 1L-64 student cannot"):
        distill(teacher, tmp_path / "wide", _cfg(setting, student="1L-64", heads=2, init="teacher", init_from=str(general)))


def test_init_from_needs_a_teacher_method(setting, tmp_path):
    with pytest.raises(CompressError, match="--init-from cuts the student from another encoder: use it with --init teacher"):
        distill(setting[2], tmp_path / "x", _cfg(setting, init="random", init_from=str(tmp_path)))


def test_general_distillation_distilbert_style_needs_mlm_heads(setting, tmp_path):
    from compress.distill.general import GeneralDistillConfig, distill_general
    from tests.conftest import make_tiny_model, make_tokenizer, save_tiny

    _, _, teacher = setting
    corpus = _corpus(tmp_path / "corpus.txt")
    options = {"corpus": [str(corpus)], "student": "1L-32", "heads": 4, "init": "random", "losses": ["kd", "mlm", "cosine"],
               "max_length": 32, "max_steps": 6, "batch_size": 8}
    with pytest.raises(CompressError, match="need a teacher with a masked-LM head"):
        distill_general(teacher, tmp_path / "x", from_dict(GeneralDistillConfig, options))
    tok = make_tokenizer(tmp_path / "tok")
    mlm_teacher = save_tiny(make_tiny_model(head="masked-lm"), tok, tmp_path / "mlm")
    out = distill_general(mlm_teacher, tmp_path / "distilbert", from_dict(GeneralDistillConfig, options))
    assert type(load_model(out)).__name__ == "BertForMaskedLM"
    logged = [h for h in next(r for r in read_metrics(out) if r["kind"] == "training")["history"] if "loss" in h]
    assert {"loss_kd", "loss_hard", "loss_cosine"} <= set(logged[-1])


# ---------------------------------------------------------------------------- augmented and transfer rows


def _step(kind, logits, labels, gold):
    import torch
    from torch import nn

    from compress.distill.terms import LossWeights, Outputs, Step

    batch = {"labels": labels, "gold": torch.tensor(gold), "input_ids": torch.zeros(len(gold), 3, dtype=torch.long)}
    return Step(kind, Outputs(logits={"logits": logits}), Outputs(), batch, torch.ones(len(gold), 3), [], nn.ModuleDict(),
                LossWeights())


def test_hard_term_reads_only_rows_with_a_gold_label():
    import torch

    from compress.core.data.tasks import get_task
    from compress.distill.terms import TERMS

    hard = TERMS.get("hard").compute
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [5.0, -5.0], [1.0, 1.0]], requires_grad=True)
    # Rows 2 and 3 are augmented: whatever their labels say, the loss is the mean CE of rows 0 and 1.
    expected = (math.log(1 + math.exp(-2.0)) + math.log(1 + math.exp(-1.0))) / 2
    for junk in ([1, 0], [0, 1], [-100, -100]):
        step = _step(get_task("sst2").behaviour, logits, torch.tensor([0, 1, *junk]), [True, True, False, False])
        assert float(hard(step).detach()) == pytest.approx(expected, rel=1e-6)
    none = hard(_step(get_task("sst2").behaviour, logits, torch.tensor([1, 1, 1, 1]), [False] * 4))
    none.backward()  # no gold row: zero, and still part of the graph
    assert float(none) == 0.0 and logits.grad is not None and float(logits.grad.abs().sum()) == 0.0

    scores = torch.tensor([[1.0], [3.0], [0.5]])
    step = _step(get_task("stsb").behaviour, scores, torch.tensor([2.0, float("nan"), 0.0]), [True, False, True])
    assert float(hard(step)) == pytest.approx(((1.0 - 2.0) ** 2 + 0.5**2) / 2)  # the NaN row never reaches the MSE


@pytest.mark.e2e
def test_augmented_rows_are_teacher_targets_only_and_cached(setting, tmp_path):
    root, _, teacher = setting
    cache = tmp_path / "cache"
    cfg = _cfg(setting, epochs=1, augment=2, augment_candidates=4, max_train_examples=300, cache_dir=str(cache))
    first = distill(teacher, tmp_path / "a", cfg)
    record = read_compression(first)["extra_data"]["augment"]
    assert record["rows"] == 600 and record["method"] == "embedding-neighbours" and record["hit"] is False
    training = next(r for r in read_metrics(first) if r["kind"] == "training")
    assert training["n_train"] == 300 and training["extra_rows"] == 600
    rows = [json.loads(line) for line in open(record["path"], encoding="utf-8")][1:]
    assert len(rows) == 600 and all(set(r) == {"sentence", "source"} for r in rows)  # texts, no label
    second = distill(teacher, tmp_path / "b", cfg)  # the same recipe: neither the augmentation nor the teacher runs again
    assert read_compression(second)["extra_data"]["augment"]["hit"] is True
    assert next(r for r in read_metrics(second) if r["kind"] == "training")["cache"][0]["hit"] is True


@pytest.mark.e2e
def test_small_training_sets_are_augmented_by_default(setting, tmp_path, monkeypatch):
    monkeypatch.setattr("compress.distill.config.AUTO_MAX_EXAMPLES", 10_000)  # the shipped default (tests set it to 0)
    _, _, teacher = setting
    cache = str(tmp_path / "cache")
    out = distill(teacher, tmp_path / "s", _cfg(setting, epochs=1, max_train_examples=40, cache_dir=cache))
    record = read_compression(out)["extra_data"]["augment"]
    assert (record["copies"], record["default"], record["rows"]) == (4, True, 160)
    assert next(r for r in read_metrics(out) if r["kind"] == "training")["extra_rows"] == 160
    off = distill(teacher, tmp_path / "off", _cfg(setting, epochs=1, max_train_examples=40, augment=0, cache_dir=cache))
    assert "augment" not in (read_compression(off).get("extra_data") or {})
    hard_only = distill(teacher, tmp_path / "h", _cfg(setting, epochs=1, max_train_examples=40, losses=["hard"], cache_dir=cache))
    assert "augment" not in (read_compression(hard_only).get("extra_data") or {})  # no teacher targets to label copies
    monkeypatch.setattr("compress.distill.config.AUTO_MAX_EXAMPLES", 39)  # a set larger than the limit is left alone
    big = distill(teacher, tmp_path / "big", _cfg(setting, epochs=1, max_train_examples=40, cache_dir=cache))
    assert "augment" not in (read_compression(big).get("extra_data") or {})


def test_transfer_text_adds_corpus_sentences_scored_by_the_teacher(setting, tmp_path):
    _, _, teacher = setting
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the film was good . the plot was bad .\n\nthe actor was great . it was dull .\n", encoding="utf-8")
    out = distill(teacher, tmp_path / "s", _cfg(setting, epochs=1, max_train_examples=100, transfer_text=[str(corpus)]))
    assert read_compression(out)["extra_data"]["transfer"] == {"sources": [str(corpus)], "rows": 4}
    assert next(r for r in read_metrics(out) if r["kind"] == "training")["extra_rows"] == 4


def test_augmentation_refusals(setting, tmp_path):
    root, data, teacher = setting
    with pytest.raises(CompressError, match="no gold labels"):
        _cfg(setting, augment=2, losses=["hard"]).validate()
    with pytest.raises(CompressError, match="spans"):
        from_dict(DistillConfig, {"task": "squad", "augment": 2}).validate()
    with pytest.raises(CompressError, match="no masked-LM head"):
        distill(teacher, tmp_path / "x", _cfg(setting, epochs=1, augment=1, augment_mlm=str(teacher)))
    other_vocab = tmp_path / "vocab.txt"
    other_vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b"]) + "\n", encoding="utf-8")
    mlm = create_model(resolve_shape("1L-64"), tmp_path / "mlm", tokenizer=other_vocab, head="masked-lm")
    with pytest.raises(CompressError, match="another vocabulary"):
        distill(teacher, tmp_path / "y", _cfg(setting, epochs=1, augment=1, augment_mlm=str(mlm)))
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_masked_lm_of_the_teachers_vocabulary_proposes_the_candidates(setting, tmp_path):
    root, _, teacher = setting
    mlm = create_model(resolve_shape("1L-64"), tmp_path / "mlm", tokenizer=root / "vocab.txt", head="masked-lm", seed=1)
    out = distill(teacher, tmp_path / "s", _cfg(setting, epochs=1, augment=1, max_train_examples=50, augment_mlm=str(mlm),
                                                  cache_dir=str(tmp_path / "cache")))
    record = read_compression(out)["extra_data"]["augment"]
    assert record["method"] == "masked-lm" and record["candidate_model"] == str(mlm.resolve()) and record["rows"] == 50


def test_transfer_text_from_a_datasets_folder_and_from_another_task(setting, tmp_path):
    import datasets

    _, data, teacher = setting
    folder = tmp_path / "corpus-ds"
    datasets.Dataset.from_dict({"text": ["the film was good . it was long .", "the plot was thin ."]}).save_to_disk(str(folder))
    out = distill(teacher, tmp_path / "a", _cfg(setting, epochs=1, max_train_examples=50, transfer_text=[str(folder)]))
    assert read_compression(out)["extra_data"]["transfer"]["rows"] == 3  # three distinct sentences
    # Another task's training texts (here the same generated task's, read as task:sst2 from --data-dir).
    out = distill(teacher, tmp_path / "b", _cfg(setting, epochs=1, max_train_examples=50, transfer_text=["task:sst2"],
                                                 transfer_examples=40))
    assert read_compression(out)["extra_data"]["transfer"]["rows"] == 40
    with pytest.raises(CompressError, match="only GLUE tasks"):
        distill(teacher, tmp_path / "c", _cfg(setting, epochs=1, transfer_text=["task:squad"]))


def test_default_init_cuts_a_narrower_student_from_the_teacher(setting, tmp_path):
    _, _, teacher = setting
    cfg = _cfg(setting, heads=1, epochs=1)
    default = StudentShape.__dataclass_fields__["init"].default
    cfg = replace(cfg, shape=replace(cfg.shape, init=default))  # the default, whatever _cfg says
    out = distill(teacher, tmp_path / "s", cfg)
    init = read_compression(out)["init"]
    assert init["method"] == "teacher-slices" and init["teacher_layers"] == [0, 1]
    assert load_config(out).hidden_size == 32
