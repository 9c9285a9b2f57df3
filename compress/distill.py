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
then the prediction layer) is ``two_stage``. Without a task, ``distill_general``
distils an encoder on a text corpus (MiniLM's attention + value relations, or
DistilBERT's MLM + KD + cosine when the teacher has an MLM head).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from compress.core.config import option
from compress.core.data import TaskData
from compress.core.errors import CompressError
from compress.core.registry import Registry
from compress.core.tasks import REGRESSION, SPAN, get_task
from compress.core.train import TrainConfig

PREDICTION_TERMS = ("kd", "hard")
MLM = "mlm"  # the kind of a general-distillation batch with masked-LM targets
INTERMEDIATE_TERMS = ("hidden", "embedding", "attention", "cosine", "minilm")


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


@dataclass(frozen=True)
class DistillConfig:
    task: str = option("", "task to distil on (cola, sst2, mrpc, stsb, ..., squad)")
    student: str = option("6L-384", "student shape: 6L-768, 4L-312, 6L-384, 3L-384, 2L-128 or LAYERSL-HIDDEN[-FFN]")
    heads: int | None = option(None, "student attention heads (overrides the shape's)")
    layers: int | None = option(None, "student layers (overrides the shape's)")
    hidden: int | None = option(None, "student hidden width (overrides the shape's; FFN then defaults to 4x)")
    ffn: int | None = option(None, "student FFN width (overrides the shape's)")
    init: str = option("teacher-layers", "student initialisation: teacher-layers, random, or a pretrained model DIR")
    init_layers: tuple[int, ...] = option((), "teacher layers (0-based) copied into the student (default: evenly spaced)", metavar="L[,...]")
    losses: tuple[str, ...] = option(("kd", "hard"), "loss terms: kd, hard, hidden, embedding, attention, cosine, minilm", metavar="TERM[,...]")
    loss: LossWeights = field(default_factory=LossWeights)
    two_stage: bool = option(False, "TinyBERT order: intermediate terms first, then the prediction terms")
    intermediate_epochs: int | None = option(None, "epochs of the intermediate stage (default: --epochs)")
    cache: bool = option(True, "cache teacher outputs on disk when the terms allow (teacher runs once)")
    cache_hidden: bool = option(False, "also cache the mapped teacher hidden states (float16 on disk)")
    cache_dir: str | None = option(None, "where teacher outputs are cached (default: $COMPRESS_CACHE or ~/.cache/compress)", metavar="DIR")
    resume: bool = option(False, "continue an interrupted run from its last checkpoint into the same --out")
    data: TaskData = field(default_factory=TaskData)
    train: TrainConfig = field(default_factory=_distill_defaults)

    def validate(self) -> None:
        if not self.task:
            raise CompressError("no task given; pass --task (or use general distillation with --corpus)")
        get_task(self.task)
        for term in self.losses:
            TERMS.get(term)
        if not self.losses:
            raise CompressError("--losses is empty; pass e.g. --losses kd,hard")
        if self.two_stage and not (set(self.losses) & set(INTERMEDIATE_TERMS) and set(self.losses) & set(PREDICTION_TERMS)):
            raise CompressError("--two-stage needs intermediate terms (hidden, attention, ...) and prediction terms (kd, hard)")


# ---------------------------------------------------------------------------- loss terms


@dataclass
class Outputs:
    """What a forward pass produced, for the loss terms."""

    logits: dict[str, torch.Tensor] = field(default_factory=dict)  # logits | start_logits, end_logits
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)  # hidden-state index -> (batch, seq, d)
    attentions: dict[int, torch.Tensor] = field(default_factory=dict)  # layer (1-based) -> (batch, heads, seq, seq)
    values: torch.Tensor | None = None  # last layer's value projection (batch, seq, heads*d)


@dataclass
class Step:
    """Everything one loss term may read for one batch."""

    kind: str  # CLASSIFICATION, REGRESSION or SPAN
    student: Outputs
    teacher: Outputs
    batch: dict[str, torch.Tensor]
    mask: torch.Tensor  # (batch, seq) 1 for real tokens
    pairs: list[tuple[int, int]]  # (student, teacher) hidden-state indices, 0 = embeddings
    projections: nn.ModuleDict
    cfg: DistillConfig


