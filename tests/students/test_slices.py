"""A narrower student cut out of the teacher (``--init teacher`` / ``teacher-slices``), on tiny models."""

from __future__ import annotations

import pytest
import torch

from compress.core.model import structure as st
from compress.core.errors import CompressError
from compress.core.model.shapes import Shape
from compress.students.init import init_from_teacher_slices, init_student
from compress.students.slices import fits_inside, hidden_importance
from tests.conftest import make_tiny_model
from tests.students.test_students import batch as probe
from tests.core.test_families import inputs_for, logits, make_model, make_tokenizer

TEACHER = Shape(3, 32, 4, 37)  # the tiny config: 4 heads of 8


def out(model, batch):
    with torch.no_grad():
        return model.eval()(**batch).logits


def test_a_student_of_the_teachers_shape_is_the_teacher():
    teacher = make_tiny_model(seed=1, num_hidden_layers=3)
    student, used = init_from_teacher_slices(teacher, TEACHER)
    assert used == [0, 1, 2]
    assert torch.allclose(out(student, probe()), out(teacher, probe()), atol=1e-6)


def test_dead_ffn_neurons_are_the_ones_dropped_and_nothing_changes():
    teacher = make_tiny_model(seed=2, num_hidden_layers=3)
    dead = [0, 5, 9, 20, 36]  # neurons whose output weights are zero contribute nothing
    with torch.no_grad():
        for layer in st.layers(teacher):
            layer.ffn_out.weight[:, dead] = 0
    student, _ = init_from_teacher_slices(teacher, Shape(3, 32, 4, 37 - len(dead)))
    kept = [j for j in range(37) if j not in dead]
    for s, t in zip(st.layers(student), st.layers(teacher)):
        assert torch.equal(s.ffn_in.weight, t.ffn_in.weight[kept])
        assert torch.equal(s.ffn_in.bias, t.ffn_in.bias[kept])
        assert torch.equal(s.ffn_out.weight, t.ffn_out.weight[:, kept])
    assert torch.allclose(out(student, probe()), out(teacher, probe()), atol=1e-5)


def test_hidden_heads_and_head_dimensions_are_cut_where_the_teacher_is_weakest():
    """Hidden dims 24-31 silenced, Q/K dims 6 and 7 of every head zeroed, V dims 0 and 1 made weak: a 24-wide
    student with 4 heads of 6 keeps exactly the others; then 2 heads of 8 keep the strongest heads."""
    teacher = make_tiny_model(seed=3, num_hidden_layers=2)
    weak_hidden = list(range(24, 32))
    with torch.no_grad():
        for name, module in teacher.named_modules():
            if isinstance(module, torch.nn.LayerNorm):  # every hidden state is ~0 in these dimensions
                module.weight[weak_hidden] = 1e-3
                module.bias[weak_hidden] = 0
        for layer in st.layers(teacher):
            q, k, v = layer.projections
            for h in range(4):
                q.weight[h * 8 + 6: h * 8 + 8] = 0
                k.weight[h * 8 + 6: h * 8 + 8] = 0
                v.weight[h * 8: h * 8 + 2] *= 1e-3
    assert set(torch.topk(hidden_importance(teacher), 24).indices.tolist()) == set(range(24))

    student, _ = init_from_teacher_slices(teacher, Shape(2, 24, 4, 37))
    hidden = list(range(24))
    qk_rows = [h * 8 + i for h in range(4) for i in range(6)]
    v_rows = [h * 8 + i for h in range(4) for i in range(2, 8)]
    for s, t in zip(st.layers(student), st.layers(teacher)):
        (sq, sk, sv), (tq, tk, tv) = s.projections, t.projections
        assert torch.equal(sq.weight, tq.weight[qk_rows][:, hidden]) and torch.equal(sq.bias, tq.bias[qk_rows])
        assert torch.equal(sk.weight, tk.weight[qk_rows][:, hidden])
        assert torch.equal(sv.weight, tv.weight[v_rows][:, hidden])
        assert torch.equal(s.output.weight, t.output.weight[hidden][:, v_rows])
        assert torch.equal(s.ffn_out.weight, t.ffn_out.weight[hidden])
    assert torch.equal(student.bert.embeddings.word_embeddings.weight, teacher.bert.embeddings.word_embeddings.weight[:, hidden])
    assert torch.equal(student.bert.pooler.dense.weight, teacher.bert.pooler.dense.weight[hidden][:, hidden])
    assert torch.equal(student.classifier.weight, teacher.classifier.weight[:, hidden])
    assert st.layers(student)[0].head_size == 6

    with torch.no_grad():  # head 2 writes nothing, head 0 writes most: 2 heads of 8 keep head 0 and not head 2
        for layer in st.layers(teacher):
            layer.output.weight[:, 16:24] = 0
            layer.output.weight[:, 0:8] *= 10
    student, _ = init_from_teacher_slices(teacher, Shape(2, 16, 2, 37))
    s_emb, t_emb = student.bert.embeddings.word_embeddings.weight, teacher.bert.embeddings.word_embeddings.weight
    hidden = [next(j for j in range(32) if torch.equal(s_emb[:, i], t_emb[:, j])) for i in range(16)]
    assert sorted(hidden) == hidden and set(hidden) <= set(range(24))  # the kept dimensions, in the teacher's order
    for s, t in zip(st.layers(student), st.layers(teacher)):
        sk, tk = s.projections[1].weight, t.projections[1].weight[:, hidden]
        kept = [h for h in range(4) for j in range(2) if torch.equal(sk[j * 8:(j + 1) * 8], tk[h * 8:(h + 1) * 8])]
        assert len(kept) == 2 and kept[0] == 0 and 2 not in kept


