"""Build a student model for a teacher: from the teacher's layers, at random, or pretrained.

Every method but ``pretrained`` returns a model of the teacher's class (``BertForSequenceClassification``,
``RobertaForQuestionAnswering``, ``DistilBertModel``, ``ModernBertForMaskedLM``, ...) with
the teacher's task configuration (vocabulary, positions, labels, problem type), so its
outputs line up with the teacher's for distillation; a pretrained one keeps its own family and
vocabulary, with the teacher's head and labels. Methods are chosen by name from
``INIT_METHODS``.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from compress.core.model import structure as st
from compress.core.errors import CompressError
from compress.core.registry import Registry
from compress.core.formats.runtime import load_model
from compress.core.model.families import class_names, head_of_class
from compress.core.model.heads import HEADS
from compress.core.model.shapes import TEACHER_METHODS, Shape
from compress.students.layer_map import every_kth
from compress.students.slices import cut_from_teacher, cut_problems

InitMethod = Callable[..., tuple[nn.Module, dict[str, Any]]]
INIT_METHODS: Registry[InitMethod] = Registry("student init method")


# ---------------------------------------------------------------------------- config


def _student_config(teacher: nn.Module, shape: Shape):
    """The teacher's config (vocab, positions, labels, dropout, activation) with ``shape``'s sizes."""
    config = copy.deepcopy(teacher.config)
    # Sizes under the family's names; every head; the family's own per-layer settings.
    st.set_config_shape(config, layers=shape.layers, hidden=shape.hidden, heads=shape.heads, ffn=shape.ffn)
    config.architectures = [type(teacher).__name__]
    if hasattr(config, "compress_kept_layers"):
        # Describes the teacher's own layer history, not the student's.
        del config.compress_kept_layers
    return config


def _build_like(teacher: nn.Module, config) -> nn.Module:
    """A fresh model of the teacher's class, on its device and dtype, in its train/eval mode."""
    model = type(teacher)(config)
    ref = next(teacher.parameters())
    model.to(device=ref.device, dtype=ref.dtype)
    return model.train(teacher.training)


# ---------------------------------------------------------------------------- from teacher layers


def _shape_mismatches(teacher: nn.Module, shape: Shape) -> list[str]:
    sizes = st.config_sizes(teacher.config)
    hidden, n_heads = sizes.hidden, sizes.heads
    problems = []
    if shape.hidden != hidden:
        problems.append(f"hidden size {shape.hidden} vs teacher {hidden}")
    heads = st.heads_per_layer(teacher)
    if st.removed_heads(teacher) or set(heads) != {n_heads}:
        problems.append(f"the teacher has pruned heads (heads per layer {heads})")
    elif shape.heads != n_heads:
        problems.append(f"heads {shape.heads} vs teacher {n_heads}")
    widths = sorted(set(st.ffn_widths(teacher)))
    if widths != [shape.ffn]:
        problems.append(f"FFN width {shape.ffn} vs teacher {', '.join(map(str, widths))}")
    return problems


def _check_layers(layers: list[int], n_teacher: int, n_student: int) -> list[int]:
    layers = [int(i) for i in layers]
    if len(layers) != n_student:
        raise CompressError(
            f"{len(layers)} teacher layers given ({layers}) for a {n_student}-layer student; give exactly {n_student}"
        )
    bad = [i for i in layers if not 0 <= i < n_teacher]
    if bad:
        raise CompressError(f"teacher layer {bad[0]} does not exist; valid: 0 to {n_teacher - 1} (0-based)")
    if any(b <= a for a, b in zip(layers, layers[1:])):
        raise CompressError(f"teacher layers {layers} must be strictly increasing")
    return layers


def _student_of_layers(teacher: nn.Module, shape: Shape, layers: list[int] | None) -> tuple[nn.Module, list[int]]:
    """A fresh ``shape`` student laid out as teacher ``layers`` (checked; default evenly spaced), weights still to fill."""
    n_teacher = len(st.encoder_layers(teacher))
    layers = _check_layers(every_kth(n_teacher, shape.layers) if layers is None else layers, n_teacher, shape.layers)
    config = _student_config(teacher, shape)
    st.inherit_layer_layout(config, teacher, layers)
    student = _build_like(teacher, config)
    st.place_layers(student)
    return student, layers


