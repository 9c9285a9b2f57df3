"""Knowledge distillation from a fine-tuned teacher into a smaller student.

``distill(teacher, out, cfg)`` builds the student (from chosen teacher layers, at random,
or from any pretrained directory), then trains it on the task with a weighted sum of
loss terms chosen by name:

=============  =================================================================  ============
term           what                                                               paper
=============  =================================================================  ============
``kd``         soft-target KL at temperature T, x T² (MSE on logits for STS-B;     Hinton 2015,
               start/end KL for SQuAD)                                             DistilBERT
``hard``       the task loss on gold labels (mixed with ``kd`` by alpha)
``hidden``     MSE between mapped hidden states, learned projection if widths      TinyBERT
               differ
``embedding``  MSE between embedding-layer outputs                                 TinyBERT
``attention``  MSE between mapped attention maps                                   TinyBERT
``cosine``     1 - cos between last hidden states                                  DistilBERT
``minilm``     last-layer attention KL + value-relation KL                         MiniLM
=============  =================================================================  ============

When only ``kd``/``hard`` are used (or hidden states are cached too), the teacher runs
once over the training set and its outputs are cached on disk (``compress.teacher_cache``);
otherwise it runs alongside the student. TinyBERT's order (intermediate layers first,
then the prediction layer) is ``two_stage``. Rows without gold labels can be added to the
training set (``--augment N``: TinyBERT's word-replacement copies; ``--transfer-text``:
unlabelled text in the task's format; both from :mod:`compress.augment`): they are
marked ``gold = 0``, the teacher's outputs are their only targets and the ``hard`` term
skips them; with ``two_stage`` the prediction stage reads them (the intermediate one too
with ``--augment-intermediate``).

The steps every distillation takes (open the teacher, build the student, train keeping the
best evaluation, record and write) are public here for the two entry points without a
task: :mod:`compress.distill_general` (an encoder on a text corpus) and
:mod:`compress.distill_embedding` (a sentence-embedding model on unlabelled sentences).
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import datasets
import torch
from torch import nn

from compress import losses as L
from compress.augment import AUTO_MAX_EXAMPLES, AugmentConfig, EmbeddingNeighbours, MaskedLMCandidates, augmented_rows, transfer_rows
from compress.core.artifacts import (
    check_output,
    compression_record,
    dir_hash,
    load_config,
    load_tokenizer,
    read_compression,
    read_metrics,
    require_torch_weights,
    save_model_dir,
    saved_head,
    utc_now,
)
from compress.core.config import flat_keywords, option
from compress.core.data import (
    DataSource,
    TaskData,
    collate,
    load_dev_splits,
    load_split,
    load_test_split,
    load_train_split,
    train_features,
)
from compress.core.errors import CompressError
from compress.core.registry import Registry
from compress.core.runtime import load_model
from compress.core.structure import (
    Shape,
    base_model,
    capture,
    count_parameters,
    encoder_layers,
    mlm_head,
    model_inputs,
    value_projection,
)
from compress.core.resolve import resolve_task, task_fields
from compress.core.tasks import GLUE_TASKS, MULTI_LABEL, REGRESSION, SPAN, Task, TaskKind, get_task, is_kind, task_choices
from compress.core.train import (
    Phase,
    TrainConfig,
    TrainResult,
    is_main_process,
    load_weights,
    main_process_first,
    prepare_work_dir,
    train_phases,
    work_dir_for,
)
from compress.eval.evaluate import dev_evaluator, format_table, output_to_task_labels, split_records, test_records
from compress.eval.metrics import chance_check
from compress.students.init import TEACHER_METHODS, init_student, load_pretrained_student
from compress.students.layer_map import parse_layer_map
from compress.students.presets import STUDENT_SHAPES, resolve_shape
from compress.teacher.corpus import read_documents
from compress.teacher.presets import resolve_model
from compress.teacher_cache import default_cache_dir, load_or_build

PREDICTION_TERMS = ("kd", "hard")
MLM = "mlm"  # the kind of a general-distillation batch with masked-LM targets
ENCODER = "encoder"  # the kind of a general-distillation batch without targets (MiniLM-style terms)
Kind = TaskKind | str  # what a batch is: the task's TaskKind, or MLM / ENCODER in general distillation
INTERMEDIATE_TERMS = ("hidden", "embedding", "attention", "cosine", "minilm")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LossWeights:
    """How the loss terms are weighted and mapped (shared by task and general distillation)."""

    alpha: float = option(0.5, "weight of kd against hard (mlm in general distillation): alpha*kd + (1-alpha)*hard")
    temperature: float = option(2.0, "softmax temperature of the kd term (the KL is multiplied by T^2)")
    hidden_weight: float = option(1.0, "weight of the hidden term")
    embedding_weight: float = option(1.0, "weight of the embedding term")
    attention_weight: float = option(1.0, "weight of the attention term")
    cosine_weight: float = option(1.0, "weight of the cosine term")
    minilm_weight: float = option(1.0, "weight of the minilm term")
    relation_heads: int = option(12, "minilm: heads the value relations are split into")
    layer_map: str = option("uniform", "student<-teacher layers for intermediate terms: uniform, last, 2,4,6 or 1:2,2:4")

    def validate(self) -> None:
        if not 0 <= self.alpha <= 1:
            raise CompressError(f"--alpha must be in [0, 1], got {self.alpha}")
        if self.temperature <= 0:
            raise CompressError(f"--temperature must be positive, got {self.temperature}")
        if self.relation_heads < 1:
            raise CompressError(f"--relation-heads must be at least 1, got {self.relation_heads}")


def _distill_defaults() -> TrainConfig:
    return TrainConfig(lr=1e-4, epochs=3, batch_size=32, warmup_ratio=0.1)


# --init of every distillation stage (task, general, embedding)
INIT_HELP = ("student initialisation: teacher (its layers, cut to a narrower student's width), teacher-layers, teacher-slices, "
             "random (for a student wider than its teacher), or a pretrained model DIR")


@flat_keywords
@dataclass(frozen=True)
class DistillConfig:
    task: str = option("", "task to distil on (default: the teacher's own task; a kind of your own data with "
                       "--train-file for a teacher that records none)", choices=task_choices)
    student: str = option("6L-384", "student shape: a preset or LAYERSL-HIDDEN[-FFN]", choices=STUDENT_SHAPES.names, other="LAYERSL-HIDDEN[-FFN]")
    heads: int | None = option(None, "attention heads per layer of the student (a size; overrides --student's)")
    layers: int | None = option(None, "layers of the student (a size; overrides --student's)")
    hidden: int | None = option(None, "hidden width of the student (a size; overrides --student's; FFN then defaults to 4x)")
    ffn: int | None = option(None, "FFN width of the student (a size; overrides --student's)")
    init: str = option("teacher", INIT_HELP + " (a distill-general student of the same shape: TinyBERT's path, with "
                       "--two-stage and --losses kd,hard,hidden,attention)")
    init_layers: tuple[int, ...] = option((), "teacher layers (0-based) copied into the student (default: evenly spaced)", metavar="L[,...]")
    init_from: str | None = option(None, "cut the student from this encoder DIR instead of the teacher (--init teacher, "
                                   "teacher-layers or teacher-slices); its task head starts new", metavar="DIR")
    losses: tuple[str, ...] = option(("kd", "hard"), "loss terms: the prediction terms kd, hard and the intermediate terms "
                                     "hidden, embedding, attention, cosine, minilm (they match the teacher's hidden states, "
                                     "attention or embeddings, at a cost in training time)", metavar="TERM[,...]")
    loss: LossWeights = field(default_factory=LossWeights)
    two_stage: bool = option(False, "TinyBERT's order: train on the intermediate terms first (--intermediate-epochs), then on "
                             "the prediction terms; --losses needs some of each")
    intermediate_epochs: int | None = option(None, "epochs of the intermediate stage (default: --epochs)")
    cache: bool = option(True, "cache teacher outputs on disk when the terms allow (teacher runs once)")
    cache_hidden: bool = option(False, "also cache the mapped teacher hidden states (float16 on disk)")
    cache_dir: str | None = option(None, "where teacher outputs are cached (default: $COMPRESS_CACHE or ~/.cache/compress)", metavar="DIR")
    resume: bool = option(False, "continue an interrupted run from its last checkpoint into the same --out")
    extra_data: AugmentConfig = field(default_factory=AugmentConfig)
    data: TaskData = field(default_factory=TaskData)
    train: TrainConfig = field(default_factory=_distill_defaults)

    def validate(self) -> None:
        if self.task and not is_kind(self.task):
            check_extra_data(get_task(self.task), self)
        if self.extra_data.active:
            if "kd" not in self.losses and not set(self.losses) & set(INTERMEDIATE_TERMS):
                raise CompressError("augmented and transfer examples have no gold labels, only teacher targets: "
                                    "add kd (or an intermediate term) to --losses")
        for term in self.losses:
            TERMS.get(term)
        if not self.losses:
            raise CompressError("--losses is empty; pass e.g. --losses kd,hard")
        if self.two_stage and not (set(self.losses) & set(INTERMEDIATE_TERMS) and set(self.losses) & set(PREDICTION_TERMS)):
            raise CompressError("--two-stage needs intermediate terms (hidden, attention, ...) and prediction terms (kd, hard)")
        if self.init_from and self.init not in TEACHER_METHODS:
            raise CompressError(f"--init-from cuts the student from another encoder: use it with --init {', '.join(TEACHER_METHODS)}, "
                                f"not --init {self.init}")


def check_extra_data(task: Task, cfg: DistillConfig) -> None:
    """Refuse augmented or transfer rows where they cannot be made: spans (SQuAD) and tagged words (NER).

    TinyBERT's word replacement would change the words an entity tag belongs to (and transfer
    text has no words aligned with tags), so a token-classification task is refused rather
    than given rows whose teacher targets sit on other words.
    """
    if not cfg.extra_data.active or not task.behaviour.per_token:
        return
    what = "answers are spans" if task.kind == SPAN else "tags belong to words that word replacement would change"
    raise CompressError(f"--augment/--transfer-text make sentence-task examples; {task.display}'s {what}: "
                        "pass --augment 0 and no --transfer-text")


# ---------------------------------------------------------------------------- loss terms


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
    # Start and end logits are (batch, seq): padded positions leave both softmaxes.
    return L.span_kd(s["start_logits"], s["end_logits"], t["start_logits"], t["end_logits"], mask, temperature=temperature)


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


# ---------------------------------------------------------------------------- forward passes


def run_model(model, batch: dict[str, torch.Tensor], needs: set[str], hidden_index: set[int], kind: Kind) -> Outputs:
    """Forward pass returning the outputs the loss terms need (hooks only while it runs)."""
    inputs = model_inputs(model, batch)
    watch = {"values": value_projection(model, len(encoder_layers(model)) - 1)} if "values" in needs else {}
    flags = {"output_hidden_states": "hidden" in needs, "output_attentions": "attentions" in needs}
    with capture(watch) as seen:
        out = (base_model(model) if kind == MLM else model)(**inputs, **flags)  # MLM: the head runs below
    result = Outputs(logits=_prediction_logits(model, out, batch, kind), values=seen.get("values"))
    if "hidden" in needs:
        result.hidden = {i: out.hidden_states[i] for i in hidden_index}
    if "attentions" in needs:
        result.attentions = {i + 1: a for i, a in enumerate(out.attentions)}
    return result


def _prediction_logits(model, out, batch: dict[str, torch.Tensor], kind: Kind) -> dict[str, torch.Tensor]:
    """The outputs the kd/hard terms read: the kind's outputs, MLM logits, or none (ENCODER)."""
    if kind == MLM:
        # MLM logits only where a token was selected: (n_selected, vocab), not (batch, seq, vocab).
        selected = batch["labels"] != -100
        return {"logits": mlm_head(model)(out.last_hidden_state[selected])}
    if kind == ENCODER:
        return {}
    return {name: getattr(out, name) for name in kind.outputs}