@dataclass(frozen=True)
class Term:
    needs: frozenset[str]  # teacher outputs: logits, hidden, attentions, values
    weight: Callable[[LossWeights, tuple[str, ...]], float]
    compute: Callable[[Step], torch.Tensor]


TERMS: Registry[Term] = Registry("distillation loss")


def _kd(step: Step) -> torch.Tensor:
    from compress import losses as L

    s, t, T = step.student.logits, step.teacher.logits, step.cfg.loss.temperature
    if step.kind == SPAN:
        return L.span_kd(s["start_logits"], s["end_logits"], t["start_logits"], t["end_logits"], step.mask, temperature=T)
    if step.kind == REGRESSION:
        return L.logits_mse(s["logits"], t["logits"])
    return L.soft_target_kl(s["logits"], t["logits"], temperature=T)


def _hard(step: Step) -> torch.Tensor:
    from compress import losses as L

    s, batch = step.student.logits, step.batch
    if step.kind == MLM:
        return L.hard_label_ce(s["logits"], batch["labels"][batch["labels"] != -100])  # masked-LM loss
    if step.kind == SPAN:
        return (L.hard_label_ce(s["start_logits"], batch["start_positions"]) + L.hard_label_ce(s["end_logits"], batch["end_positions"])) / 2
    if step.kind == REGRESSION:
        return torch.nn.functional.mse_loss(s["logits"].squeeze(-1), batch["labels"].to(s["logits"].dtype))
    return L.hard_label_ce(s["logits"], batch["labels"])


def _hidden(step: Step) -> torch.Tensor:
    from compress import losses as L

    pairs = [(si, ti) for si, ti in step.pairs if si > 0]
    proj = step.projections["hidden"] if "hidden" in step.projections else None
    return sum(L.hidden_mse(step.student.hidden[si], step.teacher.hidden[ti], step.mask, proj) for si, ti in pairs) / len(pairs)


def _embedding(step: Step) -> torch.Tensor:
    from compress import losses as L

    proj = step.projections["embedding"] if "embedding" in step.projections else None
    return L.embedding_mse(step.student.hidden[0], step.teacher.hidden[0], step.mask, proj)


def _attention(step: Step) -> torch.Tensor:
    from compress import losses as L

    pairs = [(si, ti) for si, ti in step.pairs if si > 0]
    return sum(L.attention_mse(step.student.attentions[si], step.teacher.attentions[ti], step.mask) for si, ti in pairs) / len(pairs)


def _cosine(step: Step) -> torch.Tensor:
    from compress import losses as L

    s_last, t_last = max(step.student.hidden), max(step.teacher.hidden)
    proj = step.projections["hidden"] if "hidden" in step.projections else None
    return L.cosine_hidden(step.student.hidden[s_last], step.teacher.hidden[t_last], step.mask, proj)


def _minilm(step: Step) -> torch.Tensor:
    from compress import losses as L

    s_last, t_last = max(step.student.attentions), max(step.teacher.attentions)
    attention = L.attention_kl(step.student.attentions[s_last], step.teacher.attentions[t_last], step.mask)
    relation = L.value_relation_kl(step.student.values, step.teacher.values, step.mask, relation_heads=step.cfg.loss.relation_heads)
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


def run_model(model, batch: dict[str, torch.Tensor], needs: set[str], hidden_index: set[int], kind: str) -> Outputs:
    """Forward pass returning the outputs the loss terms need (hooks only while it runs)."""
    from compress.core.structure import base_model, capture, encoder_layers, mlm_head, value_projection

    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch}
    watch = {"values": value_projection(model, len(encoder_layers(model)) - 1)} if "values" in needs else {}
    flags = {"output_hidden_states": "hidden" in needs, "output_attentions": "attentions" in needs}
    with capture(watch) as seen:
        if kind == MLM:
            out = base_model(model)(**inputs, **flags)
        else:
            out = model(**inputs, **flags)
    result = Outputs(values=seen.get("values"))
    if kind == MLM:
        # MLM logits only where a token was selected: (n_selected, vocab), not (batch, seq, vocab).
        selected = batch["labels"] != -100
        result.logits = {"logits": mlm_head(model)(out.last_hidden_state[selected])}
    elif kind == SPAN:
        result.logits = {"start_logits": out.start_logits, "end_logits": out.end_logits}
    elif getattr(out, "logits", None) is not None:
        result.logits = {"logits": out.logits}
    if "hidden" in needs:
        result.hidden = {i: out.hidden_states[i] for i in hidden_index}
    if "attentions" in needs:
        result.attentions = {i + 1: a for i, a in enumerate(out.attentions)}
    return result


