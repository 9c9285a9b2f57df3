"""Distillation across families and tokenizers: an MPNet teacher and a BERT student, and the reverse.

The two test tokenizers share no id for the same word (MPNet's specials first, its words in reverse order) and split
some words differently (MPNet's vocabulary spells "movie", "paris", "france" and "dog" in letter pieces), so a
student fed the teacher's ids, or targets taken at the wrong positions, is caught. Models are tiny and random: what is
checked is where every number comes from, not that the student learns. The tests that train are marked e2e.
"""

from __future__ import annotations

import string
from types import SimpleNamespace

import pytest
import torch
import transformers

from compress.core.config import from_dict
from compress.core.data import synthetic
from compress.core.data.resolve import resolve_task
from compress.core.data.sources import load_train_split
from compress.core.data.tasks import get_task
from compress.core.data.token_data import first_pieces
from compress.core.errors import CompressError
from compress.core.formats.folder import open_folder
from compress.core.formats.records import read_compression, read_metrics
from compress.core.formats.runtime import load_model
from compress.core.model.families import get_family
from compress.distill import steps, task as task_stage
from compress.distill.cross_tokenizer import pad_positions, same_tokenisation, word_positions
from compress.distill.task import DistillConfig, distill
from tests.conftest import save_tiny, tiny_config
from tests.own_data import ANIMALS, FILLER, PLACES, ner_sentences, regression_rows, write_conll, write_csv

WORDS = list(dict.fromkeys(synthetic.vocabulary()[5:] + list(FILLER) + ANIMALS + PLACES))
PIECES = list(string.ascii_lowercase) + [f"##{c}" for c in string.ascii_lowercase]
SPLIT = ("movie", "paris", "france", "dog")  # whole words for BERT, letter pieces for MPNet
BERT_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, *PIECES]
MPNET_TOKENS = ["<s>", "<pad>", "</s>", "[UNK]", "<mask>", *[w for w in reversed(WORDS) if w not in SPLIT], *PIECES]


def bert_tokenizer(directory):
    from compress.core.compat import wordpiece_tokenizer

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.txt").write_text("\n".join(BERT_TOKENS) + "\n", encoding="utf-8")
    return wordpiece_tokenizer(directory / "vocab.txt", do_lower_case=True, model_max_length=64)


def mpnet_tokenizer(directory):
    """MPNet's specials (<pad> = 1) over the test words; on transformers 4.x read from a vocab.txt, on 5.x a dict."""
    from compress.core.compat import TRANSFORMERS_MAJOR

    directory.mkdir(parents=True, exist_ok=True)
    if TRANSFORMERS_MAJOR < 5:
        (directory / "vocab.txt").write_text("\n".join(MPNET_TOKENS) + "\n", encoding="utf-8")
        return transformers.MPNetTokenizerFast(vocab_file=str(directory / "vocab.txt"), model_max_length=64)
    return transformers.MPNetTokenizer(vocab={t: i for i, t in enumerate(MPNET_TOKENS)}, model_max_length=64)


def tiny(family: str, head: str, seed: int, **labels):
    """A tiny random model of ``family`` (2 layers, hidden 32, no dropout) over its test vocabulary."""
    torch.manual_seed(seed)
    if family == "bert":
        config = tiny_config(vocab_size=len(BERT_TOKENS), **labels)
    else:  # positions counted from the padding id 1, as released
        config = transformers.MPNetConfig(
            vocab_size=len(MPNET_TOKENS), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, max_position_embeddings=66, layer_norm_eps=1e-5,
            relative_attention_num_buckets=32, pad_token_id=1, **labels)
    return getattr(transformers, get_family(config.model_type).head_class(head))(config).eval()


TOKENIZERS = {"bert": bert_tokenizer, "mpnet": mpnet_tokenizer}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """Tokenizers, the generated SST-2 and NER files, sst2 teachers and bare pretrained students of both families."""
    root = tmp_path_factory.mktemp("cross")
    tok = {name: make(root / f"tok-{name}") for name, make in TOKENIZERS.items()}
    data = synthetic.write_sst2_layout(root / "sst2", n_train=48, n_dev=16, n_test=4)
    ner = {split: write_conll(root / "ner" / f"{split}.conll", ner_sentences(n, seed))
           for split, n, seed in (("train", 48, 0), ("dev", 16, 1))}
    teachers = {name: save_tiny(tiny(name, "sequence-classification", 1), tok[name], root / f"{name}-sst2",
                                extra={"task": "sst2"}) for name in TOKENIZERS}
    students = {name: save_tiny(tiny(name, "base", 2), tok[name], root / f"{name}-base") for name in TOKENIZERS}
    return {"root": root, "tok": tok, "sst2": data, "ner": ner, "teachers": teachers, "students": students}


