"""The steps every distillation takes: open the teacher, build the student, run both, train keeping the best, write.

Three entry points share them: the task stage (:mod:`compress.distill.task`), an encoder on a
text corpus (:mod:`compress.distill.general`) and a sentence-embedding model on unlabelled
sentences (:mod:`compress.distill.embedding`). :func:`make_loss_fn` turns the chosen
terms (:mod:`compress.distill.terms`) into the training loop's loss, running the teacher
alongside the student or reading its outputs from the cache (:mod:`compress.distill.teacher_cache`).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from compress.core.formats.artifacts import save_model_dir
from compress.core.formats.folder import ModelFolder, open_folder
from compress.core.formats.records import compression_record
from compress.core.preflight import check_output
from compress.core.errors import CompressError
from compress.core.formats.runtime import load_folder_model
from compress.core.model.shapes import Shape
from compress.core.model.structure import base_model, capture, config_sizes, count_parameters, encoder_layers, mlm_head, model_inputs, value_projection
from compress.core.data.tasks import TaskKind
from compress.core.checkpoints import load_weights
from compress.core.processes import is_main_process
from compress.core.train import Phase, TrainConfig, TrainResult, train_phases
from compress.distill.cross_tokenizer import TeacherRows, same_tokenisation
from compress.distill.terms import ENCODER, MLM, TERMS, Kind, LossWeights, Outputs, Step, needs_of
from compress.students.init import TEACHER_METHODS, init_student, load_pretrained_student
from compress.students.layer_map import parse_layer_map

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
    ds, dt = config_sizes(student.config).hidden, config_sizes(teacher.config).hidden
    mods = nn.ModuleDict()
    if ds != dt:
        if set(terms) & {"hidden", "cosine"}:
            mods["hidden"] = nn.Linear(ds, dt)
        if "embedding" in terms:
            mods["embedding"] = nn.Linear(ds, dt)
    return mods


def teacher_layers(pairs: list[tuple[int, int]], needs: set[str]) -> set[int]:
    """Teacher hidden-state indices the hidden terms read (none when no term reads hidden states)."""
    return {t for _, t in pairs} if "hidden" in needs else set()


def make_loss_fn(kind: Kind, terms: tuple[str, ...], loss: LossWeights, teacher_model, cache, pairs: list[tuple[int, int]],
                 *, apart: TeacherRows | None = None):
    """``loss_fn(model, batch) -> (loss, logs)`` for the training loop: the weighted sum of ``terms``, each logged.

    ``apart``: the teacher's own tokenisation of the rows, for a student that tokenises apart from it (the teacher's
    outputs are then computed, or read from ``cache``, on its own tokens and met with the student's positions)."""
    needs = needs_of(terms)
    teacher_hidden = teacher_layers(pairs, needs)
    student_hidden = {s for s, _ in pairs} if "hidden" in needs else set()
    if "cosine" in terms:  # the last hidden states of both
        student_hidden |= {max(s for s, _ in pairs)}
        teacher_hidden |= {max(t for _, t in pairs)}
    weights = {t: TERMS.get(t).weight(loss, terms) for t in terms}
    student_needs = needs | {"logits"}

    def loss_fn(model, batch):
        if apart is None:
            index = batch.pop("cache_index", None)  # (batch,) rows of the teacher cache, in task distillation
            teacher = _teacher_outputs(kind, teacher_model, cache, batch, index, needs=needs, hidden_index=teacher_hidden)
            mask = batch["attention_mask"]
        else:  # the teacher's outputs on its own tokens, where they meet the student's (mask: (batch, seq))
            teacher, mask = apart.outputs(kind, teacher_model, cache, batch, needs=needs)
        student = model(batch, student_needs, student_hidden, kind)
        inner = model.module if hasattr(model, "module") else model  # DDP wraps the Distiller
        step = Step(kind, student, teacher, batch, mask, pairs, inner.projections, loss,
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


def _teacher_outputs(kind: Kind, teacher_model, cache, batch, index, *, needs: set[str], hidden_index: set[int]) -> Outputs:
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


@dataclass
class Teacher:
    """The teacher of a run: its opened folder, content hash, tokenizer and loaded model."""

    folder: ModelFolder
    hash: str  # the folder's: keys the teacher cache and a resumable run
    tokenizer: object
    model: nn.Module


@dataclass
class Student:
    """A student built from its teacher, and how the two line up."""

    model: nn.Module
    init: dict  # how it was initialised (compression.json "init")
    shape: Shape  # as recorded: with --init DIR, the shape DIR holds (not the --student preset)
    pairs: list[tuple[int, int]]  # (student, teacher) hidden-state indices, 0 = embeddings
    tokenizer: object  # what it reads and is saved with: the teacher's (the object itself) unless it has its own
    apart: bool = False  # it tokenises apart from the teacher (its own tokenizer): outputs meet per example or word


def check_out(out: str | Path, cfg, overwrite: bool, *inputs) -> Path:
    """The output directory (see :func:`check_output`: never an input, never over a folder without --overwrite)."""
    return check_output(out, overwrite, inputs=(inputs, cfg), resume=cfg.resume)


def open_teacher(folder: ModelFolder, head: str, needs: set[str]) -> Teacher:
    """The teacher of an opened folder: its tokenizer, hash and model with ``head`` (eager attention when a term
    reads attention maps)."""
    tokenizer = folder.tokenizer  # first: a folder without a tokenizer is refused before its weights are read
    key = folder.hash
    model = load_folder_model(folder, head=head, attn_implementation="eager" if "attentions" in needs else None)
    return Teacher(folder, key, tokenizer, model)


def student_folder(cfg, source: str | None = None) -> str | None:
    """The folder the student is loaded (``--init DIR``) or cut (``--init-from DIR``) from; None: the teacher."""
    init = cfg.shape.init
    return source or (None if init in (*TEACHER_METHODS, "random") else init)


def student_tokenizer(teacher: Teacher, cfg, source: str | None = None):
    """The tokenizer the student reads: that of the folder it comes from (:func:`student_folder`) when that folder has
    one and it tokenises otherwise than the teacher's; else the teacher's, the very object (a run is then unchanged)."""
    path = student_folder(cfg, source)
    folder = open_folder(path) if path else None
    if folder is None or not folder.has_tokenizer or same_tokenisation(folder.tokenizer, teacher.tokenizer):
        return teacher.tokenizer
    return folder.tokenizer


def build_student(teacher: Teacher, cfg, needs: set[str], layer_map: str = "uniform", source: str | None = None, *,
                  tokenizer=None) -> Student:
    """The ``cfg.shape`` student (or ``--init DIR``), initialised as its ``init`` says, and its ``layer_map``.

    ``cfg``: any distillation config (they share the :class:`StudentShape` block ``shape`` and ``train``).

    ``source`` (``--init-from DIR``): the encoder a teacher method cuts the student from instead of the teacher
    (loaded with the teacher's head type and labels, the head new).

    ``tokenizer``: the student's (:func:`student_tokenizer`), from a caller that takes a student with a tokenizer of
    its own (task and embedding distillation); without it, a student whose folder tokenises otherwise than the teacher
    is refused."""
    own = tokenizer if tokenizer is not None else student_tokenizer(teacher, cfg, source)
    if tokenizer is None and own is not teacher.tokenizer:
        raise CompressError(f"{student_folder(cfg, source)} has a tokenizer of its own, not the teacher's; only compress distill "
                            "and distill-embedding take such a student (each model tokenising the text itself): here, start from a student with "
                            "the teacher's tokenizer")
    shape, init = cfg.shape.resolve(), cfg.shape.init
    method, pretrained = (init, None) if init in (*TEACHER_METHODS, "random") else ("pretrained", init)
    cut_from = teacher.model
    if source:
        # its new head, copied into the student: the same for the same --seed
        cut_from = load_pretrained_student(teacher.model, source, seed=cfg.train.seed)[0]
    try:
        model, info = init_student(cut_from, shape, method=method, layers=list(cfg.shape.init_layers) or None,
                                   seed=cfg.train.seed, pretrained=pretrained)
    except CompressError as err:
        if not source:
            raise
        raise CompressError(f"--init-from {source} stands in for the teacher here: {err}") from None
    if source:
        info = {**info, "from": str(source)}
    if "attentions" in needs:  # output_attentions needs the eager implementation
        model.config._attn_implementation = "eager"
    sizes = config_sizes(model.config)
    teacher_sizes = config_sizes(teacher.model.config)
    if own is teacher.tokenizer and sizes.vocab != teacher_sizes.vocab:
        raise CompressError(f"the student from {student_folder(cfg, source)} has a vocabulary of {sizes.vocab} but the "
                            f"teacher has {teacher_sizes.vocab}, and no tokenizer of its own: copy its tokenizer files into it")
    if pretrained is not None:  # --init DIR: the student is whatever DIR holds, not the --student preset
        shape = Shape(sizes.layers, sizes.hidden, sizes.heads, sizes.ffn)
    pairs = parse_layer_map(layer_map, sizes.layers, teacher_sizes.layers)
    return Student(model, info, shape, pairs, own, apart=own is not teacher.tokenizer)


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
        "teacher": {"path": str(teacher.folder.path), "hash": teacher.hash}, "student_shape": student.shape.__dict__,
        "init": student.init, "layer_map": [list(p) for p in student.pairs], "params": count_parameters(student.model),
        **({"tokenizer": "the student's own (it tokenises apart from the teacher)"} if student.apart else {}), **extra,
    }
    return compression_record(stage=stage, method="+".join(cfg.losses), config=cfg, parent=teacher.folder,
                              seed=cfg.train.seed, extra=extra)


def write_student(student: Student, out: Path, teacher: Teacher, record: dict, metrics: list[dict], *,
                   resume: bool, overwrite: bool, work: Path, files: dict[str, Path] | None = None) -> Path:
    """Save the student with its tokenizer (the teacher's unless it has its own), then drop the checkpoints."""
    save_model_dir(student.model, out, tokenizer=student.tokenizer, record=record,
                   overwrite=overwrite, metrics=metrics, files=files)
    shutil.rmtree(work, ignore_errors=True)
    return out