class Distiller(nn.Module):
    """The trainable part: the student plus projections for width-mismatched hidden terms.

    Its forward runs the student, so data-parallel wrappers see every trainable use.
    """

    def __init__(self, student: nn.Module, projections: nn.ModuleDict):
        super().__init__()
        self.student = student
        self.projections = projections

    def forward(self, batch, needs: set[str], hidden_index: set[int], kind: Kind) -> Outputs:
        return run_model(self.student, batch, needs, hidden_index, kind)


def make_projections(student, teacher, terms: tuple[str, ...]) -> nn.ModuleDict:
    """Linear maps student width -> teacher width (TinyBERT's W_h, W_e) when the widths differ."""
    ds, dt = student.config.hidden_size, teacher.config.hidden_size
    mods = nn.ModuleDict()
    if ds != dt:
        if set(terms) & {"hidden", "cosine"}:
            mods["hidden"] = nn.Linear(ds, dt)
        if "embedding" in terms:
            mods["embedding"] = nn.Linear(ds, dt)
    return mods


def _teacher_layers(pairs: list[tuple[int, int]], needs: set[str]) -> set[int]:
    """Teacher hidden-state indices the hidden terms read (none when no term reads hidden states)."""
    return {t for _, t in pairs} if "hidden" in needs else set()


