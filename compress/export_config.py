"""``compress export``'s options (:class:`ExportConfig`) and the formats it writes.

Kept apart from :mod:`compress.export` (torch, ONNX, OpenVINO, CTranslate2) so that ``compress export --help`` and a
refused option cost no heavy import; the exporters are registered under :data:`EXPORT_FORMATS`'s names there
(tests/test_startup.py keeps the two equal).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from compress.core.config import check_name, option
from compress.core.errors import CompressError
from compress.core.formats.layout import CTRANSLATE2, QUANTIZATIONS, check_quantization

# The formats an export writes, in the order --help lists them.
EXPORT_FORMATS = ("onnx", "openvino", CTRANSLATE2)


@dataclass(frozen=True)
class ExportConfig:
    format: str = option("onnx", "target format: onnx (ONNX Runtime, Optimum), openvino (OpenVINO IR) or ctranslate2 "
                                 "(a CTranslate2 Encoder folder, the task head beside it)", choices=EXPORT_FORMATS)
    opset: int = option(17, "ONNX opset of a torch -> ONNX export")
    tolerance: float | None = option(None, "largest output difference accepted by the check (default: 1e-3; 0.5 where "
                                           "the source or the written folder is int8, whose graphs a converter may "
                                           "re-fuse; 0.1 for bf16)")
    precision: Literal["fp32", "bf16"] = option(
        "fp32", "openvino: the precision the folder asks the CPU plugin to run its floating-point layers in; bf16 runs "
                "the matrix products on AVX512_BF16 or AMX-BF16 units where the CPU has them (its weights stay fp32, and "
                "on a CPU without bf16 kernels it runs in fp32); the export's check then uses a bf16 tolerance")
    fuse: bool = option(False, "onnx: write ONNX Runtime's transformer-optimised graph (fused Attention, SkipLayerNormalization, "
                               "EmbedLayerNormalization, Gelu nodes of the com.microsoft domain, which ONNX Runtime runs) "
                               "instead of the plain one; the number of each fused operator is recorded")
    quantization: str = option("float32", "ctranslate2: the weights' type in model.bin (CTranslate2's converter quantizes "
                                          "them): float32, int8 (int8 weights, float32 activations on the CPU), "
                                          "int8_float32 (the same, the other weights kept float32) or bfloat16",
                               choices=tuple(QUANTIZATIONS))

    def validate(self) -> None:
        check_name("export format", self.format, EXPORT_FORMATS)  # an unknown format: the valid ones named
        check_quantization(self.quantization)
        if self.quantization != "float32" and self.format != CTRANSLATE2:
            raise CompressError(f"--quantization {self.quantization} is CTranslate2's weight type; use it with --format "
                                "ctranslate2 (for ONNX Runtime or OpenVINO int8: compress quantize --backend onnxruntime "
                                "or --backend openvino)")
        if self.precision != "fp32" and self.format != "openvino":
            raise CompressError(f"--precision {self.precision} is an OpenVINO inference precision; use it with --format openvino "
                                "(for ONNX Runtime int8: compress quantize --backend onnxruntime)")
        if self.fuse and self.format != "onnx":
            raise CompressError(f"--fuse writes ONNX Runtime's fused graph, an ONNX file; use it with --format onnx "
                                f"(--format {self.format} converts the plain graph and fuses it in its own compiler)")