class Distiller(nn.Module):
    """The trainable part: the student plus projections for width-mismatched hidden terms.

    Its forward runs the student, so data-parallel wrappers see every trainable use.
    """

    def __init__(self, student: nn.Module, projections: nn.ModuleDict):
        super().__init__()
        self.student = student
        self.projections = projections

    def forward(self, batch, needs: set[str], hidden_index: set[int], kind: str) -> Outputs:
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


# ---------------------------------------------------------------------------- entry point


def distill(teacher: str | Path, out: str | Path, cfg: DistillConfig, *, overwrite: bool = False) -> Path:
    """Distil ``teacher`` into a ``cfg.student`` on ``cfg.task``; write the best dev student to ``out``."""
    from compress.core.artifacts import (
        check_output, compression_record, dir_hash, load_model, load_tokenizer, read_metrics, save_model_dir, utc_now, require_torch_weights,
    )
    from compress.core.data import collate, load_task_data
    from compress.core.structure import count_parameters
    from compress.core.train import is_main_process, load_weights, main_process_first, prepare_work_dir, train
    from compress.teacher_cache import load_or_build
    from eval.evaluate import dev_evaluator, split_records
    from students.init import init_student
    from students.layer_map import parse_layer_map
    from students.presets import resolve_shape
    from teacher.finetune import work_dir_for
    from teacher.presets import resolve_model

    task = get_task(cfg.task)
    out = Path(out)
    if not cfg.resume:
        check_output(out, overwrite)
    teacher_dir = require_torch_weights(resolve_model(teacher), "distillation (the teacher)")
    tokenizer = load_tokenizer(teacher_dir)
    needs_attn = bool(needs_of(cfg.losses) & {"attentions"})
    head = "question-answering" if task.kind == SPAN else "sequence-classification"
    teacher_model = load_model(teacher_dir, head=head, attn_implementation="eager" if needs_attn else None)
    _check_teacher(teacher_model, teacher_dir, task)

    shape = resolve_shape(cfg.student, layers=cfg.layers, hidden=cfg.hidden, heads=cfg.heads, ffn=cfg.ffn)
    method, pretrained = (cfg.init, None) if cfg.init in ("teacher-layers", "random") else ("pretrained", cfg.init)
    student, init_info = init_student(
        teacher_model, shape, method=method, layers=list(cfg.init_layers) or None, seed=cfg.train.seed, pretrained=pretrained,
    )
    if needs_attn:
        student.config._attn_implementation = "eager"
    if pretrained is not None:  # --init DIR: the student is whatever DIR holds, not the --student preset
        from compress.core.structure import Shape

        c = student.config
        shape = Shape(c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.intermediate_size)
    n_student, n_teacher = student.config.num_hidden_layers, teacher_model.config.num_hidden_layers
    pairs = parse_layer_map(cfg.loss.layer_map, n_student, n_teacher)

    max_length = cfg.data.resolved_max_length(task, min(teacher_model.config.max_position_embeddings, student.config.max_position_embeddings))
    features, dev, n_train = load_task_data(task, tokenizer, cfg.data, max_length, seed=cfg.train.seed)
    features = features.add_column("cache_index", list(range(len(features))))
    pad = collate(tokenizer)
    device = _device(cfg.train.device)
    teacher_model.to(device)

    stages = [("intermediate", tuple(t for t in cfg.losses if t in INTERMEDIATE_TERMS)),
              ("prediction", tuple(t for t in cfg.losses if t in PREDICTION_TERMS))] if cfg.two_stage else [("joint", cfg.losses)]
    teacher_hash = dir_hash(teacher_dir)
    projections = make_projections(student, teacher_model, cfg.losses)
    wrapper = Distiller(student, projections)
    evaluate = dev_evaluator(task, tokenizer, dev, max_length, batch_size=cfg.data.eval_batch_size, doc_stride=cfg.data.doc_stride)
    work = prepare_work_dir(work_dir_for(out), cfg.resume)
    history, best, best_step, seconds, cache_info = [], None, None, 0.0, []

    for stage, terms in stages:
        needs = needs_of(terms)
        hidden_pairs = {t for _, t in pairs} if needs & {"hidden"} else set()
        cached_outputs = {"logits"} | ({"hidden"} if cfg.cache_hidden else set())
        use_cache = cfg.cache and needs <= cached_outputs
        cache = None
        if use_cache and "logits" in needs:  # a hard-label-only run needs no teacher outputs at all
            names = ["start_logits", "end_logits"] if task.kind == SPAN else ["logits"]
            layers = sorted(hidden_pairs) if "hidden" in needs else []
            with main_process_first():  # one process computes the teacher outputs, the others read them
                cache = load_or_build(
                    teacher_model, teacher_hash, features, pad, outputs=names, layers=layers,
                    cache_dir=Path(cfg.cache_dir) if cfg.cache_dir else None, batch_size=cfg.data.eval_batch_size,
                    device=device,
                )
            cache_info.append({"stage": stage, "path": str(cache.path), "hit": cache.hit, "layers": layers})
        loss_fn = _loss_fn(task.kind, terms, cfg, teacher_model, cache, pairs, needs, hidden_pairs)
        stage_cfg = cfg.train
        if stage == "intermediate" and cfg.intermediate_epochs:
            from dataclasses import replace

            stage_cfg = replace(cfg.train, epochs=cfg.intermediate_epochs)
        select = task.primary_metric if stage != "intermediate" else None
        result = train(
            wrapper, features, _collate_with_cache(pad), stage_cfg, loss_fn=loss_fn, work_dir=work / stage,
            evaluate=(lambda m: evaluate(m.student)) if select else None, select=select, resume=cfg.resume,
            run_key=[teacher_hash, task.name, n_train, max_length, list(terms), shape.label, cfg.loss.layer_map],
            desc=f"distilling {task.display} ({stage})", lengths=[len(ids) for ids in features["input_ids"]],
        )
        history += [{**h, "stage": stage} for h in result.history]
        seconds += result.seconds
        if result.best_weights is not None:
            best, best_step = result.best, result.best_step
            if is_main_process():  # only rank 0 evaluated, so only it has the best weights
                load_weights(wrapper, result.best_weights)
    if not is_main_process():
        return out

    teacher_metric = _teacher_score(teacher_dir, task, read_metrics(teacher_dir), evaluate, teacher_model)
    records = split_records(task, dev, best or {}, data=cfg.data.describe(), max_length=max_length)
    primary = (best or {}).get(task.primary_metric)
    retention = {
        "kind": "retention", "task": task.name, "metric": task.primary_metric, "student": primary,
        "teacher": teacher_metric, "ratio": (primary / teacher_metric) if primary is not None and teacher_metric else None,
        "when": utc_now(),
    }
    training = {
        "kind": "training", "stage": "distill", "task": task.name, "seconds": round(seconds, 1),
        "best_step": best_step, "n_train": n_train, "processes": result.processes, "history": history, "cache": cache_info,
        "when": utc_now(),
    }
    record = compression_record(
        stage="distill", method="+".join(cfg.losses), config=cfg, parent=teacher_dir, seed=cfg.train.seed,
        extra={
            "task": task.name, "teacher": {"path": str(teacher_dir), "hash": teacher_hash},
            "student_shape": shape.__dict__, "init": init_info, "layer_map": [list(p) for p in pairs],
            "losses": list(cfg.losses), "params": count_parameters(student), "best": best, "cache": cache_info,
        },
    )
    save_model_dir(student, out, tokenizer=tokenizer, record=record, overwrite=True if cfg.resume else overwrite,
                   metrics=[*records, retention, training])
    shutil.rmtree(work, ignore_errors=True)
    return out