def make_loss_fn(kind: Kind, terms: tuple[str, ...], loss: LossWeights, teacher_model, cache, pairs: list[tuple[int, int]]):
    """``loss_fn(model, batch) -> (loss, logs)`` for the training loop: the weighted sum of ``terms``, each logged."""
    needs = needs_of(terms)
    teacher_hidden = _teacher_layers(pairs, needs)
    student_hidden = {s for s, _ in pairs} if "hidden" in needs else set()
    if "cosine" in terms:  # the last hidden states of both
        student_hidden |= {max(s for s, _ in pairs)}
        teacher_hidden |= {max(t for _, t in pairs)}
    weights = {t: TERMS.get(t).weight(loss, terms) for t in terms}
    student_needs = needs | {"logits"}

    def loss_fn(model, batch):
        index = batch.pop("cache_index", None)  # (batch,) rows of the teacher cache, in task distillation
        teacher = _teacher_outputs(kind, teacher_model, cache, batch, index, needs, teacher_hidden)
        student = model(batch, student_needs, student_hidden, kind)
        inner = model.module if hasattr(model, "module") else model  # DDP wraps the Distiller
        step = Step(kind, student, teacher, batch, batch["attention_mask"], pairs, inner.projections, loss,
                    gold_share=_gold_share(batch.get("gold")) if "hard" in terms else 1.0)
        parts = {t: TERMS.get(t).compute(step) for t in terms}
        total = sum(weights[t] * parts[t] for t in terms)
        return total, {f"loss_{t}": v.detach() for t, v in parts.items()}

    return loss_fn


def _gold_share(gold: torch.Tensor | None) -> float:
    """This process's gold rows over the mean count across processes (see ``Step.gold_share``); 1.0 alone."""
    if gold is None or not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return 1.0
    counts = torch.tensor([float(gold.sum()), 1.0], device=gold.device)  # (gold rows, processes), summed over them
    torch.distributed.all_reduce(counts)
    return float(gold.sum()) / float(counts[0] / counts[1]) if counts[0] > 0 else 0.0


def _teacher_outputs(kind: Kind, teacher_model, cache, batch, index, needs: set[str], hidden_index: set[int]) -> Outputs:
    """The teacher's outputs for a batch: from the cache when it holds them, else a no-grad forward."""
    if cache is not None:
        return _cached_outputs(kind, cache, batch, index, needs)
    with torch.no_grad():
        return run_model(teacher_model, batch, needs | {"logits"}, set(hidden_index), kind)


