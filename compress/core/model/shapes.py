"""Encoder shapes: the :class:`Shape` of a model, the named presets, and the one config block that picks one.

A shape is layers x hidden width x attention heads x FFN width. Named presets come from
the papers that published them (teachers: Turc et al.'s small BERTs and BERT-base/large;
students: DistilBERT, TinyBERT, MiniLM); any other is written ``LAYERSL-HIDDEN[-FFN]``.
:class:`StudentShape` is the option block every distillation stage nests (``--student``,
the ``--layers/--hidden/--heads/--ffn`` sizes, ``--init``, ``--init-layers``) and
:class:`ShapeSizes` the sizes alone, which pretraining nests beside its ``--shape``: the
options are declared once here and stay flat on the command line and in recipes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from compress.core.config import flat_keywords, option
from compress.core.errors import CompressError
from compress.core.registry import Registry


@dataclass(frozen=True)
class Shape:
    """An encoder shape: layers, hidden width, attention heads, FFN width."""

    layers: int
    hidden: int
    heads: int
    ffn: int
    origin: str = ""  # where the shape was published

    def __post_init__(self):
        for name in ("layers", "hidden", "heads", "ffn"):
            if getattr(self, name) < 1:
                raise CompressError(f"shape {name} must be at least 1, got {getattr(self, name)}")
        if self.hidden % self.heads:
            raise CompressError(f"hidden size {self.hidden} is not divisible by {self.heads} heads")

    @property
    def label(self) -> str:
        return f"{self.layers}L-{self.hidden}" + (f"-{self.ffn}" if self.ffn != 4 * self.hidden else "")


def parse_shape(text: str) -> Shape:
    """``"4L-312-1200"`` or ``"6L-384"`` (FFN 4x hidden, heads = hidden/64 or 12 if it divides)."""
    m = re.fullmatch(r"(\d+)L-(\d+)(?:-(\d+))?(?:-(\d+)H)?", text.strip(), flags=re.IGNORECASE)
    if not m:
        raise CompressError(f"cannot read shape {text!r}; write LAYERSL-HIDDEN[-FFN], e.g. 4L-312-1200")
    layers, hidden = int(m[1]), int(m[2])
    ffn = int(m[3]) if m[3] else 4 * hidden
    heads = int(m[4]) if m[4] else (hidden // 64 if hidden % 64 == 0 and hidden >= 64 else 1)
    return Shape(layers, hidden, heads, ffn)


TEACHER_SHAPES: Registry[Shape] = Registry("teacher shape")
for _name, _shape in {
    # Small BERTs from Turc et al. 2019 ("Well-Read Students Learn Better"), BERT-base/large from Devlin et al.
    "2L-128": Shape(2, 128, 2, 512, "Turc et al. 2019 (BERT-tiny)"),
    "4L-256": Shape(4, 256, 4, 1024, "Turc et al. 2019 (BERT-mini)"),
    "4L-512": Shape(4, 512, 8, 2048, "Turc et al. 2019 (BERT-small)"),
    "8L-512": Shape(8, 512, 8, 2048, "Turc et al. 2019 (BERT-medium)"),
    "base": Shape(12, 768, 12, 3072, "Devlin et al. 2019 (BERT-base)"),
    "large": Shape(24, 1024, 16, 4096, "Devlin et al. 2019 (BERT-large)"),
}.items():
    TEACHER_SHAPES.register(_name, _shape)

STUDENT_SHAPES: Registry[Shape] = Registry("student shape")
for _name, _shape in {
    "6L-768": Shape(6, 768, 12, 3072, "DistilBERT (Sanh et al. 2019); TinyBERT-6L (Jiao et al. 2020)"),
    "4L-312": Shape(4, 312, 12, 1200, "TinyBERT-4L (Jiao et al. 2020)"),
    "6L-384": Shape(6, 384, 12, 1536, "MiniLM-L6-H384 (Wang et al. 2020)"),
    "3L-384": Shape(3, 384, 12, 1536, "MiniLM-style 3-layer (Wang et al. 2020 shape, half depth)"),
    "2L-128": Shape(2, 128, 2, 512, "BERT-tiny (Turc et al. 2019)"),
}.items():
    STUDENT_SHAPES.register(_name, _shape)


def resolve_shape(name: str, *, layers: int | None = None, hidden: int | None = None, heads: int | None = None,
                  ffn: int | None = None) -> Shape:
    """A named student or teacher shape, or an explicit ``LAYERSL-HIDDEN[-FFN]``, with explicit overrides.

    Overriding ``hidden`` alone keeps BERT's proportions: FFN 4 x hidden and, when the
    named shape's head count does not divide the new width, 64-wide heads.
    """
    base = _named_shape(name)
    if layers is hidden is heads is ffn is None:
        return base
    new_hidden = base.hidden if hidden is None else hidden
    if heads is None:
        heads = base.heads if new_hidden % base.heads == 0 else max(1, new_hidden // 64)  # (a zero width fails below)
    if ffn is None:
        ffn = base.ffn if hidden is None else 4 * new_hidden
    return Shape(base.layers if layers is None else layers, new_hidden, heads, ffn)


def _named_shape(name: str) -> Shape:
    if name in STUDENT_SHAPES:
        return STUDENT_SHAPES.get(name)
    if name in TEACHER_SHAPES:
        return TEACHER_SHAPES.get(name)
    try:
        return parse_shape(name)
    except Exception:
        names = sorted(set(STUDENT_SHAPES.names()) | set(TEACHER_SHAPES.names()))
        raise CompressError(
            f"unknown shape {name!r}; use one of {', '.join(names)} or LAYERSL-HIDDEN[-FFN] (e.g. 4L-312-1200)"
        ) from None


# ---------------------------------------------------------------------------- the option blocks

OTHER = "LAYERSL-HIDDEN[-FFN]"  # an explicit shape, beside the presets a flag lists
TEACHER_METHODS = ("teacher", "teacher-layers", "teacher-slices")  # the methods that take ``layers``
INIT_HELP = ("how the student starts: teacher (its layers, cut to a narrower student's width), teacher-layers (the "
             "teacher's layers, same width only), teacher-slices (the teacher's most important slices), random (for a "
             "student wider than its teacher), or a pretrained model DIR (a distill-general student of the same shape: "
             "TinyBERT's path, with --two-stage and --losses kd,hard,hidden,attention)")


@dataclass(frozen=True)
class ShapeSizes:
    """Sizes that override a named shape's (each None: the shape's own)."""

    heads: int | None = option(None, "attention heads per layer (a size; overrides the shape's)")
    layers: int | None = option(None, "layers (a size; overrides the shape's)")
    hidden: int | None = option(None, "hidden width (a size; overrides the shape's; FFN then defaults to 4x)")
    ffn: int | None = option(None, "FFN width (a size; overrides the shape's)")

    def apply(self, name: str) -> Shape:
        """The shape ``name`` with these sizes in place of its own."""
        return resolve_shape(name, layers=self.layers, hidden=self.hidden, heads=self.heads, ffn=self.ffn)


@flat_keywords
@dataclass(frozen=True)
class StudentShape:
    """The student a distillation stage builds: its shape, and how it starts."""

    student: str = option("6L-384", "student shape: a preset or LAYERSL-HIDDEN[-FFN]", choices=STUDENT_SHAPES.names,
                          other=OTHER)
    sizes: ShapeSizes = field(default_factory=ShapeSizes)
    init: str = option("teacher", INIT_HELP)
    init_layers: tuple[int, ...] = option((), "teacher layers (0-based) copied into the student (default: evenly spaced)",
                                          metavar="L[,...]")

    def resolve(self) -> Shape:
        """The student's shape: the preset (or explicit shape) with the size overrides."""
        return self.sizes.apply(self.student)