@pytest.mark.parametrize("head", ["masked-lm", "question-answering"])
def test_other_heads_are_cut_and_tied_weights_stay_tied(head):
    teacher = make_tiny_model(head, seed=4, num_hidden_layers=2)
    student, _ = init_from_teacher_slices(teacher, Shape(2, 16, 4, 20))
    assert type(student) is type(teacher)
    if head == "masked-lm":
        assert student.cls.predictions.decoder.weight.data_ptr() == student.bert.embeddings.word_embeddings.weight.data_ptr()
    with torch.no_grad():
        result = student.eval()(**probe())
    first = result.logits if head == "masked-lm" else result.start_logits
    assert torch.isfinite(first).all() and st.config_sizes(student.config).hidden == 16


@pytest.mark.parametrize("name", ["roberta", "distilbert", "electra", "modernbert"])
def test_other_families(name, tmp_path):
    teacher = make_model(name, layers=2)
    tok = make_tokenizer(name, tmp_path / "tok")
    x = inputs_for(teacher, tok)
    same, _ = init_from_teacher_slices(teacher, Shape(2, 32, 4, 37))
    assert torch.allclose(logits(same.eval(), x), logits(teacher, x), atol=1e-5)  # the full cut is the teacher
    # ModernBERT heads keep their 8 dimensions; ELECTRA keeps its 16-wide embeddings and their projection.
    shape = Shape(1, 16, 2, 20) if name == "modernbert" else Shape(1, 24, 4, 20)
    narrow, _ = init_from_teacher_slices(teacher, shape)
    assert st.config_sizes(narrow.config).hidden == shape.hidden and torch.isfinite(logits(narrow.eval(), x)).all()


def test_refusals():
    teacher = make_tiny_model(num_hidden_layers=3)
    for shape, message in [
        (Shape(2, 48, 4, 37), "hidden size 48 is wider than the teacher's 32"),
        (Shape(2, 32, 8, 37), "8 heads are more than the teacher's 4"),
        (Shape(2, 32, 2, 37), "heads of 16 dimensions are wider than the teacher's 8"),
        (Shape(2, 32, 4, 40), "FFN width 40 is wider than the teacher's 37"),
    ]:
        with pytest.raises(CompressError, match=f"cannot cut a .* student out of the teacher: .*{message}"):
            init_from_teacher_slices(teacher, shape)
    pruned = make_tiny_model(num_hidden_layers=3)
    st.prune_heads(pruned, {1: [0]})
    with pytest.raises(CompressError, match="pruned heads"):
        init_from_teacher_slices(pruned, Shape(2, 16, 4, 20))
    with pytest.raises(CompressError, match="rotary"):
        init_from_teacher_slices(make_model("modernbert", layers=2), Shape(1, 16, 4, 20))


def test_teacher_init_chooses_layers_or_slices_and_records_which():
    teacher = make_tiny_model(num_hidden_layers=4)
    same, info = init_student(teacher, Shape(2, 32, 4, 37))
    assert info["method"] == "teacher-layers" and info["teacher_layers"] == [1, 3]
    narrow, info = init_student(teacher, Shape(2, 16, 4, 20), layers=[0, 3])
    assert info["method"] == "teacher-slices" and info["teacher_layers"] == [0, 3]
    assert st.config_sizes(narrow.config).hidden == 16
    with pytest.raises(CompressError, match="a 2L-64-37 student cannot start from the teacher's weights: hidden size 64 "
                                             "is wider .*--init random"):
        init_student(teacher, Shape(2, 64, 4, 37))


def test_fits_inside():
    config = make_tiny_model(num_hidden_layers=3).config
    assert fits_inside(config, Shape(3, 32, 4, 37)) and fits_inside(config, Shape(2, 16, 4, 20))
    assert fits_inside(config, Shape(2, 16, 2, 20))  # 2 heads of 8
    assert not fits_inside(config, Shape(4, 32, 4, 37))  # deeper
    assert not fits_inside(config, Shape(2, 32, 2, 37))  # 16-wide heads
    assert not fits_inside(config, Shape(2, 32, 4, 64))  # wider FFN
    modern = make_model("modernbert", layers=2).config
    assert fits_inside(modern, Shape(1, 16, 2, 20)) and not fits_inside(modern, Shape(1, 16, 4, 20))