def _cached_outputs(kind: TaskKind, cache, batch, index: torch.Tensor, needs: set[str]) -> Outputs:
    """The cached teacher outputs (and hidden states) of the batch's rows, on the batch's device."""
    seq, device = batch["input_ids"].shape[1], batch["input_ids"].device
    logits = {}
    for name in kind.outputs:
        values = cache.batch_outputs(index.tolist(), name).to(device)
        if kind.per_token:  # (batch, longest cached[, C]) -> (batch, seq[, C]): cut, or pad when the batch is padded further
            more = max(0, seq - values.shape[1])
            values = values[:, :seq]
            if values.dim() == 3:  # per-token logits: the padding is masked out of every term
                values = torch.nn.functional.pad(values, (0, 0, 0, more))
            else:  # start/end logits: padding must lose every softmax
                values = torch.nn.functional.pad(values, (0, more), value=-1e4)
        logits[name] = values
    result = Outputs(logits=logits)
    if "hidden" in needs:
        stacked = cache.batch_hidden(index.tolist(), seq).to(device)  # (layers, batch, seq, hidden)
        result.hidden = {layer: stacked[i] for i, layer in enumerate(cache.layers)}
    return result


# ---------------------------------------------------------------------------- steps every entry point takes


@dataclass
class Teacher:
    """The teacher of a run: its directory, content hash, tokenizer and loaded model."""

    dir: Path
    hash: str  # dir_hash: keys the teacher cache and a resumable run
    tokenizer: object
    model: nn.Module


@dataclass
class Student:
    """A student built from its teacher, and how the two line up."""

    model: nn.Module
    init: dict  # how it was initialised (compression.json "init")
    shape: Shape  # as recorded: with --init DIR, the shape DIR holds (not the --student preset)
    pairs: list[tuple[int, int]]  # (student, teacher) hidden-state indices, 0 = embeddings


def check_out(out: str | Path, cfg, overwrite: bool, *inputs) -> Path:
    """The output directory (see :func:`check_output`: never an input, never over a folder without --overwrite)."""
    return check_output(out, overwrite, inputs=(inputs, cfg), resume=cfg.resume)


def open_teacher(teacher_dir: Path, head: str, needs: set[str]) -> Teacher:
    """Load the teacher with ``head``; eager attention when a term reads attention maps."""
    tokenizer = load_tokenizer(teacher_dir)
    model = load_model(teacher_dir, head=head, attn_implementation="eager" if "attentions" in needs else None)
    return Teacher(teacher_dir, dir_hash(teacher_dir), tokenizer, model)


def build_student(teacher: Teacher, cfg, needs: set[str], layer_map: str = "uniform", source: str | None = None) -> Student:
    """The ``cfg.student`` shape (or ``--init DIR``), initialised as ``cfg.init`` says, and its ``layer_map``.

    ``cfg``: any distillation config (they share ``student``, ``heads``, ``layers``, ``hidden``,
    ``ffn``, ``init``, ``init_layers`` and ``train``).

    ``source`` (``--init-from DIR``): the encoder a teacher method cuts the student from instead of the teacher
    (loaded with the teacher's head type and labels, the head new)."""
    shape = resolve_shape(cfg.student, layers=cfg.layers, hidden=cfg.hidden, heads=cfg.heads, ffn=cfg.ffn)
    method, pretrained = (cfg.init, None) if cfg.init in (*TEACHER_METHODS, "random") else ("pretrained", cfg.init)
    cut_from = teacher.model
    if source:
        # its new head, copied into the student: the same for the same --seed
        cut_from = load_pretrained_student(teacher.model, source, seed=cfg.train.seed)[0]
    try:
        model, info = init_student(cut_from, shape, method=method, layers=list(cfg.init_layers) or None,
                                   seed=cfg.train.seed, pretrained=pretrained)
    except CompressError as err:
        if not source:
            raise
        raise CompressError(f"--init-from {source} stands in for the teacher here: {err}") from None
    if source:
        info = {**info, "from": str(source)}
    if "attentions" in needs:  # output_attentions needs the eager implementation
        model.config._attn_implementation = "eager"
    c = model.config
    if pretrained is not None:  # --init DIR: the student is whatever DIR holds, not the --student preset
        shape = Shape(c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.intermediate_size)
    pairs = parse_layer_map(layer_map, c.num_hidden_layers, teacher.model.config.num_hidden_layers)
    return Student(model, info, shape, pairs)


def device_for(teacher: Teacher, name: str) -> torch.device:
    """The device to train on (``auto``: CUDA when there is one); the teacher moves there."""
    device = torch.device("cuda" if name == "cuda" or (name == "auto" and torch.cuda.is_available()) else "cpu")
    teacher.model.to(device)
    return device


def train_keeping_best(wrapper: Distiller, phase: Phase, cfg: TrainConfig, **options) -> TrainResult:
    """Train through ``phase`` (options: see ``train_phases``); rank 0 then holds the best evaluated weights."""
    result = train_phases(wrapper, [phase], cfg, **options)
    if result.best_weights is not None and is_main_process():  # only rank 0 evaluated, so only it has them
        load_weights(wrapper, result.best_weights)
    return result


def distill_record(stage: str, cfg, teacher: Teacher, student: Student, **extra) -> dict:
    """compression.json of a distilled student (``cfg``: any distillation config): teacher, student shape, init and
    layer map, plus ``extra``."""
    extra = {
        "teacher": {"path": str(teacher.dir), "hash": teacher.hash}, "student_shape": student.shape.__dict__,
        "init": student.init, "layer_map": [list(p) for p in student.pairs], "params": count_parameters(student.model),
        **extra,
    }
    return compression_record(stage=stage, method="+".join(cfg.losses), config=cfg, parent=teacher.dir,
                              seed=cfg.train.seed, extra=extra)


