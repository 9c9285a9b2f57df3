"""Which of the variants each backend makes of a ``compress auto`` candidate this CPU runs and this teacher's candidates
take (:func:`usable`, :func:`skipped`), and how an exported one is written (:func:`export_config`).

The tables themselves (:data:`TASK_VARIANTS`, :data:`EMBEDDING_VARIANTS`) are what ``--backends`` is checked against,
so they live with the options in :mod:`compress.auto.config`, apart from the runtimes. A variant is ``(name, how)``: ``how`` is None (the fp32 folder itself), or ``(kind, backend, scheme)`` with kind
``export`` (scheme: OpenVINO's floating-point precision or CTranslate2's quantization, None for fp32) or ``quantize``
(scheme: dynamic or static).
"""

from __future__ import annotations

from pathlib import Path

from compress.auto.config import BF16_VARIANTS, EMBEDDING_VARIANTS, TASK_VARIANTS, Variant  # noqa: F401
from compress.core.formats.ctranslate2 import refusal
from compress.core.formats.folder import open_folder
from compress.core.formats.layout import CTRANSLATE2
from compress.core.formats.openvino_runtime import openvino_bf16
from compress.export_config import ExportConfig


def usable(table: dict[str, tuple[Variant, ...]], backends: tuple[str, ...], teacher_dir: Path | None = None) -> list[Variant]:
    """The variants of ``backends`` in ``table`` this CPU runs as what they are (bf16 ones where it has bf16 kernels),
    less those the candidates of ``teacher_dir`` cannot be made into (:func:`skipped`)."""
    bf16 = "openvino" in backends and openvino_bf16()
    left_out = skipped(table, backends, teacher_dir) if teacher_dir is not None else {}
    return [v for name in backends for v in table[name] if (bf16 or v[0] not in BF16_VARIANTS) and v[0] not in left_out]


def skipped(table: dict[str, tuple[Variant, ...]], backends: tuple[str, ...], teacher_dir: Path) -> dict[str, str]:
    """The variants of ``backends`` that no candidate of ``teacher_dir`` is made into, each with its one-line reason:
    CTranslate2's where its export refuses the teacher (its family or head) or CTranslate2 is not installed."""
    if CTRANSLATE2 not in backends:
        return {}
    # A candidate has the teacher's family and head, and is fp32 with one head count and FFN width in every layer
    # (a shape of the grid): what the export asks of the teacher's folder is what it would ask of every candidate.
    why = refusal(open_folder(teacher_dir))
    return {name: why for name, _ in table[CTRANSLATE2]} if why else {}


def export_config(backend: str, scheme: str | None) -> ExportConfig:
    """How an ``export`` variant is written: OpenVINO's scheme is the precision its CPU plugin is asked for, CTranslate2's
    the weights' quantization (int8 by its own converter)."""
    if backend == CTRANSLATE2:
        return ExportConfig(format=backend, quantization=scheme or "float32")
    return ExportConfig(format=backend, precision=scheme or "fp32")
