"""Layer maps and student initialisation on tiny BERTs."""

from __future__ import annotations

import copy
import re

import pytest
import torch

from compress.core.model import structure as st
from compress.core.errors import CompressError
from compress.core.model.shapes import Shape
from compress.students.init import init_from_teacher, init_random, init_student
from compress.students.layer_map import every_kth, explicit_map, last_map, parse_layer_map, parse_layers, uniform_map
from tests.conftest import VOCAB, make_tiny_model

# Depends on the installed transformers version: the transformers 4.57 set runs it too (make test-transformers4).
pytestmark = pytest.mark.versions

LABELS = {0: "neg", 1: "neu", 2: "pos"}
STUDENT = Shape(2, 32, 4, 37)  # tiny_config's width, heads and FFN; half the teacher's depth


@pytest.fixture(scope="module")
def teacher():
    """A 4-layer, 3-label tiny classifier."""
    return make_tiny_model(
        seed=3, num_hidden_layers=4, num_labels=3, id2label=LABELS, label2id={v: k for k, v in LABELS.items()}
    )


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, len(VOCAB), (2, 7), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


# ---------------------------------------------------------------------------- layer maps


def test_uniform_and_last_maps():
    assert uniform_map(3, 6) == [(0, 0), (1, 2), (2, 4), (3, 6)]
    assert uniform_map(3, 6, embeddings=False) == [(1, 2), (2, 4), (3, 6)]
    assert uniform_map(4, 6) == [(0, 0), (1, 1), (2, 3), (3, 4), (4, 6)]  # floor of m*6/4
    assert last_map(2, 6) == [(0, 0), (1, 5), (2, 6)]
    assert explicit_map([2, 4, 6]) == [(0, 0), (1, 2), (2, 4), (3, 6)]


def test_parse_layer_map_forms():
    assert parse_layer_map("uniform", 3, 6) == uniform_map(3, 6)
    assert parse_layer_map(" Last ", 2, 6, embeddings=False) == [(1, 5), (2, 6)]
    assert parse_layer_map("2,4,6", 3, 6) == [(0, 0), (1, 2), (2, 4), (3, 6)]
    assert parse_layer_map("1:2,2:4,3:6", 3, 6) == [(1, 2), (2, 4), (3, 6)]
    assert parse_layer_map("0:0,3:6", 3, 6) == [(0, 0), (3, 6)]


@pytest.mark.parametrize(
    "spec, message",
    [
        ("middle", "valid: uniform, last"),
        ("", "valid: uniform, last"),
        ("2,4", "give exactly 3, each from 1 to 6"),
        ("2,4,7", "out of range; valid: 0 (embeddings) to 6"),
        ("0,2,4", "teacher layers are 1 to 6"),
        ("4:2", "student index 4 is out of range; valid: 0 (embeddings) to 3"),
        ("1:2,1:3", "student index twice"),
        ("1-2", "comma-separated integers"),
        ("1:x", "STUDENT:TEACHER pairs"),
    ],
)
def test_parse_layer_map_errors(spec, message):
    with pytest.raises(CompressError, match=re.escape(message)):
        parse_layer_map(spec, 3, 6)


def test_student_deeper_than_teacher_is_refused():
    with pytest.raises(CompressError, match="more layers"):
        uniform_map(7, 6)


@pytest.mark.parametrize(
    "n_teacher, n_student, expected",
    [
        (6, 3, [1, 3, 5]),
        (12, 6, [1, 3, 5, 7, 9, 11]),
        (4, 2, [1, 3]),
        (6, 6, [0, 1, 2, 3, 4, 5]),
        (6, 1, [5]),
        (6, 4, [1, 2, 4, 5]),  # 1.5 and 4.5 round up
    ],
)
def test_every_kth(n_teacher, n_student, expected):
    assert every_kth(n_teacher, n_student) == expected


def test_parse_layers():
    assert parse_layers("0,2,4,7,9,11") == [0, 2, 4, 7, 9, 11]
    assert parse_layers(" 1, 3 ") == [1, 3]
    with pytest.raises(CompressError, match="comma-separated"):
        parse_layers("0;2")
    with pytest.raises(CompressError, match="empty"):
        parse_layers(" , ")


# ---------------------------------------------------------------------------- from teacher layers