def _device(name: str):
    if name == "cuda" or (name == "auto" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


def _check_teacher(teacher_model, teacher_dir: Path, task) -> None:
    from eval.evaluate import output_to_task_labels

    if task.kind == SPAN:
        return
    try:
        output_to_task_labels(teacher_model.config, task)
    except CompressError as err:
        raise CompressError(f"teacher {teacher_dir}: {err}; distil from a teacher fine-tuned on {task.display}") from None


def _teacher_score(teacher_dir: Path, task, results: list[dict], evaluate, teacher_model) -> float | None:
    """The teacher's dev score: from its metrics.json when recorded on this task, else measured now."""
    for r in reversed(results):
        if r.get("kind") == "eval" and r.get("task") == task.name and r.get("split") in ("dev", "dev_matched"):
            value = (r.get("metrics") or {}).get(task.primary_metric)
            if value is not None:
                return float(value)
    return evaluate(teacher_model).get(task.primary_metric)


def _collate_with_cache(pad):
    def collate_step(items, step):
        index = [int(x["cache_index"]) for x in items]
        batch = pad([{k: v for k, v in x.items() if k != "cache_index"} for x in items])
        batch["cache_index"] = torch.tensor(index)
        return batch

    return collate_step


def _loss_fn(kind, terms, cfg, teacher_model, cache, pairs, needs, hidden_pairs):
    student_hidden = {s for s, _ in pairs} if needs & {"hidden"} else set()
    if "cosine" in terms:
        student_hidden |= {max(s for s, _ in pairs)}
        hidden_pairs = set(hidden_pairs) | {max(t for _, t in pairs)}
    weights = {t: TERMS.get(t).weight(cfg.loss, terms) for t in terms}
    student_needs = needs | {"logits"}

    def loss_fn(model, batch):
        index = batch.pop("cache_index")
        teacher = _teacher_outputs(kind, teacher_model, cache, batch, index, needs, hidden_pairs)
        student = model(batch, student_needs, student_hidden, kind)
        inner = model.module if hasattr(model, "module") else model  # DDP wraps the Distiller
        step = Step(kind, student, teacher, batch, batch["attention_mask"], pairs, inner.projections, cfg)
        parts = {t: TERMS.get(t).compute(step) for t in terms}
        total = sum(weights[t] * parts[t] for t in terms)
        return total, {f"loss_{t}": v.detach() for t, v in parts.items()}

    return loss_fn


def _teacher_outputs(kind, teacher_model, cache, batch, index, needs, hidden_pairs) -> Outputs:
    """The teacher's outputs for a batch: from the cache when it holds them, else a no-grad forward."""
    if cache is not None:
        seq = batch["input_ids"].shape[1]
        device = batch["input_ids"].device
        names = ["start_logits", "end_logits"] if kind == SPAN else ["logits"]
        logits = {}
        for name in names:
            values = cache.batch_outputs(index.tolist(), name).to(device)
            if kind == SPAN:  # (batch, longest cached) -> (batch, seq): cut, or pad when the batch is padded further
                values = torch.nn.functional.pad(values[:, :seq], (0, max(0, seq - values.shape[1])), value=-1e4)
            logits[name] = values
        result = Outputs(logits=logits)
        if "hidden" in needs:
            stacked = cache.batch_hidden(index.tolist(), seq).to(device)  # (layers, batch, seq, hidden)
            result.hidden = {layer: stacked[i] for i, layer in enumerate(cache.layers)}
        return result
    with torch.no_grad():
        return run_model(teacher_model, batch, needs | {"logits"}, set(hidden_pairs), kind)


# ---------------------------------------------------------------------------- general distillation


def _general_defaults() -> TrainConfig:
    return TrainConfig(lr=5e-4, batch_size=64, max_steps=1000, warmup_ratio=0.05, log_every=10, save_every=200)


@dataclass(frozen=True)
class GeneralDistillConfig:
    corpus: tuple[str, ...] = option(
        (), "text files or folders of *.txt (documents separated by blank lines), datasets save_to_disk folders, or hf:NAME[:CONFIG]",
        metavar="PATH[,...]")
    student: str = option("4L-312", "student shape: 6L-768, 4L-312, 6L-384, 3L-384, 2L-128 or LAYERSL-HIDDEN[-FFN]")
    heads: int | None = option(None, "student attention heads (overrides the shape's)")
    layers: int | None = option(None, "student layers (overrides the shape's)")
    hidden: int | None = option(None, "student hidden width (overrides the shape's; FFN then defaults to 4x)")
    ffn: int | None = option(None, "student FFN width (overrides the shape's)")
    init: str = option("random", "student initialisation: random, teacher-layers, or a pretrained model DIR")
    init_layers: tuple[int, ...] = option((), "teacher layers (0-based) copied into the student", metavar="L[,...]")
    losses: tuple[str, ...] = option(
        ("minilm",), "terms: minilm, hidden, attention, embedding, cosine; kd + mlm (DistilBERT) need MLM heads", metavar="TERM[,...]"
    )
    max_length: int = option(128, "tokens per training sequence (contiguous text)")
    mlm_probability: float = option(0.15, "fraction of tokens masked for the mlm/kd terms")
    loss: LossWeights = field(default_factory=LossWeights)
    heldout_fraction: float = option(0.01, "sequences held out to report the distillation loss")
    resume: bool = option(False, "continue an interrupted run from its last checkpoint into the same --out")
    train: TrainConfig = field(default_factory=_general_defaults)

    def validate(self) -> None:
        if not self.corpus:
            raise CompressError("no corpus given; pass --corpus FILE_OR_DIR[,...]")
        for term in self.losses:
            if term not in ("minilm", "hidden", "attention", "embedding", "cosine", "kd", "mlm"):
                raise CompressError(
                    f"unknown general distillation loss {term!r}; valid: minilm, hidden, attention, embedding, cosine, kd, mlm"
                )
        if self.max_length < 8:
            raise CompressError(f"--max-length {self.max_length} is too short; use at least 8")


def distill_general(teacher: str | Path, out: str | Path, cfg: GeneralDistillConfig, *, overwrite: bool = False) -> Path:
    """Task-agnostic distillation of an encoder on raw text (DistilBERT's first stage, MiniLM).

    MiniLM-style (``minilm``: last-layer attention and value relations) needs no MLM
    head, so any BERT encoder can teach, and widths may differ. DistilBERT-style
    (``mlm`` + ``kd`` on masked-LM logits + ``cosine``) needs teacher and student MLM
    heads. The output is an encoder directory to start task distillation from
    (``compress distill --init DIR``).
    """
    from compress.core.artifacts import (
        check_output, compression_record, dir_hash, load_model, load_tokenizer, save_model_dir, saved_head, utc_now,
    )
    from compress.core.structure import count_parameters
    from compress.core.train import Phase, is_main_process, load_weights, prepare_work_dir, train_phases
    from students.init import init_student
    from students.layer_map import parse_layer_map
    from students.presets import resolve_shape
    from teacher.corpus import PretrainCollator, build_instances, read_documents, tokenize_documents
    from teacher.finetune import work_dir_for
    from teacher.presets import resolve_model

    out = Path(out)
    if not cfg.resume:
        check_output(out, overwrite)
    teacher_dir = resolve_model(teacher)
    uses_mlm = bool({"kd", "mlm"} & set(cfg.losses))
    head = "masked-lm" if uses_mlm else "base"
    if uses_mlm and saved_head(teacher_dir) not in ("masked-lm", "pretraining"):
        raise CompressError(
            f"the kd/mlm terms need a teacher with a masked-LM head and {teacher_dir} has none; "
            "use --losses minilm (or hidden/attention/cosine)"
        )
    tokenizer = load_tokenizer(teacher_dir)
    needs = needs_of(tuple(t for t in cfg.losses if t != "mlm"))
    teacher_model = load_model(teacher_dir, head=head, attn_implementation="eager" if "attentions" in needs else None)
    shape = resolve_shape(cfg.student, layers=cfg.layers, hidden=cfg.hidden, heads=cfg.heads, ffn=cfg.ffn)
    method, pretrained = (cfg.init, None) if cfg.init in ("teacher-layers", "random") else ("pretrained", cfg.init)
    student, init_info = init_student(teacher_model, shape, method=method, layers=list(cfg.init_layers) or None,
                                      seed=cfg.train.seed, pretrained=pretrained)
    pairs = parse_layer_map(cfg.loss.layer_map, student.config.num_hidden_layers, teacher_model.config.num_hidden_layers)

    docs = tokenize_documents(read_documents(list(cfg.corpus)), tokenizer)
    # Contiguous text in [CLS] A [SEP] B [SEP] form (no NotNext pairs: NSP is not distilled).
    instances = build_instances(docs, cfg.max_length, cfg.train.seed, nsp_probability=0.0)
    n_held = int(len(instances) * cfg.heldout_fraction)
    heldout, train_set = instances[:n_held], instances[n_held:]
    masker = PretrainCollator(tokenizer, mlm_probability=cfg.mlm_probability, seed=cfg.train.seed)

    def collate_step(items, step):
        batch = masker(items, step)
        batch.pop("next_sentence_label")
        if not uses_mlm:  # MiniLM-style terms read clean text: undo the masking
            selected = batch["labels"] != -100
            batch["input_ids"] = torch.where(selected, batch["labels"], batch["input_ids"])
            batch.pop("labels")
        return batch

    terms = tuple("hard" if t == "mlm" else t for t in cfg.losses)  # mlm is the "hard" term of an MLM batch
    task_cfg = DistillConfig(task="sst2", losses=terms, loss=cfg.loss)  # the terms read Step.cfg; its task is unused
    if "attentions" in needs:
        student.config._attn_implementation = "eager"
    device = _device(cfg.train.device)
    teacher_model.to(device)
    hidden_pairs = {t for _, t in pairs} if "hidden" in needs else set()
    kind = MLM if uses_mlm else "encoder"
    loss_fn = _loss_fn(kind, terms, task_cfg, teacher_model, None, pairs, needs, hidden_pairs)
    wrapper = Distiller(student, make_projections(student, teacher_model, terms))
    held_batches = [collate_step(heldout[i : i + 64], 10**9 + i) for i in range(0, len(heldout), 64)]

    def evaluate(model) -> dict[str, float]:
        total, n = 0.0, 0
        with torch.inference_mode():
            for batch in held_batches:
                batch = {k: v.to(device) for k, v in batch.items()}
                batch["cache_index"] = torch.zeros(len(batch["input_ids"]), dtype=torch.long)
                loss, _ = loss_fn(model, dict(batch))
                total, n = total + float(loss) * len(batch["input_ids"]), n + len(batch["input_ids"])
        return {"heldout_loss": total / max(1, n), "neg_heldout_loss": -total / max(1, n)}

    def with_index(items, step):
        batch = collate_step(items, step)
        batch["cache_index"] = torch.zeros(len(items), dtype=torch.long)  # no cache: a placeholder
        return batch

    work = prepare_work_dir(work_dir_for(out), cfg.resume)
    lengths = [len(x.tokens_a) + len(x.tokens_b) + 3 for x in train_set]
    result = train_phases(
        wrapper, [Phase(train_set, with_index, lengths=lengths, name="corpus")], cfg.train, loss_fn=loss_fn,
        work_dir=work, evaluate=evaluate if held_batches else None, select="neg_heldout_loss" if held_batches else None,
        resume=cfg.resume, run_key=[dir_hash(teacher_dir), len(train_set), shape.label, list(cfg.losses)],
        desc="general distillation",
    )
    if not is_main_process():
        return out
    if result.best_weights is not None:
        load_weights(wrapper, result.best_weights)
    training = {
        "kind": "training", "stage": "distill-general", "steps": result.steps, "seconds": round(result.seconds, 1),
        "processes": result.processes,
        "sequences": len(train_set), "history": result.history, "best": result.best, "when": utc_now(),
    }
    record = compression_record(
        stage="distill-general", method="+".join(cfg.losses), config=cfg, parent=teacher_dir, seed=cfg.train.seed,
        extra={"teacher": {"path": str(teacher_dir), "hash": dir_hash(teacher_dir)}, "student_shape": shape.__dict__,
               "init": init_info, "layer_map": [list(p) for p in pairs], "params": count_parameters(student)},
    )
    save_model_dir(student, out, tokenizer=tokenizer, record=record, overwrite=True if cfg.resume else overwrite,
                   metrics=[training])
    shutil.rmtree(work, ignore_errors=True)
    return out