def cfg(env, **options) -> DistillConfig:
    base = {"task": "sst2", "epochs": 1, "batch_size": 16, "log_every": 1, "lr": 1e-3, "seed": 3, "max_length": 32,
            "cache_dir": str(env["root"] / "cache")}
    data = {} if "train_file" in options else {"data_dir": str(env["sst2"])}  # the generated SST-2, or the files given
    return from_dict(DistillConfig, {**base, **data, **options})


@pytest.fixture
def seen(monkeypatch):
    """Every loss step's record (the student's batch, the teacher's outputs met with it, the mask), and the tokenizers
    each dev evaluator was made with."""
    record = {"steps": [], "evaluators": []}

    class Recorded(steps.Step):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            record["steps"].append(self)

    def evaluator(task, tokenizer, *args, **kwargs):
        record["evaluators"].append(tokenizer)
        return dev_evaluator(task, tokenizer, *args, **kwargs)

    dev_evaluator = task_stage.dev_evaluator
    monkeypatch.setattr(steps, "Step", Recorded)
    monkeypatch.setattr(task_stage, "dev_evaluator", evaluator)
    return record


def training(out) -> dict:
    return next(r for r in read_metrics(out) if r["kind"] == "training")


def first_loss(out) -> dict:
    return next(h for h in training(out)["history"] if "loss" in h)


def rows_of(step) -> list[list[int]]:
    """The student batch's token ids, row by row, without padding."""
    return [ids[mask.bool()].tolist() for ids, mask in zip(step.batch["input_ids"], step.batch["attention_mask"])]


def test_tokenisations_are_compared_by_ids_not_class_names(env, tmp_path):
    bert, mpnet = env["tok"]["bert"], env["tok"]["mpnet"]
    assert not same_tokenisation(bert, mpnet)
    assert same_tokenisation(bert, bert_tokenizer(tmp_path / "again"))  # another object, the same ids
    other = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *reversed(WORDS), *PIECES]  # same class, other ids
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "vocab.txt").write_text("\n".join(other) + "\n", encoding="utf-8")
    from compress.core.compat import wordpiece_tokenizer

    assert not same_tokenisation(bert, wordpiece_tokenizer(tmp_path / "other" / "vocab.txt", do_lower_case=True))
    # a student folder whose tokenizer tokenises as the teacher's reads the teacher's, the very object: a run unchanged
    teacher = SimpleNamespace(tokenizer=bert_tokenizer(tmp_path / "teacher"))
    assert steps.student_tokenizer(teacher, cfg(env, init=str(env["students"]["bert"]))) is teacher.tokenizer
    assert steps.student_tokenizer(teacher, cfg(env, init="random")) is teacher.tokenizer
    assert steps.student_tokenizer(teacher, cfg(env, init=str(env["students"]["mpnet"]))).get_vocab() == mpnet.get_vocab()
    # per student position: the teacher's position of the same word's first piece; -1 off first pieces
    assert word_positions([None, 0, 1, 1, 2, None], [None, 0, 0, 1, 2, 2, None]) == [-1, 1, 3, -1, 4, -1]
    assert pad_positions([[-1, 1], [-1]], 3).tolist() == [[-1, 1, -1], [-1, -1, -1]]  # padded as the ids are
    assert pad_positions([[-1, 1]], 3, "left").tolist() == [[-1, -1, 1]]


@pytest.mark.e2e
@pytest.mark.parametrize("teacher, student", [("mpnet", "bert"), ("bert", "mpnet")])
def test_a_student_with_its_own_tokenizer_learns_from_the_teachers_logits_per_example(env, seen, tmp_path, teacher, student):
    out = distill(env["teachers"][teacher], tmp_path / "student", cfg(env, init=str(env["students"][student])))
    own, theirs = env["tok"][student], env["tok"][teacher]
    # saved with its own tokenizer, evaluated with it (the teacher's dev score with the teacher's)
    assert open_folder(out).tokenizer.get_vocab() == own.get_vocab() != theirs.get_vocab()
    assert [t.get_vocab() for t in seen["evaluators"]] == [theirs.get_vocab(), own.get_vocab()]
    assert type(open_folder(out).config).__name__.lower().startswith(student)
    assert read_compression(out)["tokenizer"].startswith("the student's own")
    texts = list(load_train_split(get_task("sst2"), cfg(env).data)["sentence"])
    check_targets_per_example(seen["steps"][0], texts, own, theirs, load_model(env["teachers"][teacher]))


