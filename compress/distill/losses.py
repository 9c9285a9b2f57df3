"""Distillation losses as pure functions: ``(student, teacher, mask=None) -> scalar``.

Conventions, set here once for every function in the module:

* ``mask`` is ``(batch, seq)`` with 1/True for real tokens and 0/False for padding
  (the tokenizer's ``attention_mask``). Padded positions never contribute, and rows with
  no real position at all are excluded from averages instead of producing NaN.
* The teacher side is a fixed target: teacher tensors are detached, so gradients reach
  only the student (and a student-side ``projection``).
* Soft-target KL terms are ``KL(teacher || student)`` and are multiplied by ``T**2``
  (Hinton et al. 2015, as in DistilBERT) so that their gradients keep the same scale when
  the temperature changes.
* Attention maps are the probabilities Hugging Face returns with
  ``output_attentions=True`` (eager attention), shape ``(batch, heads, seq, seq)``.
  When student and teacher head counts differ, both maps are averaged over heads first.

Every function returns a scalar tensor that is differentiable w.r.t. the student inputs.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

IGNORE_INDEX = -100  # labels with this value are not scored (PyTorch's cross_entropy default)


# ---------------------------------------------------------------------------- helpers


def _token_mask(mask: Tensor | None, batch: int, seq: int, like: Tensor) -> Tensor:
    """A boolean ``(batch, seq)`` mask of real tokens (all True when ``mask`` is None)."""
    if mask is None:
        return torch.ones(batch, seq, dtype=torch.bool, device=like.device)
    if tuple(mask.shape) != (batch, seq):
        raise ValueError(f"mask has shape {tuple(mask.shape)}; expected (batch, seq) = {(batch, seq)}")
    return mask.to(like.device) != 0


def _masked_mean(values: Tensor, keep: Tensor) -> Tensor:
    """Mean of ``values`` where ``keep`` is True; 0 (still differentiable) when nothing is kept."""
    keep = keep.to(values.dtype)
    return (values * keep).sum() / keep.sum().clamp_min(1.0)


def _kl_rows(student_logits: Tensor, teacher_logits: Tensor, keep: Tensor | None = None) -> Tensor:
    """KL(softmax(teacher) || softmax(student)) along the last dim, one value per row: ``(...)``.

    Entries where ``keep`` is False are left out of both distributions (filled with the
    dtype's most negative value before the softmax, and their terms zeroed afterwards,
    so an all-excluded row gives 0 rather than NaN; callers drop such rows).
    """
    if keep is not None:
        neg = torch.finfo(student_logits.dtype).min
        student_logits = student_logits.masked_fill(~keep, neg)
        teacher_logits = teacher_logits.masked_fill(~keep, neg)
    log_s = F.log_softmax(student_logits, dim=-1)
    log_t = F.log_softmax(teacher_logits, dim=-1)
    terms = log_t.exp() * (log_t - log_s)
    if keep is not None:
        terms = terms.masked_fill(~keep, 0.0)
    return terms.sum(dim=-1)


def _kl_probs_rows(student_probs: Tensor, teacher_probs: Tensor, keep_keys: Tensor) -> Tensor:
    """KL(teacher || student) between probability rows (last dim), over kept keys only: ``(...)``."""
    tiny = torch.finfo(student_probs.dtype).tiny  # HF gives exact zeros at padded keys
    log_s = student_probs.clamp_min(tiny).log()
    log_t = teacher_probs.clamp_min(tiny).log()
    terms = (teacher_probs * (log_t - log_s)).masked_fill(~keep_keys, 0.0)
    return terms.sum(dim=-1)


def _project(student_hidden: Tensor, teacher_hidden: Tensor, projection: nn.Module | None) -> Tensor:
    """Apply the optional student-side projection and check the widths then agree."""
    if projection is not None:
        student_hidden = projection(student_hidden)
    d_s, d_t = student_hidden.shape[-1], teacher_hidden.shape[-1]
    if d_s != d_t:
        hint = (
            f"the projection outputs width {d_s}; it must map to the teacher's {d_t}"
            if projection is not None
            else f"pass projection=nn.Linear({d_s}, {d_t}) (TinyBERT's W_h)"
        )
        raise ValueError(f"student width {d_s} != teacher width {d_t}: {hint}")
    if student_hidden.shape[:-1] != teacher_hidden.shape[:-1]:
        raise ValueError(
            f"student {tuple(student_hidden.shape)} and teacher {tuple(teacher_hidden.shape)} "
            "differ in (batch, seq)"
        )
    return student_hidden


def _match_heads(student_attn: Tensor, teacher_attn: Tensor) -> tuple[Tensor, Tensor]:
    """Same maps when head counts agree; otherwise both averaged over heads: ``(batch, 1, seq, seq)``."""
    if student_attn.dim() != 4 or teacher_attn.dim() != 4:
        raise ValueError("attention maps must be (batch, heads, seq, seq)")
    if student_attn.shape[0] != teacher_attn.shape[0] or student_attn.shape[2:] != teacher_attn.shape[2:]:
        raise ValueError(
            f"student attention {tuple(student_attn.shape)} and teacher {tuple(teacher_attn.shape)} "
            "differ in (batch, seq, seq)"
        )
    if student_attn.shape[1] != teacher_attn.shape[1]:
        # Heads cannot be paired one to one; the head-averaged map is a distribution too.
        return student_attn.mean(dim=1, keepdim=True), teacher_attn.mean(dim=1, keepdim=True)
    return student_attn, teacher_attn


def _cross_entropy(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean cross-entropy over labels != -100; 0 (not NaN) when every label is ignored."""
    logits = logits.reshape(-1, logits.shape[-1])
    labels = labels.reshape(-1).to(logits.device)
    if not bool((labels != IGNORE_INDEX).any()):
        return logits.sum() * 0.0
    return F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX)


