"""The variants each backend makes of a ``compress auto`` candidate, for a task model or a sentence-embedding folder.

A variant is ``(name, how)``: ``how`` is None (the fp32 folder itself), or ``(kind, backend, scheme)`` with kind
``export`` (scheme: the runtime's floating-point precision, None for fp32) or ``quantize`` (scheme: dynamic or static).
"""

from __future__ import annotations

from typing import Any

from compress.core.formats.openvino_runtime import openvino_bf16

Variant = tuple[str, Any]  # (name, how)

# What each backend contributes to a task model: (variant name, how it is made from an fp32 student folder).
TASK_VARIANTS: dict[str, tuple[Variant, ...]] = {
    "torch": (("torch-fp32", None), ("torch-int8", ("quantize", "torch", "dynamic"))),
    "onnxruntime": (("onnxruntime-int8", ("quantize", "onnxruntime", "dynamic")),),
    "openvino": (("openvino-fp32", ("export", "openvino", None)), ("openvino-bf16", ("export", "openvino", "bf16")),
                 ("openvino-int8", ("quantize", "openvino", "static"))),
    "inc": (("inc-int8", ("quantize", "inc", "static")),),
}
# What each backend contributes to an embedding folder: ONNX Runtime's int8 is static (calibrated on the search's
# training sentences); INC cannot calibrate an embedding folder.
EMBEDDING_VARIANTS: dict[str, tuple[Variant, ...]] = {
    "torch": (("torch-fp32", None), ("torch-int8", ("quantize", "torch", "dynamic"))),
    "onnxruntime": (("onnxruntime-int8", ("quantize", "onnxruntime", "static")),),
    "openvino": (("openvino-fp32", ("export", "openvino", None)), ("openvino-bf16", ("export", "openvino", "bf16")),
                 ("openvino-int8", ("quantize", "openvino", "static"))),
}
# Variants that only a CPU with bf16 kernels (AVX512_BF16, AMX-BF16) runs as such: elsewhere they would be their fp32.
BF16_VARIANTS = ("openvino-bf16",)


def usable(table: dict[str, tuple[Variant, ...]], backends: tuple[str, ...]) -> list[Variant]:
    """The variants of ``backends`` in ``table`` this CPU runs as what they are (bf16 ones where it has bf16 kernels)."""
    bf16 = "openvino" in backends and openvino_bf16()
    return [v for name in backends for v in table[name] if bf16 or v[0] not in BF16_VARIANTS]