def write_student(student: Student, out: Path, teacher: Teacher, record: dict, metrics: list[dict], *,
                   resume: bool, overwrite: bool, work: Path, files: dict[str, Path] | None = None) -> Path:
    """Save the student, then drop the checkpoints."""
    save_model_dir(student.model, out, tokenizer=teacher.tokenizer, record=record,
                   overwrite=overwrite, metrics=metrics, files=files)
    shutil.rmtree(work, ignore_errors=True)
    return out


# ---------------------------------------------------------------------------- task distillation


@dataclass
class _TaskData:
    """The task's training features and dev splits, as distillation reads them.

    ``features`` holds the gold training rows first, then the augmented and transfer
    rows; its ``cache_index`` column is the row number (the teacher cache's row) and its
    ``gold`` column is 1 for a row with a gold label, 0 for one with teacher targets only.
    """

    features: object  # tokenised training set (datasets.Dataset)
    dev: dict  # dev split name -> raw examples
    n_train: int  # gold rows (the first n_train of features)
    max_length: int
    pad: Callable  # pads a list of features into a batch
    extra: dict = field(default_factory=dict)  # how the augmented / transfer rows were made (compression.json "extra_data")
    test: object = None  # the --test-file examples (datasets.Dataset), scored once the best student is kept

    def gold_only(self):
        return self.features.select(range(self.n_train))


def distill(teacher: str | Path, out: str | Path, cfg: DistillConfig, *, overwrite: bool = False,
            task: Task | None = None) -> Path:
    """Distil ``teacher`` into a ``cfg.student`` on its task; write the best dev student to ``out``.

    The task is ``task`` when a caller has resolved it, else what ``cfg.task`` (or the teacher) names.
    """
    out = check_out(out, cfg, overwrite, teacher)
    teacher_dir = require_torch_weights(resolve_model(teacher), "distillation (the teacher)")
    task = task or resolve_task(cfg.task, cfg.data.own, train_file=cfg.data.train_file, model=teacher_dir)
    check_extra_data(task, cfg)
    teach = open_teacher(teacher_dir, task.behaviour.head, needs_of(cfg.losses))
    _check_teacher(teach.model, teacher_dir, task)
    student = build_student(teach, cfg, needs_of(cfg.losses), cfg.loss.layer_map, source=cfg.init_from)
    data = _task_data(task, teach, student, cfg)
    device = device_for(teach, cfg.train.device)
    wrapper = Distiller(student.model, make_projections(student.model, teach.model, cfg.losses))
    evaluate = dev_evaluator(task, teach.tokenizer, data.dev, data.max_length, batch_size=cfg.data.eval_batch_size,
                             doc_stride=cfg.data.doc_stride)
    # The teacher's dev score, before any training: a teacher that is not fine-tuned for the task is said now.
    teacher_dev = _teacher_dev(teach, task, data.dev, evaluate) if is_main_process() else {}
    work = prepare_work_dir(work_dir_for(out), cfg.resume)
    trained = _train_stages(cfg, task, teach, student, wrapper, data, evaluate, work, device)
    if not is_main_process():
        return out
    metrics = _task_metrics(task, data, trained, teacher_dev, cfg)
    metrics += test_records(student.model, teach.tokenizer, task, data.test, cfg.data, data.max_length)
    record = distill_record("distill", cfg, teach, student, **task_fields(task), losses=list(cfg.losses), best=trained.best,
                     cache=trained.cache, extra_data=data.extra, teacher_check=teacher_dev["check"],
                     teacher_at_chance=teacher_dev["check"]["at_chance"])
    return write_student(student, out, teach, record, metrics, resume=cfg.resume, overwrite=overwrite, work=work)


def summarize(out: Path, cfg: DistillConfig, inputs: dict[str, Any]) -> tuple[str, list[str]]:
    """What ``compress distill`` prints: the dev results, then how much of the teacher's score the student keeps."""
    results = read_metrics(out)
    lines = [format_table([r for r in results if r.get("kind") == "eval"])]
    notes = []
    training = next((r for r in results if r.get("kind") == "training"), {})
    if training.get("extra_rows"):
        lines.append(f"trained on {training['n_train']} labelled examples + {training['extra_rows']} augmented / transfer "
                     "rows with teacher targets only")
    for r in results:
        if r.get("kind") == "retention" and r.get("ratio") is not None:
            lines.append(f"retention: {r['student']:.2f} / {r['teacher']:.2f} = {100 * r['ratio']:.1f}% of the teacher's {r['metric']}"
                         + teacher_flag(r))
        if r.get("kind") == "retention" and r.get("teacher_warning"):
            notes.append(f"warning: {r['teacher_warning']}")
    return "\n".join(lines), notes


def teacher_flag(record: dict) -> str:
    """What follows a score compared with a teacher that is not fine-tuned for the task ("" when it is)."""
    if record.get("teacher_at_chance"):
        return " -- TEACHER AT CHANCE: this ratio means nothing"
    return " -- TEACHER NOT FINE-TUNED FOR THE TASK" if record.get("teacher_warning") else ""


