"""Which of the variants each backend makes of a ``compress auto`` candidate this CPU runs (:func:`usable`).

The tables themselves (:data:`TASK_VARIANTS`, :data:`EMBEDDING_VARIANTS`) are what ``--backends`` is checked against,
so they live with the options in :mod:`compress.auto.config`, apart from the runtimes. A variant is ``(name, how)``: ``how`` is None (the fp32 folder itself), or ``(kind, backend, scheme)`` with kind
``export`` (scheme: the runtime's floating-point precision, None for fp32) or ``quantize`` (scheme: dynamic or static).
"""

from __future__ import annotations

from compress.auto.config import BF16_VARIANTS, EMBEDDING_VARIANTS, TASK_VARIANTS, Variant  # noqa: F401
from compress.core.formats.openvino_runtime import openvino_bf16


def usable(table: dict[str, tuple[Variant, ...]], backends: tuple[str, ...]) -> list[Variant]:
    """The variants of ``backends`` in ``table`` this CPU runs as what they are (bf16 ones where it has bf16 kernels)."""
    bf16 = "openvino" in backends and openvino_bf16()
    return [v for name in backends for v in table[name] if bf16 or v[0] not in BF16_VARIANTS]