def _copy(target: nn.Module | None, source: nn.Module | None) -> list[nn.Module]:
    """Copy ``source``'s weights into ``target`` exactly; returns the modules it covered."""
    if target is None and source is None:
        return []
    if target is None or source is None:
        raise CompressError("the student and teacher differ in whether they have a pooler or task head")
    target.load_state_dict(source.state_dict(), strict=True)
    return [target]


def init_from_teacher(
    teacher: nn.Module, shape: Shape, layers: list[int] | None = None
) -> tuple[nn.Module, list[int]]:
    """A student made of teacher layers, as DistilBERT initialises from every other layer (Sanh et al. 2019).

    Copies exactly the embeddings, the chosen encoder ``layers`` (0-based teacher layer
    indices, strictly increasing, one per student layer; default :func:`every_kth`), the
    pooler, any final norm and the task head. The student must share the teacher's hidden
    size, heads and FFN width. A layer whose layout depends on its position (ModernBERT)
    keeps the teacher layer's. Returns ``(model, layers)``.
    """
    problems = _shape_mismatches(teacher, shape)
    if problems:
        raise CompressError(
            f"cannot initialise a {shape.label} student from the teacher's layers: {'; '.join(problems)}; "
            "use --init teacher-slices (a narrower student cut from the teacher's weights), --init random, "
            "or --init DIR with a pretrained student of that shape"
        )
    student, layers = _student_of_layers(teacher, shape, layers)
    covered = []
    for target, source in zip(st.encoder_layers(student), layers):
        covered += _copy(target, st.encoder_layers(teacher)[source])
    # Embeddings, pooler, final norm, task head: every part outside the layers, by name.
    outside, teacher_outside = st.outside_layers(student), st.outside_layers(teacher)
    if outside.keys() != teacher_outside.keys():
        raise CompressError("the student and teacher differ in whether they have a pooler or task head")
    for name, target in outside.items():
        covered += _copy(target, teacher_outside[name])
    student.tie_weights()  # MLM decoder shares the (copied) word embeddings
    _require_covered(student, covered)
    return student, layers


def _require_covered(model: nn.Module, covered: list[nn.Module]) -> None:
    """Guard against a head type whose weights the copy above would silently leave random."""
    copied = {id(p) for module in covered for p in module.parameters()}
    left = [name for name, p in model.named_parameters() if id(p) not in copied]
    if left:
        raise RuntimeError(f"init_from_teacher left {len(left)} parameters uncopied, e.g. {left[0]}")


def init_from_teacher_slices(
    teacher: nn.Module, shape: Shape, layers: list[int] | None = None, seed: int = 0
) -> tuple[nn.Module, list[int]]:
    """A student narrower than its teacher, every weight cut from the teacher's ``layers`` (see ``slices.py``).

    Hidden size, heads, head size and FFN width may each be at most the teacher's;
    ``layers`` as for :func:`init_from_teacher`. ``seed`` fixes the random-token probe
    that ranks hidden dimensions. Returns ``(model, layers)``.
    """
    student, layers = _student_of_layers(teacher, shape, layers)
    cut_from_teacher(student, teacher, shape, layers, seed)
    return student, layers


# ---------------------------------------------------------------------------- random and pretrained