def teacher_problems(model_dir: Path, task) -> list[str]:
    """Signs in its files that ``model_dir`` is not fine-tuned for ``task``: no head for the task
    (a bare encoder, a sentence-transformers folder), a classifier of another width, another task recorded."""
    saved, head = saved_head(model_dir), task.behaviour.head
    problems = []
    if saved != head:
        what = "a sentence-transformers folder" if (model_dir / "modules.json").is_file() else f"a {saved} model"
        problems.append(f"it has no {head} head ({what}), so its head is random")
    elif task.behaviour.problem_type is not None and load_config(model_dir).num_labels != task.num_labels:
        problems.append(f"its classifier has {load_config(model_dir).num_labels} outputs, not {task.num_labels}, so a new random one is used")
    recorded = read_compression(model_dir).get("task")
    if recorded and _task_name(recorded) != task.name:
        problems.append(f"its compression.json says it was made for {recorded}")
    return problems


def _task_name(name: str) -> str:
    try:
        return get_task(name).name
    except CompressError:
        return name


def check_teacher_fit(model_dir: Path, task, metrics: dict | None, labels, *, role: str, advice: str) -> dict:
    """Whether ``model_dir`` looks fine-tuned for ``task`` (:func:`teacher_problems`, and its dev ``metrics``
    against :func:`compress.eval.metrics.chance_check` with the dev ``labels``); one warning line when not.

    Returns what the output records: ``{"task", "at_chance", "chance", "problems", "warning"}``.
    """
    problems = teacher_problems(model_dir, task)
    chance = chance_check(task, metrics, labels) if metrics else None
    if chance and chance["at_chance"]:
        problems.append(f"its dev {chance['metric']} {chance['value']:.2f} is at chance ({chance['rule']})")
    warning = None
    if problems:
        warning = f"{role} {model_dir} does not look fine-tuned for {task.display}: {'; '.join(problems)}. {advice}"
        log.warning(warning)
    return {"task": task.name, "at_chance": bool(chance and chance["at_chance"]), "chance": chance,
            "problems": problems, "warning": warning}


def dev_labels(dev: dict):
    """The gold labels of the first dev split (None for SQuAD, whose examples carry answers)."""
    ds = next(iter(dev.values()))
    return ds["label"] if "label" in ds.column_names else None


def _teacher_dev(teacher: Teacher, task, dev: dict, evaluate) -> dict:
    """The teacher's dev metrics (recorded in its metrics.json, else measured now) and the check of its fitness."""
    metrics = _teacher_metrics(task, read_metrics(teacher.dir))
    source = "metrics.json"
    if metrics is None:
        metrics, source = evaluate(teacher.model), "measured"
    check = check_teacher_fit(teacher.dir, task, metrics, dev_labels(dev), role="teacher", advice=(
        f"The student learns little from it and its retention means nothing; distil from a model fine-tuned on "
        f"{task.display} (compress teacher finetune)."))
    return {"metrics": metrics, "source": source, "check": check}


def _check_teacher(teacher_model, teacher_dir: Path, task) -> None:
    """Refuse a teacher whose outputs are not the task's labels (a classifier of another task)."""
    if task.behaviour.label_type is None:  # a span head: no labels to match
        return
    try:
        output_to_task_labels(teacher_model.config, task)
    except CompressError as err:
        raise CompressError(f"teacher {teacher_dir}: {err}; distil from a teacher fine-tuned on {task.display}") from None


def _task_data(task, teacher: Teacher, student: Student, cfg: DistillConfig) -> _TaskData:
    """Tokenise the task (and its augmented / transfer rows) at a length both models take; number the rows."""
    model_max = min(teacher.model.config.max_position_embeddings, student.model.config.max_position_embeddings)
    max_length = cfg.data.resolved_max_length(task, model_max)
    train_ds = load_train_split(task, cfg.data, seed=cfg.train.seed)
    features = train_features(train_ds, task, teacher.tokenizer, cfg.data, max_length)
    n_gold = len(features)
    rows, extra = _extra_rows(task, teacher, train_ds, cfg)
    if rows:
        label = _no_gold(task)
        raw = datasets.Dataset.from_list([{**r, "label": label, "idx": -1} for r in rows])
        more = train_features(raw, task, teacher.tokenizer, cfg.data, max_length)
        features = datasets.concatenate_datasets([features, more.cast(features.features)])
    features = features.add_column("cache_index", list(range(len(features))))
    features = features.add_column("gold", [1] * n_gold + [0] * (len(features) - n_gold))
    return _TaskData(features, load_dev_splits(task, cfg.data), n_gold, max_length, collate(teacher.tokenizer, task), extra,
                     load_test_split(task, cfg.data))


def _no_gold(task: Task):
    """The label of a row with teacher targets only: -100 (ignored by cross-entropy), NaN (poisons any MSE that
    would read it) or a row of them (multi-label); the ``gold`` column is what the hard term selects by."""
    if task.kind == MULTI_LABEL:
        return [float("nan")] * task.num_labels
    return float("nan") if task.kind == REGRESSION else -100


