"""Distillation's loss terms, chosen by name: the registry beside the pure losses of :mod:`compress.distill.losses`.

A term reads one batch's :class:`Step` (the student's and the teacher's :class:`Outputs`,
the batch, the mask, the layer map, the projections) and returns a scalar; its weight
comes from :class:`LossWeights` and the other active terms:

=============  =================================================================  ============
term           what                                                               paper
=============  =================================================================  ============
``kd``         soft-target KL at temperature T, x T² (MSE on a score; a sigmoid    Hinton 2015,
               per label for multi-label; per token for tags; start/end KL for     DistilBERT
               SQuAD, over the positions the teacher scores)
``hard``       the task loss on gold labels (mixed with ``kd`` by alpha); rows
               without one are skipped
``hidden``     MSE between mapped hidden states, learned projection if widths      TinyBERT
               differ
``embedding``  MSE between embedding-layer outputs                                 TinyBERT
``attention``  MSE between mapped attention maps                                   TinyBERT
``cosine``     1 - cos between last hidden states                                  DistilBERT
``minilm``     last-layer attention KL + value-relation KL                         MiniLM
=============  =================================================================  ============

Which soft and hard loss ``kd`` and ``hard`` use is the task kind's (``TaskKind.soft_loss`` /
``hard_loss``, keys of :data:`SOFT_LOSSES` / :data:`HARD_LOSSES`), or masked-LM targets in
general distillation (``MLM``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from compress.distill import losses as L
from compress.core.registry import Registry
from compress.core.data.tasks import TaskKind
# The term names and their weights are options, apart from torch (compress.distill.config); the registry is here.
from compress.distill.config import INTERMEDIATE_TERMS, PREDICTION_TERMS, LossWeights  # noqa: F401

MLM = "mlm"  # the kind of a general-distillation batch with masked-LM targets


ENCODER = "encoder"  # the kind of a general-distillation batch without targets (MiniLM-style terms)


Kind = TaskKind | str  # what a batch is: the task's TaskKind, or MLM / ENCODER in general distillation


@dataclass
class Outputs:
    """What a forward pass produced, for the loss terms."""

    logits: dict[str, torch.Tensor] = field(default_factory=dict)  # the kind's outputs: logits | start_logits, end_logits
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)  # hidden-state index -> (batch, seq, d)
    attentions: dict[int, torch.Tensor] = field(default_factory=dict)  # layer (1-based) -> (batch, heads, seq, seq)
    values: torch.Tensor | None = None  # last layer's value projection (batch, seq, heads*d)


@dataclass
class Step:
    """Everything one loss term may read for one batch."""

    kind: Kind
    student: Outputs
    teacher: Outputs
    batch: dict[str, torch.Tensor]
    mask: torch.Tensor  # (batch, seq) 1 for real tokens
    pairs: list[tuple[int, int]]  # (student, teacher) hidden-state indices, 0 = embeddings
    projections: nn.ModuleDict
    loss: LossWeights  # the terms read the temperature and relation heads; the weights are applied by the caller
    # This process's gold rows over the processes' mean count of them (1.0 in one process): data-parallel
    # training averages the processes' gradients, so a mean over each process's own gold rows must be
    # reweighted by it for the step to average over every gold row of the global batch.
    gold_share: float = 1.0


@dataclass(frozen=True)
class Term:
    needs: frozenset[str]  # teacher outputs: logits, hidden, attentions, values
    weight: Callable[[LossWeights, tuple[str, ...]], float]
    compute: Callable[[Step], torch.Tensor]


TERMS: Registry[Term] = Registry("distillation loss")


# The kd term's loss, by name: (student outputs, teacher outputs, mask (batch, seq), temperature) -> scalar.
SOFT_LOSSES: Registry[Callable[..., torch.Tensor]] = Registry("soft-target loss")


# The hard term's loss, by name: (student outputs, batch with the gold targets) -> scalar.
HARD_LOSSES: Registry[Callable[..., torch.Tensor]] = Registry("hard-target loss")


@SOFT_LOSSES.register("kl")
def _soft_kl(s, t, mask, temperature: float) -> torch.Tensor:
    return L.soft_target_kl(s["logits"], t["logits"], temperature=temperature)


@SOFT_LOSSES.register("span_kl")
def _soft_span_kl(s, t, mask, temperature: float) -> torch.Tensor:
    # Start and end logits are (batch, seq): padded positions leave both softmaxes, and so do the positions where the
    # teacher's logit is -inf (a teacher that tokenises apart scores only the boundaries both tokenizations share).
    return L.partial_span_kd(s["start_logits"], s["end_logits"], t["start_logits"], t["end_logits"], mask,
                             temperature=temperature)


@SOFT_LOSSES.register("mse")
def _soft_mse(s, t, mask, temperature: float) -> torch.Tensor:
    return L.logits_mse(s["logits"], t["logits"])  # a score has no temperature


@SOFT_LOSSES.register("sigmoid_kl")
def _soft_sigmoid_kl(s, t, mask, temperature: float) -> torch.Tensor:
    return L.sigmoid_kd(s["logits"], t["logits"], temperature=temperature)  # one yes/no per label


@SOFT_LOSSES.register("token_kl")
def _soft_token_kl(s, t, mask, temperature: float) -> torch.Tensor:
    # (batch, seq, labels): every real token, word pieces after a word's first included.
    return L.token_kd(s["logits"], t["logits"], mask, temperature=temperature)


@HARD_LOSSES.register("cross_entropy")
def _hard_ce(s, batch) -> torch.Tensor:
    return L.hard_label_ce(s["logits"], batch["labels"])


@HARD_LOSSES.register("mse")
def _hard_mse(s, batch) -> torch.Tensor:
    return L.hard_label_mse(s["logits"], batch["labels"])


@HARD_LOSSES.register("bce")
def _hard_bce(s, batch) -> torch.Tensor:
    return L.hard_label_bce(s["logits"], batch["labels"])


@HARD_LOSSES.register("token_cross_entropy")
def _hard_token_ce(s, batch) -> torch.Tensor:
    return L.token_ce(s["logits"], batch["labels"])  # gold tags on first pieces only; -100 elsewhere


@HARD_LOSSES.register("span_cross_entropy")
def _hard_span_ce(s, batch) -> torch.Tensor:
    start = L.hard_label_ce(s["start_logits"], batch["start_positions"])
    return (start + L.hard_label_ce(s["end_logits"], batch["end_positions"])) / 2


@HARD_LOSSES.register("mlm_cross_entropy")
def _hard_mlm_ce(s, batch) -> torch.Tensor:
    # MLM logits exist only at the selected positions: (n_selected, vocab) against their labels.
    return L.mlm_ce(s["logits"], batch["labels"][batch["labels"] != -100])


def _loss_names(kind: Kind) -> tuple[str, str]:
    """(soft, hard) loss names for a batch of ``kind``, keys of SOFT_LOSSES and HARD_LOSSES."""
    if kind == MLM:  # general distillation: KL over the vocabulary, masked-LM targets
        return "kl", "mlm_cross_entropy"
    return kind.soft_loss, kind.hard_loss


def _kd(step: Step) -> torch.Tensor:
    soft = SOFT_LOSSES.get(_loss_names(step.kind)[0])
    return soft(step.student.logits, step.teacher.logits, step.mask, step.loss.temperature)


def _hard(step: Step) -> torch.Tensor:
    """The task loss on the batch's rows with a gold label (augmented / transfer rows have none); 0 when none has."""
    hard = HARD_LOSSES.get(_loss_names(step.kind)[1])
    gold = step.batch.get("gold")
    if gold is None:
        return hard(step.student.logits, step.batch)
    if bool(gold.all()):
        return hard(step.student.logits, step.batch) * step.gold_share
    if not bool(gold.any()):
        return sum(v.sum() for v in step.student.logits.values()) * 0.0  # keeps the graph (DDP wants every output used)
    rows = gold.to(next(iter(step.student.logits.values())).device)
    logits = {k: v[rows] for k, v in step.student.logits.items()}
    batch = {k: v[rows] for k, v in step.batch.items() if torch.is_tensor(v) and v.shape[:1] == gold.shape}
    return hard(logits, batch) * step.gold_share