@pytest.mark.parametrize("layers, expected", [(None, [1, 3]), ([0, 2], [0, 2])])
def test_init_from_teacher_copies_exactly_the_chosen_layers(teacher, layers, expected):
    student, used = init_from_teacher(teacher, STUDENT, layers)
    assert used == expected
    assert len(st.encoder_layers(student)) == 2
    for j, i in enumerate(expected):
        assert_same_weights(st.encoder_layers(student)[j], st.encoder_layers(teacher)[i])
    assert_same_weights(st.embeddings(student), st.embeddings(teacher))
    assert_same_weights(st.pooler(student), st.pooler(teacher))
    assert_same_weights(st.task_head(student), st.task_head(teacher))
    assert type(student) is type(teacher)
    assert student.config.id2label == LABELS and student.config.num_labels == 3
    assert student.config.vocab_size == teacher.config.vocab_size


def test_student_equals_teacher_with_the_other_layers_dropped(teacher):
    student, _ = init_from_teacher(teacher, STUDENT, [0, 2])
    cut = copy.deepcopy(teacher)
    st.drop_layers(cut, [0, 2])
    with torch.no_grad():
        assert torch.allclose(student(**batch()).logits, cut(**batch()).logits, atol=1e-6)
        assert not torch.allclose(student(**batch()).logits, teacher(**batch()).logits, atol=1e-4)


@pytest.mark.parametrize("head", ["question-answering", "masked-lm", "base"])
def test_init_from_teacher_other_heads(head):
    teacher = make_tiny_model(head, num_hidden_layers=4)
    student, _ = init_from_teacher(teacher, STUDENT)
    assert type(student) is type(teacher)
    if head != "base":
        assert_same_weights(st.task_head(student), st.task_head(teacher))
    with torch.no_grad():
        student(**batch())


@pytest.mark.parametrize(
    "shape, message",
    [
        (Shape(2, 16, 4, 37), "hidden size 16 vs teacher 32"),
        (Shape(2, 32, 2, 37), "heads 2 vs teacher 4"),
        (Shape(2, 32, 4, 64), "FFN width 64 vs teacher 37"),
    ],
)
def test_init_from_teacher_refuses_other_shapes(teacher, shape, message):
    with pytest.raises(CompressError, match=message) as err:
        init_from_teacher(teacher, shape)
    assert "--init random" in str(err.value) and "pretrained" in str(err.value)


def test_init_from_teacher_refuses_pruned_heads():
    pruned = make_tiny_model(num_hidden_layers=4)
    st.prune_heads(pruned, {1: [0]})
    with pytest.raises(CompressError, match="pruned heads"):
        init_from_teacher(pruned, STUDENT)


@pytest.mark.parametrize(
    "layers, message",
    [([1], "give exactly 2"), ([1, 4], "valid: 0 to 3"), ([3, 1], "strictly increasing"), ([2, 2], "strictly increasing")],
)
def test_init_from_teacher_checks_layers(teacher, layers, message):
    with pytest.raises(CompressError, match=message):
        init_from_teacher(teacher, STUDENT, layers)


# ---------------------------------------------------------------------------- random


def expected_classifier_parameters(vocab, positions, types, *, hidden, ffn, layers, labels):
    embeddings = (vocab + positions + types) * hidden + 2 * hidden  # three tables + LayerNorm
    attention = 4 * (hidden * hidden + hidden) + 2 * hidden  # Q, K, V, output + LayerNorm
    feed_forward = (hidden * ffn + ffn) + (ffn * hidden + hidden) + 2 * hidden  # two Linears + LayerNorm
    pooler = hidden * hidden + hidden
    classifier = hidden * labels + labels
    return embeddings + layers * (attention + feed_forward) + pooler + classifier


def test_init_random_has_teacher_labels_and_student_shape(teacher):
    shape = Shape(3, 16, 2, 24)
    student = init_random(teacher, shape, seed=5)
    assert student.config.id2label == LABELS and student.config.num_labels == 3
    info = st.describe(student)
    assert (info["num_layers"], info["hidden_size"], info["heads"], info["ffn"]) == (3, 16, [2, 2, 2], [24, 24, 24])
    expected = expected_classifier_parameters(len(VOCAB), 64, 2, hidden=16, ffn=24, layers=3, labels=3)
    assert sum(p.numel() for p in student.parameters()) == expected
    with torch.no_grad():
        s_logits, t_logits = student(**batch()).logits, teacher(**batch()).logits
    assert s_logits.shape == t_logits.shape == (2, 3)
    assert not torch.allclose(s_logits, t_logits, atol=1e-3)