def _extra_rows(task, teacher: Teacher, train_ds, cfg: DistillConfig) -> tuple[list[dict], dict]:
    """Augmented copies of the training texts and transfer rows (texts only), and how they were made."""
    extra_cfg, fields = cfg.extra_data, task.text_fields
    rows, record = [], {}
    soft = "kd" in cfg.losses or bool(set(cfg.losses) & set(INTERMEDIATE_TERMS))
    copies = extra_cfg.copies(len(train_ds), spans=task.behaviour.per_token, soft_targets=soft)
    if copies and extra_cfg.augment is None:
        log.info("augmenting with %d copies per example, the default for a training set of at most %s examples "
                 "(--augment 0 turns it off)", copies, f"{AUTO_MAX_EXAMPLES:,}")
    extra_cfg = replace(extra_cfg, augment=copies)
    if copies:
        texts = [{f: ex[f] for f in fields} for ex in train_ds]
        source_dir, make = _candidate_source(teacher, extra_cfg)
        cache_dir = (Path(cfg.cache_dir) if cfg.cache_dir else default_cache_dir()) / "augmented"
        with main_process_first():  # one process builds the set, the others read it
            augmented, info = augmented_rows(
                teacher.tokenizer, texts, fields, make, source_hash=f"{make.__name__}:{dir_hash(source_dir)}",
                cfg=extra_cfg, seed=cfg.train.seed, cache_dir=cache_dir)
        rows += [{f: r.get(f, "") for f in fields} for r in augmented]
        record["augment"] = {"copies": copies, "default": cfg.extra_data.augment is None, "prob": extra_cfg.augment_prob,
                             "candidates": extra_cfg.augment_candidates,
                             "candidate_model": str(source_dir), "rows": len(augmented), **info}
        log.info("augmented %d training examples into %d more rows (%s%s)", len(texts), len(augmented), info["method"],
                 ", from the cache" if info["hit"] else "")
    if extra_cfg.transfer_text:
        limit = extra_cfg.transfer_examples or len(train_ds)
        documents, pairs = _transfer_sources(extra_cfg.transfer_text, task, cfg.data)
        transfer = transfer_rows(documents, fields, limit, cfg.train.seed, pairs)
        rows += transfer
        record["transfer"] = {"sources": list(extra_cfg.transfer_text), "rows": len(transfer)}
        log.info("added %d transfer rows from %s (teacher targets only)", len(transfer), ", ".join(extra_cfg.transfer_text))
    return rows, record


def _candidate_source(teacher: Teacher, cfg: AugmentConfig) -> tuple[Path, Callable]:
    """The model whose knowledge proposes replacement words, and a builder of its candidate source.

    ``--augment-mlm DIR`` (a masked-LM with the teacher's vocabulary); else the teacher's own
    MLM head when its folder was saved with one; else nearest neighbours in the teacher's
    input embeddings.
    """
    k = cfg.augment_candidates
    if cfg.augment_mlm:
        mlm_dir = require_torch_weights(resolve_model(cfg.augment_mlm), "--augment-mlm")
        if saved_head(mlm_dir) not in ("masked-lm", "pretraining"):
            raise CompressError(f"--augment-mlm {mlm_dir} has no masked-LM head (saved as {saved_head(mlm_dir)}); "
                                "pass a masked-LM or pretraining model folder, or leave it out to use embedding neighbours")
        if load_tokenizer(mlm_dir).get_vocab() != teacher.tokenizer.get_vocab():
            raise CompressError(f"--augment-mlm {mlm_dir} has another vocabulary than the teacher; its candidates would be "
                                "other tokens. Pass a masked-LM made with the teacher's tokenizer")

        def masked_lm():
            return MaskedLMCandidates(load_model(mlm_dir, head="masked-lm"), teacher.tokenizer, k)

        return mlm_dir, masked_lm
    if saved_head(teacher.dir) in ("masked-lm", "pretraining"):
        def teacher_mlm():
            return MaskedLMCandidates(load_model(teacher.dir, head="masked-lm"), teacher.tokenizer, k)

        return teacher.dir, teacher_mlm

    def embedding_neighbours():
        return EmbeddingNeighbours.of_model(teacher.model, teacher.tokenizer, k)

    return teacher.dir, embedding_neighbours


def _transfer_sources(sources: tuple[str, ...], task, data: TaskData) -> tuple[list[list[str]], list[tuple[str, str]]]:
    """Documents (lists of sentences) from corpora, and ready-made pairs from pair tasks named ``task:NAME``."""
    documents, pairs, corpora = [], [], []
    for source in sources:
        if not source.startswith("task:"):
            corpora.append(source)
            continue
        other = get_task(source[len("task:"):])
        if other.name not in GLUE_TASKS:
            raise CompressError(f"--transfer-text {source}: only GLUE tasks' texts can be transferred, not {other.display}")
        ds = load_split(other, "train", DataSource(data_dir=data.data_dir))
        if len(other.text_fields) == 2 and len(task.text_fields) == 2:
            pairs += list(zip(ds[other.text_fields[0]], ds[other.text_fields[1]]))
        documents.append([text for f in other.text_fields for text in ds[f]])  # one document: no relation between rows
    if corpora:
        documents += read_documents(corpora)
    return documents, pairs


@dataclass
class _Trained:
    """What the stages of a task distillation produced, for the output's records."""

    history: list[dict] = field(default_factory=list)  # every stage's log, each entry tagged with its stage
    best: dict | None = None  # dev metrics of the best evaluation
    best_step: int | None = None
    seconds: float = 0.0
    cache: list[dict] = field(default_factory=list)  # one entry per stage that read the teacher cache
    processes: int = 1


