"""Student shapes with their published origin."""

from __future__ import annotations

from compress.core.errors import CompressError
from compress.core.registry import Registry
from compress.core.structure import Shape, parse_shape
from compress.teacher.presets import TEACHER_SHAPES

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