def check_targets_per_example(step, texts: list[str], own, theirs, teacher_model) -> None:
    """The student's batch is its own tokenisation of ``texts``; the kd targets of its first rows are the teacher's
    outputs on the teacher's own tokenisation, computed here one text at a time."""
    by_ids = {tuple(own(t)["input_ids"]): t for t in texts}
    for row, ids in enumerate(rows_of(step)[:3]):
        text = by_ids[tuple(ids)]  # a KeyError: not the student's own tokenisation
        with torch.no_grad():
            expected = teacher_model(**dict(theirs(text, return_tensors="pt"))).logits[0]
        torch.testing.assert_close(step.teacher.logits["logits"][row], expected, rtol=1e-4, atol=1e-5)


@pytest.mark.e2e
def test_scores_meet_per_example(env, seen, tmp_path):
    """A regression task (STS-B's kind): the kd term is the MSE between the student's score and the teacher's, each
    on its own tokens."""
    files = {split: write_csv(tmp_path / f"{split}.csv", regression_rows(n, seed), ["text", "score"])
             for split, n, seed in (("train", 32, 0), ("dev", 8, 1))}
    model = tiny("mpnet", "sequence-classification", 6, num_labels=1, problem_type="regression")
    teacher = save_tiny(model, env["tok"]["mpnet"], tmp_path / "teacher")
    options = {"task": "regression", "train_file": str(files["train"]), "dev_file": str(files["dev"]),
               "label_column": "score", "init": str(env["students"]["bert"])}
    out = distill(teacher, tmp_path / "student", cfg(env, **options, losses=["kd"]))
    assert open_folder(out).tokenizer.get_vocab() == env["tok"]["bert"].get_vocab()
    step = seen["steps"][0]
    check_targets_per_example(step, [r["text"] for r in regression_rows(32, 0)], env["tok"]["bert"], env["tok"]["mpnet"], model)
    kd = torch.nn.functional.mse_loss(step.student.logits["logits"], step.teacher.logits["logits"])
    assert first_loss(out)["loss_kd"] == pytest.approx(float(kd.detach()), rel=1e-5)


@pytest.mark.e2e
def test_the_teacher_cache_is_keyed_on_the_teachers_tokens_and_shared_by_any_student(env, tmp_path):
    teacher = env["teachers"]["mpnet"]
    cache = str(tmp_path / "cache")
    same = distill(teacher, tmp_path / "same", cfg(env, cache_dir=cache, student="1L-32", heads=4, init="random"))
    apart = distill(teacher, tmp_path / "apart", cfg(env, cache_dir=cache, init=str(env["students"]["bert"])))
    online = distill(teacher, tmp_path / "online", cfg(env, cache=False, init=str(env["students"]["bert"])))
    first, second = training(same)["cache"][0], training(apart)["cache"][0]
    assert first["hit"] is False and second["hit"] is True and second["path"] == first["path"]
    assert training(online)["cache"] == []
    cached, uncached = first_loss(apart), first_loss(online)
    assert cached["step"] == uncached["step"] == 1
    assert cached["loss"] == pytest.approx(uncached["loss"], rel=1e-5)
    assert cached["loss_kd"] == pytest.approx(uncached["loss_kd"], rel=1e-5)