def _stages(cfg: DistillConfig) -> list[tuple[str, tuple[str, ...], TrainConfig]]:
    """(name, terms, training config) per stage: TinyBERT's intermediate-then-prediction order, or one joint stage."""
    if not cfg.two_stage:
        return [("joint", cfg.losses, cfg.train)]
    intermediate = replace(cfg.train, epochs=cfg.intermediate_epochs) if cfg.intermediate_epochs else cfg.train
    return [("intermediate", tuple(t for t in cfg.losses if t in INTERMEDIATE_TERMS), intermediate),
            ("prediction", tuple(t for t in cfg.losses if t in PREDICTION_TERMS), cfg.train)]


def _train_stages(cfg, task, teacher: Teacher, student: Student, wrapper, data: _TaskData, evaluate, work, device) -> _Trained:
    """Train through every stage; the best dev weights (selected in the stages that predict) end in ``wrapper``."""
    trained = _Trained()
    for stage, terms, stage_cfg in _stages(cfg):
        # TinyBERT runs both stages on the augmented set; by default only the prediction stage reads
        # it here, where the teacher's outputs are cached (the intermediate one runs the teacher alongside).
        gold_only = stage == "intermediate" and not cfg.extra_data.augment_intermediate
        features = data.gold_only() if gold_only else data.features
        lengths = [len(ids) for ids in features["input_ids"]]
        cache = _teacher_cache(teacher, terms, student.pairs, features, data.pad, task, cfg, device)
        if cache is not None:
            trained.cache.append({"stage": stage, "path": str(cache.path), "hit": cache.hit, "layers": list(cache.layers)})
        select = task.primary_metric if stage != "intermediate" else None
        result = train_keeping_best(
            wrapper, Phase(features, _collate_with_cache(data.pad), lengths=lengths), stage_cfg,
            loss_fn=make_loss_fn(task.behaviour, terms, cfg.loss, teacher.model, cache, student.pairs), work_dir=work / stage,
            evaluate=(lambda m: evaluate(m.student)) if select else None, select=select, resume=cfg.resume,
            run_key=[teacher.hash, task.name, data.n_train, len(features), data.max_length, list(terms), student.shape.label,
                     cfg.loss.layer_map],
            desc=f"distilling {task.display} ({stage})",
        )
        trained.history += [{**h, "stage": stage} for h in result.history]
        trained.seconds += result.seconds
        trained.processes = result.processes
        if result.best_weights is not None:
            trained.best, trained.best_step = result.best, result.best_step
    return trained


def _teacher_cache(teacher: Teacher, terms, pairs, features, pad, task, cfg: DistillConfig, device):
    """The teacher's outputs for ``terms`` cached on disk (computed on first use), or None: read them online."""
    needs = needs_of(terms)
    cacheable = {"logits"} | ({"hidden"} if cfg.cache_hidden else set())
    if not (cfg.cache and needs <= cacheable and "logits" in needs):  # hard labels alone need no teacher outputs
        return None
    with main_process_first():  # one process computes the teacher outputs, the others read them
        return load_or_build(
            teacher.model, teacher.hash, features, pad, outputs=list(task.behaviour.outputs),
            layers=sorted(_teacher_layers(pairs, needs)), cache_dir=Path(cfg.cache_dir) if cfg.cache_dir else None,
            batch_size=cfg.data.eval_batch_size, device=device,
        )


def _collate_with_cache(pad):
    """``collate(items, step)``: a padded batch plus ``cache_index`` (batch,) and ``gold`` (batch,) bool."""
    def collate_step(items, step):
        index = [int(x["cache_index"]) for x in items]
        gold = [bool(x.get("gold", 1)) for x in items]
        batch = pad([{k: v for k, v in x.items() if k not in ("cache_index", "gold")} for x in items])
        batch["cache_index"] = torch.tensor(index)
        batch["gold"] = torch.tensor(gold)
        return batch

    return collate_step


def _task_metrics(task, data: _TaskData, trained: _Trained, teacher_dev: dict, cfg: DistillConfig) -> list[dict]:
    """metrics.json records of the student: dev scores, retention of the teacher's score, the training log."""
    teacher_metric = teacher_dev["metrics"].get(task.primary_metric)
    best = trained.best or {}
    records = split_records(task, data.dev, best, data=cfg.data.describe("dev"), max_length=data.max_length,
                            batch_size=cfg.data.eval_batch_size)
    primary = best.get(task.primary_metric)
    retention = {
        "kind": "retention", "task": task.name, "metric": task.primary_metric, "student": primary,
        "teacher": teacher_metric, "ratio": (primary / teacher_metric) if primary is not None and teacher_metric else None,
        "teacher_source": teacher_dev["source"], "teacher_at_chance": teacher_dev["check"]["at_chance"],
        "teacher_warning": teacher_dev["check"]["warning"], "when": utc_now(),
    }
    training = {
        "kind": "training", "stage": "distill", "task": task.name, "seconds": round(trained.seconds, 1),
        "best_step": trained.best_step, "n_train": data.n_train, "extra_rows": len(data.features) - data.n_train,
        "processes": trained.processes,
        "history": trained.history, "cache": trained.cache, "when": utc_now(),
    }
    return [*records, retention, training]


def _teacher_metrics(task, results: list[dict]) -> dict[str, float] | None:
    """The teacher's latest dev metrics on ``task`` recorded in its metrics.json (those of the primary split), or None."""
    for r in reversed(results):
        if r.get("kind") == "eval" and r.get("task") == task.name and r.get("split") in ("dev", "dev_matched"):
            metrics = r.get("metrics") or {}
            if metrics.get(task.primary_metric) is not None:
                return dict(metrics)
    return None