# ---------------------------------------------------------------------------- output logits


def soft_target_kl(student_logits: Tensor, teacher_logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Soft-target KL of Hinton et al. (2015), as in DistilBERT: T² · KL(p_t^T || p_s^T), batch-mean.

    ``student_logits``, ``teacher_logits``: ``(batch, C)`` (any leading dims are treated as
    the batch). The KL is summed over the C classes and averaged over rows ("batchmean"),
    then multiplied by ``T**2`` so gradient magnitudes do not shrink as 1/T².
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(f"student logits {tuple(student_logits.shape)} vs teacher {tuple(teacher_logits.shape)}")
    t = temperature
    rows = _kl_rows(student_logits / t, teacher_logits.detach() / t)  # (batch,)
    return rows.mean() * t**2


def hard_label_ce(student_logits: Tensor, labels: Tensor) -> Tensor:
    """Cross-entropy with the gold labels (the hard term of Hinton et al. 2015); -100 is ignored.

    ``student_logits``: ``(batch, C)``; ``labels``: ``(batch,)`` class ids.
    """
    return _cross_entropy(student_logits, labels)


def logits_mse(student_logits: Tensor, teacher_logits: Tensor) -> Tensor:
    """MSE between student and teacher outputs: regression KD (e.g. STS-B; Tang et al. 2019).

    ``(batch, 1)`` or ``(batch,)`` scores (or ``(batch, C)`` logits); mean over all elements.
    """
    teacher = teacher_logits.detach().reshape(student_logits.shape)
    return F.mse_loss(student_logits, teacher)


def hard_label_mse(student_scores: Tensor, labels: Tensor) -> Tensor:
    """MSE with the gold targets: the hard term of a regression task (STS-B).

    ``student_scores``: ``(batch, 1)`` or ``(batch,)``; ``labels``: ``(batch,)`` floats,
    cast to the scores' dtype (mixed precision).
    """
    return F.mse_loss(student_scores.reshape(-1), labels.reshape(-1).to(student_scores.dtype))


def sigmoid_kd(student_logits: Tensor, teacher_logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Soft-target KD for multi-label outputs: T² · KL(Bernoulli(σ(t/T)) || Bernoulli(σ(s/T))) per label, mean.

    ``(batch, C)`` logits, one independent yes/no per label (a sigmoid, not a softmax): the
    binary form of Hinton et al.'s soft targets, scaled by ``T**2`` as :func:`soft_target_kl`.
    Zero when the student's probabilities equal the teacher's.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(f"student logits {tuple(student_logits.shape)} vs teacher {tuple(teacher_logits.shape)}")
    t = temperature
    s, p = student_logits / t, torch.sigmoid(teacher_logits.detach() / t)
    # KL = BCE(s, p) - H(p): the cross-entropy with soft targets less the targets' own entropy.
    cross = F.binary_cross_entropy_with_logits(s, p, reduction="none")
    entropy = F.binary_cross_entropy(p, p, reduction="none")
    return (cross - entropy).mean() * t**2


def hard_label_bce(student_logits: Tensor, labels: Tensor) -> Tensor:
    """Binary cross-entropy with multi-hot gold labels: the hard term of a multi-label task.

    ``student_logits``, ``labels``: ``(batch, C)``; mean over every (example, label).
    """
    return F.binary_cross_entropy_with_logits(student_logits, labels.to(student_logits.dtype).reshape(student_logits.shape))


def token_kd(student_logits: Tensor, teacher_logits: Tensor, mask: Tensor | None = None, temperature: float = 1.0) -> Tensor:
    """Soft-target KD per token (Hinton et al. 2015 at every position, as in distilled NER taggers).

    ``(batch, seq, C)`` logits; T² · KL(p_t || p_s) over C at each real token (``mask``),
    averaged over the real tokens of the batch.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(f"student logits {tuple(student_logits.shape)} vs teacher {tuple(teacher_logits.shape)}")
    batch, seq, _ = student_logits.shape
    keep = _token_mask(mask, batch, seq, student_logits)
    t = temperature
    kl = _kl_rows(student_logits / t, teacher_logits.detach() / t)  # (batch, seq)
    return _masked_mean(kl, keep) * t**2


def token_ce(student_logits: Tensor, labels: Tensor) -> Tensor:
    """Cross-entropy per token with the gold tags, over positions whose label is not -100.

    ``student_logits``: ``(batch, seq, C)``; ``labels``: ``(batch, seq)`` (a word's first piece
    carries its tag, every other position -100).
    """
    return _cross_entropy(student_logits, labels)


def span_kd(
    student_start: Tensor,
    student_end: Tensor,
    teacher_start: Tensor,
    teacher_end: Tensor,
    mask: Tensor | None = None,
    temperature: float = 2.0,
) -> Tensor:
    """Soft-target KD for SQuAD spans (Hinton et al. 2015 per boundary, as in DistilBERT's SQuAD runs).

    Start/end logits are ``(batch, seq)``; positions where ``mask`` is 0 are removed from
    both softmaxes. Returns the mean of the start and end terms, each T² · KL averaged over
    rows that have at least one valid position: :func:`partial_span_kd` with a teacher that
    scores every position.
    """
    return partial_span_kd(student_start, student_end, teacher_start, teacher_end, mask, temperature)


def partial_span_kd(
    student_start: Tensor,
    student_end: Tensor,
    teacher_start: Tensor,
    teacher_end: Tensor,
    mask: Tensor | None = None,
    temperature: float = 2.0,
) -> Tensor:
    """Soft-target KD for SQuAD spans where the teacher scores only some positions (Hinton et al. 2015 per boundary).

    Start/end logits are ``(batch, seq)``, the teacher's at the student's positions. A teacher logit of ``-inf`` marks a
    position the teacher cannot express: that position leaves both softmaxes of that boundary (start and end apart),
    so the teacher's distribution is renormalised over the positions it scores and the student's over the same ones.
    Positions where ``mask`` is 0 leave both too. Each boundary's term is T² · KL averaged over the rows with at least
    one kept position (a row with none adds nothing: its loss is the hard one alone); the result is the mean of the
    start and end terms. With every teacher logit finite it is :func:`span_kd`.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    if not (student_start.shape == student_end.shape == teacher_start.shape == teacher_end.shape):
        raise ValueError(f"start/end logits differ in shape: student {tuple(student_start.shape)}, "
                         f"{tuple(student_end.shape)}; teacher {tuple(teacher_start.shape)}, {tuple(teacher_end.shape)}")
    batch, seq = student_start.shape
    real = _token_mask(mask, batch, seq, student_start)
    t = temperature

    def term(student: Tensor, teacher: Tensor) -> Tensor:
        teacher = teacher.detach().to(student.device)
        keep = real & torch.isfinite(teacher)  # (batch, seq): positions both sides express
        kl = _kl_rows(student / t, teacher / t, keep)  # (batch,)
        return _masked_mean(kl, keep.any(dim=-1)) * t**2

    return 0.5 * (term(student_start, teacher_start) + term(student_end, teacher_end))


def mlm_ce(prediction_logits: Tensor, labels: Tensor) -> Tensor:
    """Masked-LM cross-entropy (Devlin et al. 2019; DistilBERT's L_mlm) over labels != -100.

    ``prediction_logits``: ``(batch, seq, vocab)`` with ``labels`` ``(batch, seq)``, or
    only the selected positions: ``(n_selected, vocab)`` with ``(n_selected,)``.
    """
    return _cross_entropy(prediction_logits, labels)


# ---------------------------------------------------------------------------- hidden states


def hidden_mse(
    student_hidden: Tensor,
    teacher_hidden: Tensor,
    mask: Tensor | None = None,
    projection: nn.Module | None = None,
) -> Tensor:
    """TinyBERT's hidden-state loss (Jiao et al. 2020, eq. 5): MSE(H_s W_h, H_t) over real tokens.

    ``student_hidden``: ``(batch, seq, d_s)``; ``teacher_hidden``: ``(batch, seq, d_t)``.
    ``projection`` (e.g. ``nn.Linear(d_s, d_t)``, TinyBERT's learnable W_h) is applied to
    the student first; it is required when ``d_s != d_t``. The mean runs over valid tokens
    and all features.
    """
    student = _project(student_hidden, teacher_hidden, projection)
    batch, seq, _ = student.shape
    keep = _token_mask(mask, batch, seq, student)
    per_token = (student - teacher_hidden.detach()).pow(2).mean(dim=-1)  # (batch, seq)
    return _masked_mean(per_token, keep)


def embedding_mse(
    student_embeddings: Tensor,
    teacher_embeddings: Tensor,
    mask: Tensor | None = None,
    projection: nn.Module | None = None,
) -> Tensor:
    """TinyBERT's embedding-layer loss (Jiao et al. 2020, eq. 6): MSE(E_s W_e, E_t).

    The same computation as :func:`hidden_mse`, applied to the embedding output
    (``hidden_states[0]``, ``(batch, seq, d)``) with its own projection W_e.
    """
    return hidden_mse(student_embeddings, teacher_embeddings, mask, projection)


def cosine_hidden(
    student_hidden: Tensor,
    teacher_hidden: Tensor,
    mask: Tensor | None = None,
    projection: nn.Module | None = None,
) -> Tensor:
    """DistilBERT's cosine embedding loss (Sanh et al. 2019), target 1: mean of 1 - cos(h_s, h_t).

    ``(batch, seq, d_s)`` vs ``(batch, seq, d_t)``; averaged over valid tokens.
    """
    student = _project(student_hidden, teacher_hidden, projection)
    batch, seq, _ = student.shape
    keep = _token_mask(mask, batch, seq, student)
    cos = F.cosine_similarity(student, teacher_hidden.detach(), dim=-1, eps=1e-8)  # (batch, seq)
    return _masked_mean(1.0 - cos, keep)


# ---------------------------------------------------------------------------- attention


def attention_mse(student_attn: Tensor, teacher_attn: Tensor, mask: Tensor | None = None) -> Tensor:
    """TinyBERT's attention loss (Jiao et al. 2020, eq. 3): MSE between attention maps.

    ``(batch, heads, seq, seq)`` attention probabilities (what Hugging Face returns with
    ``output_attentions``; the paper uses pre-softmax scores, which HF does not expose).
    The squared error is averaged over valid (query, key) pairs and over heads; with
    different head counts the head-averaged maps are compared.
    """
    student, teacher = _match_heads(student_attn, teacher_attn.detach())
    batch, _, seq, _ = student.shape
    keep = _token_mask(mask, batch, seq, student)
    pairs = (keep[:, :, None] & keep[:, None, :])[:, None]  # (batch, 1, seq, seq)
    sq = (student - teacher).pow(2)  # (batch, heads, seq, seq)
    return _masked_mean(sq, pairs.expand_as(sq))


def attention_kl(student_attn: Tensor, teacher_attn: Tensor, mask: Tensor | None = None) -> Tensor:
    """MiniLM's self-attention distribution transfer (Wang et al. 2020, eq. 5): KL(A_t || A_s).

    ``(batch, heads, seq, seq)`` attention probabilities; KL of each teacher row against the
    student row over valid keys, averaged over heads and valid queries. With different head
    counts the head-averaged distributions are compared.
    """
    student, teacher = _match_heads(student_attn, teacher_attn.detach())
    batch, heads, seq, _ = student.shape
    keep = _token_mask(mask, batch, seq, student)
    kl = _kl_probs_rows(student, teacher, keep[:, None, None, :])  # (batch, heads, seq)
    queries = keep[:, None, :].expand(batch, heads, seq)
    return _masked_mean(kl, queries)


def value_relation_kl(
    student_values: Tensor,
    teacher_values: Tensor,
    mask: Tensor | None = None,
    relation_heads: int = 12,
) -> Tensor:
    """MiniLM's value-relation transfer (Wang et al. 2020, eq. 7): KL(VR_t || VR_s).

    ``student_values``: ``(batch, seq, d_s)``, ``teacher_values``: ``(batch, seq, d_t)``,
    the last layer's value projections (before splitting into attention heads). Each is
    split into ``relation_heads`` heads of width d/relation_heads (so d_s and d_t may
    differ); VR = softmax(V V^T / sqrt(d_head)) over valid keys, ``(batch, heads, seq, seq)``.
    The KL is averaged over heads and valid queries.
    """
    s = _relation_logits(student_values, relation_heads)
    t = _relation_logits(teacher_values.detach(), relation_heads)
    if s.shape != t.shape:
        raise ValueError(f"student values {tuple(student_values.shape)} vs teacher {tuple(teacher_values.shape)} differ in (batch, seq)")
    batch, heads, seq, _ = s.shape
    keep = _token_mask(mask, batch, seq, s)
    kl = _kl_rows(s, t, keep[:, None, None, :])  # (batch, heads, seq)
    queries = keep[:, None, :].expand(batch, heads, seq)
    return _masked_mean(kl, queries)


def _relation_logits(values: Tensor, relation_heads: int) -> Tensor:
    """Scaled dot products V_h V_h^T / sqrt(d_head) per relation head: ``(batch, heads, seq, seq)``."""
    batch, seq, width = values.shape
    if relation_heads < 1 or width % relation_heads:
        raise ValueError(f"value width {width} is not divisible by relation_heads={relation_heads}")
    d_head = width // relation_heads
    v = values.reshape(batch, seq, relation_heads, d_head).transpose(1, 2)  # (batch, heads, seq, d_head)
    return v @ v.transpose(-1, -2) / math.sqrt(d_head)


# ---------------------------------------------------------------------------- sentence embeddings


def sentence_embedding_mse(
    student_embeddings: Tensor, teacher_embeddings: Tensor, projection: nn.Module | None = None
) -> Tensor:
    """MSE between student and teacher sentence embeddings (Reimers & Gurevych 2020, "Making
    Monolingual Sentence Embeddings Multilingual using Knowledge Distillation", eq. 1).

    ``student_embeddings``: ``(batch, d_s)``; ``teacher_embeddings``: ``(batch, d_t)``, the
    pooled vectors before any normalisation (so the student learns their scale too). The
    mean runs over sentences and features; ``projection`` maps d_s to d_t when they differ.
    """
    student = _project(student_embeddings, teacher_embeddings, projection)
    return F.mse_loss(student, teacher_embeddings.detach())


def sentence_embedding_cosine(
    student_embeddings: Tensor, teacher_embeddings: Tensor, projection: nn.Module | None = None
) -> Tensor:
    """Mean of 1 - cos(e_s, e_t) over sentences: the direction that cosine similarity reads.

    ``(batch, d_s)`` vs ``(batch, d_t)``; 0 when every student embedding points where its
    teacher's does, whatever their lengths.
    """
    student = _project(student_embeddings, teacher_embeddings, projection)
    cos = F.cosine_similarity(student, teacher_embeddings.detach(), dim=-1, eps=1e-8)  # (batch,)
    return (1.0 - cos).mean()


def sentence_similarity_mse(student_embeddings: Tensor, teacher_embeddings: Tensor) -> Tensor:
    """MSE between the in-batch cosine-similarity matrices of student and teacher sentence embeddings.

    The relational form of similarity-preserving distillation (Tung & Mori 2019, "Similarity-Preserving Knowledge
    Distillation", with cosines for their row-normalised Gram matrix): each side is compared only with itself,
    S_ij = cos(e_i, e_j), ``(batch, batch)``, so the widths may differ — ``student_embeddings``: ``(batch, d_s)``,
    ``teacher_embeddings``: ``(batch, d_t)``. The mean runs over the batch·(batch - 1) pairs i != j (the diagonal is
    1 on both sides); 0, still differentiable, for a batch of one sentence.
    """
    if student_embeddings.shape[0] != teacher_embeddings.shape[0]:
        raise ValueError(f"student {tuple(student_embeddings.shape)} and teacher {tuple(teacher_embeddings.shape)} "
                         "differ in batch")
    student = F.normalize(student_embeddings, dim=-1, eps=1e-8)
    teacher = F.normalize(teacher_embeddings.detach(), dim=-1, eps=1e-8)
    batch = student.shape[0]
    pairs = ~torch.eye(batch, dtype=torch.bool, device=student.device)  # (batch, batch): i != j
    sq = (student @ student.T - teacher @ teacher.T).pow(2)  # (batch, batch)
    return _masked_mean(sq, pairs)