@pytest.mark.e2e
def test_tags_meet_per_word_at_each_tokenizers_first_piece(env, seen, tmp_path):
    options = {"task": "token-classification", "train_file": str(env["ner"]["train"]), "dev_file": str(env["ner"]["dev"])}
    probe = cfg(env, **options)
    task = resolve_task(probe.task, probe.data.own, train_file=probe.data.train_file)
    labels = {"num_labels": len(task.label_names), "id2label": dict(task.id2label),
              "label2id": {n: i for i, n in task.id2label.items()}}
    teacher_model = tiny("bert", "token-classification", 4, **labels)
    teacher = save_tiny(teacher_model, env["tok"]["bert"], tmp_path / "ner-teacher")
    mpnet, bert = env["tok"]["mpnet"], env["tok"]["bert"]
    student = str(env["students"]["mpnet"])
    cache = str(tmp_path / "cache")
    out = distill(teacher, tmp_path / "cached", cfg(env, **options, init=student, cache_dir=cache), task=task)
    online = distill(teacher, tmp_path / "online", cfg(env, **options, init=student, cache=False), task=task)
    assert open_folder(out).tokenizer.get_vocab() == mpnet.get_vocab()
    assert first_loss(out)["loss_kd"] == pytest.approx(first_loss(online)["loss_kd"], rel=1e-5)

    sentences = [words for words, _ in ner_sentences(48, 0)]
    by_ids = {tuple(mpnet(w, is_split_into_words=True)["input_ids"]): w for w in sentences}
    split_rows = 0
    for step in (seen["steps"][0], seen["steps"][len(seen["steps"]) // 2]):  # the first steps of the cached and online runs
        for row, ids in enumerate(rows_of(step)):
            words = by_ids[tuple(ids)]
            own, theirs = mpnet(words, is_split_into_words=True), bert(words, is_split_into_words=True, return_tensors="pt")
            with torch.no_grad():
                expected = teacher_model(**dict(theirs)).logits[0]  # (teacher pieces, tags)
            student_first, teacher_first = first_pieces(own.word_ids()), first_pieces(theirs.word_ids())
            mask = step.mask[row]
            assert mask.nonzero().flatten().tolist() == sorted(student_first.values())  # the words' first pieces only
            for word, at in student_first.items():
                torch.testing.assert_close(step.teacher.logits["logits"][row, at], expected[teacher_first[word]],
                                           rtol=1e-4, atol=1e-5)
            split_rows += any(w in SPLIT for w in words)
    assert split_rows  # some rows split words otherwise in the two tokenizers


def test_terms_that_cannot_meet_are_refused_in_one_line_before_the_student_is_built(env, tmp_path, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("the student was built before the refusal")

    monkeypatch.setattr(task_stage, "build_student", never)
    student = str(env["students"]["bert"])
    for losses, term in ((["kd", "hidden"], "hidden"), (["kd", "attention", "minilm"], "attention,minilm")):
        with pytest.raises(CompressError) as err:
            distill(env["teachers"]["mpnet"], tmp_path / "x", cfg(env, init=student, losses=losses))
        assert str(err.value).startswith(f"--losses {term}: the student has a tokenizer of its own") and "\n" not in str(err.value)
    assert not (tmp_path / "x").exists()


@pytest.mark.e2e
def test_squad_trains_on_hard_labels_alone_across_tokenizers(env, tmp_path):
    train = synthetic.write_squad(tmp_path / "train-v1.1.json", 24, seed=1)
    dev = synthetic.write_squad(tmp_path / "dev-v1.1.json", 8, seed=2)
    teacher = save_tiny(tiny("mpnet", "question-answering", 5), env["tok"]["mpnet"], tmp_path / "qa",
                        extra={"task": "squad"})
    out = distill(teacher, tmp_path / "student", cfg(env, task="squad", init=str(env["students"]["bert"]), losses=["hard"],
                                                     train_file=str(train), dev_file=str(dev), doc_stride=16))
    assert open_folder(out).tokenizer.get_vocab() == env["tok"]["bert"].get_vocab()
    assert type(open_folder(out).config).__name__ == "BertConfig" and training(out)["cache"] == []


def test_general_distillation_refuses_a_student_with_its_own_tokenizer(env, tmp_path):
    from compress.distill.general import GeneralDistillConfig, distill_general

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the movie is good .\nthe plot is dull .\n\n" * 4, encoding="utf-8")
    options = {"corpus": [str(corpus)], "init": str(env["students"]["bert"]), "max_steps": 1}
    with pytest.raises(CompressError, match="has a tokenizer of its own, not the teacher's") as err:
        distill_general(env["teachers"]["mpnet"], tmp_path / "g", from_dict(GeneralDistillConfig, options))
    assert "\n" not in str(err.value)


def test_distill_help_says_which_terms_a_student_with_its_own_tokenizer_takes(capsys):
    from compress.cli import main

    with pytest.raises(SystemExit):
        main(["distill", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "A student with a tokenizer of its own (--init DIR" in text and "takes kd (met per example, per word for tags) and hard only" in text