def init_random(teacher: nn.Module, shape: Shape, seed: int = 0) -> nn.Module:
    """A randomly initialised student of ``shape`` with the teacher's class and task config (BERT's init).

    Vocabulary, positions, segments, labels and problem type come from the teacher.
    The global RNG state is left as it was.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return _build_like(teacher, _student_config(teacher, shape))


def load_pretrained_student(teacher: nn.Module, path: str | Path, seed: int = 0) -> tuple[nn.Module, dict[str, Any]]:
    """A pretrained student directory loaded with the teacher's head and labels; its own shape and vocabulary win.

    A head the directory lacks starts new, drawn from ``seed``: the same for the same seed. Whether its vocabulary
    may differ from the teacher's (it reads its own tokenizer) is the distillation's to decide
    (``compress.distill.steps.build_student``)."""
    arch = type(teacher).__name__
    head = head_of_class(arch)
    if head is None:
        raise CompressError(f"cannot match a {arch} teacher's head; valid teacher classes: {', '.join(class_names())}")
    labels = {}
    if HEADS[head].trained and HEADS[head].outputs == ("logits",):  # a classifier, per text or per token: the teacher's labels
        labels = {"num_labels": teacher.config.num_labels, "id2label": dict(teacher.config.id2label)}
    model, info = load_model(path, head=head, with_info=True, seed=seed, **labels)
    model.config.problem_type = teacher.config.problem_type
    ref = next(teacher.parameters())
    model.to(device=ref.device, dtype=ref.dtype).train(teacher.training)
    return model, {"pretrained": str(path), "new_weights": info["new_weights"]}


@INIT_METHODS.register("teacher-layers")
def _teacher_layers(teacher, shape, *, layers, seed, pretrained):
    model, used = init_from_teacher(teacher, shape, layers)
    return model, {"teacher_layers": used}


@INIT_METHODS.register("teacher-slices")
def _teacher_slices(teacher, shape, *, layers, seed, pretrained):
    model, used = init_from_teacher_slices(teacher, shape, layers, seed)
    return model, {"teacher_layers": used}


@INIT_METHODS.register("teacher")
def _teacher(teacher, shape, *, layers, seed, pretrained):
    # The teacher's layers as they are for a student of its width, cut for a narrower one.
    if not _shape_mismatches(teacher, shape):
        method = "teacher-layers"
    else:
        problems = cut_problems(teacher, shape)
        if problems:
            raise CompressError(f"a {shape.label} student cannot start from the teacher's weights: {'; '.join(problems)}; "
                                "choose a shape no wider than the teacher, or --init random")
        method = "teacher-slices"
    model, details = INIT_METHODS.get(method)(teacher, shape, layers=layers, seed=seed, pretrained=None)
    return model, {**details, "method": method}


@INIT_METHODS.register("random")
def _random(teacher, shape, *, layers, seed, pretrained):
    return init_random(teacher, shape, seed), {"seed": seed}


@INIT_METHODS.register("pretrained")
def _pretrained(teacher, shape, *, layers, seed, pretrained):
    if pretrained is None:
        raise CompressError("--init pretrained needs a student model directory (pretrained=PATH)")
    return load_pretrained_student(teacher, pretrained, seed=seed)


def init_student(
    teacher: nn.Module,
    shape: Shape | None,
    method: str = "teacher",
    layers: list[int] | None = None,
    seed: int = 0,
    pretrained: str | Path | None = None,
) -> tuple[nn.Module, dict[str, Any]]:
    """Build a student by ``method`` (``teacher``, ``teacher-layers``, ``teacher-slices``, ``random`` or ``pretrained``).

    ``teacher`` is ``teacher-layers`` for a student of the teacher's width and
    ``teacher-slices`` for a narrower one; one wider in some size (or a pruned teacher) is refused.

    Returns ``(model, info)``; ``info`` holds ``method``, ``teacher_layers`` (the 0-based
    teacher layers copied, or None) and method details. For ``pretrained`` the directory's
    own shape is used and ``shape`` may be None.
    """
    build = INIT_METHODS.get(method)
    if layers is not None and method not in TEACHER_METHODS:
        raise CompressError(f"teacher layers apply only to --init teacher-layers or teacher-slices, not {method!r}")
    if shape is None and method != "pretrained":
        raise CompressError(f"--init {method} needs a student shape")
    model, details = build(teacher, shape, layers=layers, seed=seed, pretrained=pretrained)
    return model, {"method": details.pop("method", method), "teacher_layers": details.pop("teacher_layers", None), **details}