def test_init_random_is_seeded_and_leaves_global_rng_alone(teacher):
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = init_random(teacher, STUDENT, seed=7)
    after = torch.rand(1)
    assert torch.equal(before, after)
    b = init_random(teacher, STUDENT, seed=7)
    assert_same_weights(a, b)


# ---------------------------------------------------------------------------- dispatch


def test_init_student_methods(teacher, tiny_model_dir):
    model, info = init_student(teacher, STUDENT)
    assert info == {"method": "teacher-layers", "teacher_layers": [1, 3]}
    model, info = init_student(teacher, STUDENT, method="random", seed=1)
    assert info["method"] == "random" and info["teacher_layers"] is None
    # The pretrained directory is a 2-layer, 2-label classifier: its shape wins, the labels are the teacher's.
    model, info = init_student(teacher, None, method="pretrained", pretrained=tiny_model_dir)
    assert info["method"] == "pretrained" and len(st.encoder_layers(model)) == 2
    assert model.config.id2label == LABELS
    assert any(name.startswith("classifier.") for name in info["new_weights"])


def test_pretrained_students_new_head_follows_the_seed(teacher, tiny_model_dir):
    # the head the directory lacks is drawn from the seed, not from whatever the global generator holds
    def head(seed):
        torch.manual_seed(1000 + seed)  # a different global state each time: it must not matter
        model, _ = init_student(teacher, None, method="pretrained", pretrained=tiny_model_dir, seed=seed)
        return {k: v for k, v in model.state_dict().items() if k.startswith("classifier.")}

    torch.manual_seed(5)
    before = torch.rand(1)
    torch.manual_seed(5)
    a, b, c = head(3), head(3), head(4)
    assert a and all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["classifier.weight"], c["classifier.weight"])
    torch.manual_seed(5)
    init_student(teacher, None, method="pretrained", pretrained=tiny_model_dir, seed=3)
    assert torch.equal(torch.rand(1), before)  # the caller's generator is left as it was


def test_init_student_errors(teacher):
    with pytest.raises(CompressError, match="valid: pretrained, random, teacher, teacher-layers, teacher-slices"):
        init_student(teacher, STUDENT, method="copy")
    with pytest.raises(CompressError, match="only to --init teacher-layers"):
        init_student(teacher, STUDENT, method="random", layers=[0, 1])
    with pytest.raises(CompressError, match="model directory"):
        init_student(teacher, STUDENT, method="pretrained")


def test_explicit_shape_flags_override_the_preset():
    from compress.core.model.shapes import resolve_shape

    def dims(s):
        return (s.layers, s.hidden, s.heads, s.ffn)

    assert dims(resolve_shape("4L-312", layers=6)) == (6, 312, 12, 1200)  # the rest of TinyBERT's shape kept
    assert dims(resolve_shape("4L-312", ffn=600)) == (4, 312, 12, 600)
    # a new width: FFN 4x; 12 heads do not divide 256, so 64-wide heads
    assert dims(resolve_shape("base", layers=4, hidden=256)) == (4, 256, 4, 1024)
    assert dims(resolve_shape("6L-384", hidden=768)) == (6, 768, 12, 3072)  # 12 still divides 768
    assert dims(resolve_shape("2L-128", hidden=96, heads=3, ffn=200)) == (2, 96, 3, 200)
    assert resolve_shape("4L-312") is resolve_shape("4L-312")  # no override: the registered preset itself
    with pytest.raises(CompressError, match="hidden size 100 is not divisible by 3 heads"):
        resolve_shape("2L-128", hidden=100, heads=3)
    with pytest.raises(CompressError, match="layers must be at least 1"):
        resolve_shape("2L-128", layers=0)


def test_pretrain_and_distill_configs_build_the_explicit_shape():
    from compress.core.config import from_dict
    from compress.distill.task import DistillConfig
    from compress.teacher.pretrain import PretrainConfig, build_model

    cfg = from_dict(PretrainConfig, {"corpus": ["x.txt"], "shape": "base", "layers": 2, "hidden": 64, "heads": 2})
    model, shape = build_model(cfg, vocab_size=50, seed=0)
    c = model.config
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.intermediate_size) == (2, 64, 2, 256)
    d = from_dict(DistillConfig, {"task": "sst2", "student": "6L-384", "layers": 3, "ffn": 768})
    assert (d.shape.sizes.layers, d.shape.sizes.ffn) == (3, 768)
    s = d.shape.resolve()
    assert (s.layers, s.hidden, s.heads, s.ffn) == (3, 384, 12, 768)