def _hidden(step: Step) -> torch.Tensor:
    pairs = [(si, ti) for si, ti in step.pairs if si > 0]
    proj = step.projections["hidden"] if "hidden" in step.projections else None
    return sum(L.hidden_mse(step.student.hidden[si], step.teacher.hidden[ti], step.mask, proj) for si, ti in pairs) / len(pairs)


def _embedding(step: Step) -> torch.Tensor:
    proj = step.projections["embedding"] if "embedding" in step.projections else None
    return L.embedding_mse(step.student.hidden[0], step.teacher.hidden[0], step.mask, proj)


def _attention(step: Step) -> torch.Tensor:
    pairs = [(si, ti) for si, ti in step.pairs if si > 0]
    return sum(L.attention_mse(step.student.attentions[si], step.teacher.attentions[ti], step.mask) for si, ti in pairs) / len(pairs)


def _cosine(step: Step) -> torch.Tensor:
    s_last, t_last = max(step.student.hidden), max(step.teacher.hidden)
    proj = step.projections["hidden"] if "hidden" in step.projections else None
    return L.cosine_hidden(step.student.hidden[s_last], step.teacher.hidden[t_last], step.mask, proj)


def _minilm(step: Step) -> torch.Tensor:
    s_last, t_last = max(step.student.attentions), max(step.teacher.attentions)
    attention = L.attention_kl(step.student.attentions[s_last], step.teacher.attentions[t_last], step.mask)
    relation = L.value_relation_kl(step.student.values, step.teacher.values, step.mask, relation_heads=step.loss.relation_heads)
    return attention + relation


# A term's weight reads (loss weights, the active terms).
TERMS.register("kd", Term(frozenset({"logits"}), lambda w, t: w.alpha if "hard" in t else 1.0, _kd))
TERMS.register("hard", Term(frozenset(), lambda w, t: 1 - w.alpha if "kd" in t else 1.0, _hard))
TERMS.register("hidden", Term(frozenset({"hidden"}), lambda w, t: w.hidden_weight, _hidden))
TERMS.register("embedding", Term(frozenset({"hidden"}), lambda w, t: w.embedding_weight, _embedding))
TERMS.register("attention", Term(frozenset({"attentions"}), lambda w, t: w.attention_weight, _attention))
TERMS.register("cosine", Term(frozenset({"hidden"}), lambda w, t: w.cosine_weight, _cosine))
TERMS.register("minilm", Term(frozenset({"attentions", "values"}), lambda w, t: w.minilm_weight, _minilm))


def needs_of(terms: tuple[str, ...]) -> set[str]:
    return set().union(*(TERMS.get(t).needs for t in terms)) if terms else set()
