"""Distillation losses against values computed by hand in the tests."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from compress.distill import losses as L


def softmax(xs):
    exps = [math.exp(x) for x in xs]
    return [e / sum(exps) for e in exps]


def kl_by_hand(p, q):
    """KL(p || q) for two probability lists."""
    return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q) if pi > 0)


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


def t(values, **kw):
    return torch.tensor(values, dtype=torch.float32, **kw)


# ---------------------------------------------------------------------------- output logits


def test_soft_target_kl_by_hand_with_t_squared():
    # s/T = [0, 1], t/T = [1, 0]: p_t = [a, b], p_s = [b, a] with a = e/(1+e), b = 1/(1+e).
    a, b = math.e / (1 + math.e), 1 / (1 + math.e)
    expected = 2**2 * (a * math.log(a / b) + b * math.log(b / a))
    got = L.soft_target_kl(t([[0.0, 2.0]]), t([[2.0, 0.0]]), temperature=2.0)
    assert got.dim() == 0
    assert got.item() == pytest.approx(expected, rel=1e-6)


def test_soft_target_kl_zero_for_identical_logits():
    logits = t([[1.0, -2.0, 0.5], [3.0, 3.0, 0.0]])
    assert L.soft_target_kl(logits, logits.clone(), temperature=3.0).item() == pytest.approx(0.0, abs=1e-7)


def test_soft_target_kl_is_batch_mean_times_t_squared():
    s, te, temp = [[0.3, -1.2, 2.0], [1.0, 0.0, 0.0]], [[1.0, 0.5, -0.5], [0.0, 2.0, 1.0]], 3.0
    per_row = [
        kl_by_hand(softmax([x / temp for x in tr]), softmax([x / temp for x in sr])) for sr, tr in zip(s, te)
    ]
    got = L.soft_target_kl(t(s), t(te), temperature=temp)
    assert got.item() / temp**2 == pytest.approx(sum(per_row) / 2, rel=1e-5)


def test_hard_label_ce_ignores_minus_100():
    logits, labels = [[2.0, 0.0], [0.0, 1.0], [5.0, -5.0]], [0, 1, -100]
    expected = -(math.log(softmax(logits[0])[0]) + math.log(softmax(logits[1])[1])) / 2
    assert L.hard_label_ce(t(logits), torch.tensor(labels)).item() == pytest.approx(expected, rel=1e-6)


def test_regression_mse_terms_by_hand():
    student, teacher, labels = t([[1.0], [2.0]]), t([[0.0], [2.0]]), t([3.0, 2.0])
    # mse(s, t) = (1 + 0) / 2, mse(s, y) = (4 + 0) / 2
    assert L.logits_mse(student, teacher).item() == pytest.approx(0.5)
    assert L.hard_label_mse(student, labels).item() == pytest.approx(2.0)


def test_mlm_ce_only_scores_labelled_positions():
    logits = t([[[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]]])  # (batch 1, seq 2, vocab 3)
    labels = torch.tensor([[-100, 2]])
    expected = -math.log(softmax([0.0, 2.0, 0.0])[2])
    assert L.mlm_ce(logits, labels).item() == pytest.approx(expected, rel=1e-6)
    nothing = L.mlm_ce(logits, torch.full((1, 2), -100))
    assert nothing.item() == 0.0
    # only the selected positions, as distillation computes them: the same loss
    assert L.mlm_ce(logits[labels != -100], labels[labels != -100]).item() == pytest.approx(expected, rel=1e-6)


# ---------------------------------------------------------------------------- spans


def test_span_kd_by_hand_and_ignores_masked_positions():
    mask = torch.tensor([[1, 1, 0]])
    s_start, t_start = t([[0.0, 2.0, 7.0]]), t([[2.0, 0.0, -3.0]])
    s_end, t_end = t([[1.0, 1.0, 4.0]]), t([[1.0, 1.0, 9.0]])
    temp = 2.0
    start = temp**2 * kl_by_hand(softmax([1.0, 0.0]), softmax([0.0, 1.0]))
    end = 0.0  # identical over the two valid positions
    got = L.span_kd(s_start, s_end, t_start, t_end, mask, temperature=temp)
    assert got.item() == pytest.approx((start + end) / 2, rel=1e-5)
    # Changing the padded position on either side must not change the loss.
    s_start[0, 2], t_end[0, 2] = -50.0, 123.0
    assert L.span_kd(s_start, s_end, t_start, t_end, mask, temperature=temp).item() == pytest.approx(got.item(), rel=1e-6)


def test_span_kd_excludes_all_masked_rows():
    mask = torch.tensor([[1, 1], [0, 0]])
    s, te = t([[0.0, 2.0], [5.0, -5.0]]), t([[2.0, 0.0], [-5.0, 5.0]])
    got = L.span_kd(s, s, te, te, mask, temperature=1.0)
    row0 = kl_by_hand(softmax([2.0, 0.0]), softmax([0.0, 2.0]))
    assert torch.isfinite(got)
    assert got.item() == pytest.approx(row0, rel=1e-5)


# ---------------------------------------------------------------------------- hidden states


def test_hidden_mse_by_hand_and_mask():
    student = torch.zeros(1, 3, 2)
    teacher = t([[[1.0, 1.0], [2.0, 0.0], [100.0, 100.0]]])
    mask = torch.tensor([[1, 1, 0]])
    # valid squared errors: 1, 1, 4, 0 over 2 tokens x 2 features
    assert L.hidden_mse(student, teacher, mask).item() == pytest.approx(1.5)
    teacher[0, 2] = -7.0
    assert L.hidden_mse(student, teacher, mask).item() == pytest.approx(1.5)
    assert L.embedding_mse(student, teacher, mask).item() == pytest.approx(1.5)


def test_hidden_mse_identity_projection_equals_plain_mse():
    torch.manual_seed(0)
    student, teacher = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    proj = nn.Linear(4, 4)
    with torch.no_grad():
        proj.weight.copy_(torch.eye(4))
        proj.bias.zero_()
    plain = ((student - teacher) ** 2).sum().item() / student.numel()
    assert L.hidden_mse(student, teacher, projection=proj).item() == pytest.approx(plain, rel=1e-6)
    assert L.hidden_mse(student, teacher).item() == pytest.approx(plain, rel=1e-6)


def test_hidden_mse_widths_need_a_projection_of_the_right_shape():
    student, teacher = torch.randn(2, 3, 4), torch.randn(2, 3, 6)
    with pytest.raises(ValueError, match="projection"):
        L.hidden_mse(student, teacher)
    with pytest.raises(ValueError, match="width 5"):
        L.hidden_mse(student, teacher, projection=nn.Linear(4, 5))
    proj = nn.Linear(4, 6)
    assert proj(student).shape == (2, 3, 6)
    L.hidden_mse(student, teacher, projection=proj).backward()
    assert proj.weight.grad is not None and proj.weight.grad.abs().sum() > 0


def test_cosine_hidden_parallel_and_orthogonal():
    base = t([[[1.0, 2.0, 0.0], [0.0, 1.0, 1.0]]])
    assert L.cosine_hidden(3 * base, base).item() == pytest.approx(0.0, abs=1e-6)
    student, teacher = t([[[1.0, 0.0], [0.0, 1.0]]]), t([[[0.0, 5.0], [2.0, 0.0]]])
    assert L.cosine_hidden(student, teacher).item() == pytest.approx(1.0, abs=1e-6)
    # Token 1 is padding: only the parallel token 0 counts.
    mixed_teacher = t([[[2.0, 0.0], [2.0, 0.0]]])
    assert L.cosine_hidden(student, mixed_teacher, torch.tensor([[1, 0]])).item() == pytest.approx(0.0, abs=1e-6)


# ---------------------------------------------------------------------------- attention


def test_attention_mse_identical_and_by_hand():
    student = t([[[[1.0, 0.0], [0.5, 0.5]]]])  # (batch 1, heads 1, seq 2, seq 2)
    teacher = t([[[[0.5, 0.5], [0.5, 0.5]]]])
    assert L.attention_mse(teacher, teacher.clone()).item() == 0.0
    # squared errors 0.25, 0.25, 0, 0 over 4 pairs
    assert L.attention_mse(student, teacher).item() == pytest.approx(0.125)
    # only the (0, 0) pair is valid
    assert L.attention_mse(student, teacher, torch.tensor([[1, 0]])).item() == pytest.approx(0.25)


def test_attention_mse_averages_heads_when_counts_differ():
    student = t([[[[0.5, 0.5], [0.5, 0.5]]]])  # 1 head
    teacher = t([[[[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [1.0, 0.0]]]])  # 2 heads averaging to 0.5
    assert L.attention_mse(student, teacher).item() == pytest.approx(0.0, abs=1e-7)


def test_attention_kl_by_hand_and_masked_keys():
    student = t([[[[0.25, 0.75], [0.5, 0.5]]]])
    teacher = t([[[[0.5, 0.5], [0.5, 0.5]]]])
    row0 = kl_by_hand([0.5, 0.5], [0.25, 0.75])
    assert L.attention_kl(student, teacher).item() == pytest.approx(row0 / 2, rel=1e-5)
    assert L.attention_kl(teacher, teacher.clone()).item() == pytest.approx(0.0, abs=1e-7)
    # HF-style padding: the padded key has probability exactly 0 on both sides.
    s_pad = t([[[[0.25, 0.75, 0.0], [0.5, 0.5, 0.0], [0.1, 0.9, 0.0]]]])
    t_pad = t([[[[0.5, 0.5, 0.0], [0.5, 0.5, 0.0], [0.9, 0.1, 0.0]]]])
    got = L.attention_kl(s_pad, t_pad, torch.tensor([[1, 1, 0]]))
    assert got.item() == pytest.approx(row0 / 2, rel=1e-5)


def test_value_relation_kl_by_hand():
    # One relation head of width 1: VR_s row 0 = softmax([1, 0]), row 1 uniform; VR_t uniform.
    student, teacher = t([[[1.0], [0.0]]]), torch.zeros(1, 2, 1)
    row0 = kl_by_hand([0.5, 0.5], [sigmoid(1.0), sigmoid(-1.0)])
    got = L.value_relation_kl(student, teacher, relation_heads=1)
    assert got.item() == pytest.approx(row0 / 2, rel=1e-5)


def test_value_relation_kl_identical_widths_and_mask():
    torch.manual_seed(0)
    values = torch.randn(2, 5, 8)
    assert L.value_relation_kl(values, values.clone(), relation_heads=2).item() == pytest.approx(0.0, abs=1e-6)
    student, teacher = torch.randn(2, 5, 8), torch.randn(2, 5, 16)  # d_s != d_t
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    before = L.value_relation_kl(student, teacher, mask, relation_heads=2)
    assert torch.isfinite(before) and before.item() > 0
    student[0, 4], teacher[0, 3] = 50.0, -50.0  # padded tokens
    assert L.value_relation_kl(student, teacher, mask, relation_heads=2).item() == pytest.approx(before.item(), rel=1e-6)
    with pytest.raises(ValueError, match="divisible"):
        L.value_relation_kl(student, teacher, relation_heads=3)


# ---------------------------------------------------------------------------- gradients


def _pair(shape_s, shape_t=None):
    student = torch.randn(*shape_s, requires_grad=True)
    teacher = torch.randn(*(shape_t or shape_s), requires_grad=True)
    return student, teacher


def _probs(shape):
    return torch.randn(*shape).softmax(-1).requires_grad_(True)


GRADIENT_CASES = {
    "soft_target_kl": lambda: (_pair((3, 4)), lambda s, te: L.soft_target_kl(s, te, 2.0)),
    "hidden_mse": lambda: (_pair((2, 3, 4)), lambda s, te: L.hidden_mse(s, te, torch.tensor([[1, 1, 0], [1, 0, 0]]))),
    "cosine_hidden": lambda: (_pair((2, 3, 4)), lambda s, te: L.cosine_hidden(s, te)),
    "attention_mse": lambda: ((_probs((2, 2, 3, 3)), _probs((2, 2, 3, 3))), lambda s, te: L.attention_mse(s, te)),
    "attention_kl": lambda: ((_probs((2, 2, 3, 3)), _probs((2, 4, 3, 3))), lambda s, te: L.attention_kl(s, te)),
    "value_relation_kl": lambda: (_pair((2, 3, 4), (2, 3, 8)), lambda s, te: L.value_relation_kl(s, te, relation_heads=2)),
    "span_kd": lambda: (_pair((2, 5)), lambda s, te: L.span_kd(s, s * 2, te, te * 2, torch.tensor([[1, 1, 1, 0, 0], [0, 0, 0, 0, 0]]))),
}


@pytest.mark.parametrize("name", sorted(GRADIENT_CASES))
def test_gradients_reach_the_student_only(name):
    torch.manual_seed(1)
    (student, teacher), loss_fn = GRADIENT_CASES[name]()
    loss = loss_fn(student, teacher)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    assert student.grad is not None and torch.isfinite(student.grad).all()
    assert student.grad.abs().sum() > 0
    assert teacher.grad is None
