"""The ``onnxruntime`` int8 backend: ``onnxruntime.quantization`` on the fp32 ONNX graph, dynamic or static.

The plain fp32 ONNX export (``compress.core.formats.onnx``) is quantized by
``onnxruntime.quantization`` with the CPU's preset (the presets Optimum's
``AutoQuantizationConfig`` names), dynamic or static (min-max calibration on training
examples). Stored as ``model.onnx`` (format ``onnx``). By default the export is quantized
*unfused* (the session applies its own fusions at load). With ``fuse`` the graph is first
fused by ONNX Runtime's transformer optimizer (``compress.core.formats.onnx.fuse_onnx``) and typed
by its symbolic shape inference, without which the quantizer fails on the com.microsoft
nodes (dynamic: no type for the MatMul after an Attention; static: activations left
unquantized, or no scale for a shared bias). Dynamic then quantizes the fused Attention
(QAttention) and EmbedLayerNormalization too; static QDQ has no Attention quantizer, so the
fused attention (its Q/K/V projection included) stays fp32 there. The dynamic preset also
quantizes the embedding Gathers.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from compress.core import hardware
from compress.core.errors import CompressError
from compress.core.formats.artifacts import artifact_format, load_config
from compress.core.formats.layout import ONNX_FILE
from compress.core.formats.records import read_compression
from compress.core.formats.onnx import copy_sidecars, export_onnx, fuse_onnx
from compress.core.formats.architecture import structure_of
from compress.core.logs import quiet_root_logger
from compress.core.model.structure import input_names
from compress.quantize.job import Job


def resolve_preset(preset: str) -> str:
    """The ONNX Runtime preset for this CPU: arm64, avx512_vnni (int8 weights) or avx2 (uint8)."""
    if preset != "auto":
        return preset
    return hardware.precisions().int8_preset  # looked up on the module at call time: tests fake the CPU


# ONNX Runtime's CPU presets: (weight type, reduce range); activations are always uint8,
# weights symmetric, activations asymmetric (the presets Optimum's AutoQuantizationConfig names).
ORT_PRESETS = {"avx512_vnni": ("QInt8", False), "avx2": ("QUInt8", False), "arm64": ("QInt8", False)}


class _CalibrationReader:
    """``onnxruntime.quantization.CalibrationDataReader`` over the calibration batches (int64 numpy)."""

    def __init__(self, batches: list[dict[str, Any]]):
        self._batches = iter(batches)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._batches, None)


def quantize_onnxruntime(job: Job) -> dict[str, Any]:
    """onnxruntime.quantization on the plain fp32 export (with ``fuse``: the fused one); the result is this
    directory's model.onnx.

    Dynamic: integer ops (QOperator), weights per preset, activations quantized at run time.
    Static: QDQ nodes with min/max ranges from the calibration batches. The quantizer
    classes are driven exactly as Optimum's ``ORTQuantizer`` drives them (same options, the
    graph as exported, no shape-inference pass), so the int8 graph is the same on every
    transformers version, including 5.x where Optimum's ONNX Runtime integration is absent.
    A fused graph is the exception: it gets ONNX Runtime's symbolic shape inference first
    (:func:`_fp32_graph`).
    """
    # deferred: a heavy import, paid only where it is used
    import onnx

    # deferred: a heavy import, paid only where it is used
    from onnxruntime.quantization import CalibrationMethod, QuantizationMode, QuantType, create_calibrator

    # deferred: a heavy import, paid only where it is used
    from onnxruntime.quantization.onnx_quantizer import ONNXQuantizer

    # deferred: a heavy import, paid only where it is used
    from onnxruntime.quantization.qdq_quantizer import QDQQuantizer

    # deferred: a heavy import, paid only where it is used
    from onnxruntime.quantization.registry import IntegerOpsRegistry, QDQRegistry

    preset = resolve_preset(job.cfg.preset)
    static = job.cfg.scheme == "static"
    weight_type, reduce_range = ORT_PRESETS[preset]
    operators = list(QDQRegistry if static else IntegerOpsRegistry)
    options = {
        "WeightSymmetric": True, "ActivationSymmetric": False, "EnableSubgraph": False, "ForceSymmetric": False,
        "AddQDQPairToWeight": False, "DedicatedQDQPair": False, "QDQOpTypePerChannelSupportToAxis": {"MatMul": 1},
    }
    with tempfile.TemporaryDirectory(prefix=".work-", dir=job.out) as work, quiet_root_logger():
        work = Path(work)
        fp32 = work / "fp32"
        structure, fusion = _fp32_graph(job, fp32)
        common = {
            "model": onnx.load(fp32 / ONNX_FILE), "per_channel": job.cfg.per_channel, "reduce_range": reduce_range,
            "weight_qType": getattr(QuantType, weight_type), "activation_qType": QuantType.QUInt8,
            "nodes_to_quantize": [], "nodes_to_exclude": [], "op_types_to_quantize": operators, "extra_options": options,
        }
        if static:
            calibrator = create_calibrator(
                fp32 / ONNX_FILE, operators, augmented_model_path=str(work / "augmented.onnx"),
                calibrate_method=CalibrationMethod.MinMax, extra_options={"symmetric": False, "moving_average": False},
            )
            names = input_names(job.reference)  # the graph's inputs (no token_type_ids for DistilBERT, ModernBERT)
            calibrator.collect_data(_CalibrationReader([{k: b[k] for k in names} for b in job.calibration.batches]))
            quantizer = QDQQuantizer(tensors_range=calibrator.compute_data(), **common)
        else:
            quantizer = ONNXQuantizer(mode=QuantizationMode.IntegerOps, static=False, tensors_range=None, **common)
        quantizer.quantize_model()
        quantizer.model.save_model_to_file(str(job.out / ONNX_FILE))
        copy_sidecars(fp32, job.out)
    return {
        "structure": structure,
        "preset": preset,
        "onnx_quantization": {
            "format": "QDQ" if static else "QOperator", "mode": "QLinearOps" if static else "IntegerOps",
            "weights": weight_type, "activations": "QUInt8", "operators": operators,
        },
        **fusion,
    }


def _fp32_graph(job: Job, fp32: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Write the fp32 graph to quantize into ``fp32``: the parent's ONNX, or its export; with ``fuse``, ONNX Runtime's
    fused graph. The graph's structure and the record's ``fusion``/``fused`` fields (empty when not fused)."""
    if artifact_format(job.parent_dir) == "onnx":
        fp32.mkdir()
        shutil.copy2(job.parent_dir / ONNX_FILE, fp32 / ONNX_FILE)
        copy_sidecars(job.parent_dir, fp32)
        structure = structure_of(job.parent_dir)
    else:
        export_onnx(job.parent_dir, fp32)
        structure = structure_of(fp32)  # the graph's: a classifier's last layer computes the first token only
    parent = read_compression(job.parent_dir)
    if job.cfg.fuse:
        done = fuse_onnx(fp32 / ONNX_FILE, structure, load_config(job.parent_dir).model_type, job.parent_dir)
        fusion = {"fusion": done["counts"], "fused": done["settings"]}
    elif parent.get("fused"):  # a `compress export --fuse` folder: its graph is fused already
        fusion = {"fusion": parent.get("fusion"), "fused": parent["fused"]}
    else:
        return structure, {}
    _infer_shapes(fp32 / ONNX_FILE)
    return structure, {**fusion, "fused": {**fusion["fused"], "shape_inference": "onnxruntime symbolic"}}


def _infer_shapes(path: Path) -> None:
    """ONNX Runtime's symbolic shape inference, in place. The quantizer needs every MatMul input's type, and ONNX's
    own inference gives none after a com.microsoft node: without this, dynamic quantization of a fused graph stops
    ("Unable to find data type for weight_name") and static calibration leaves activations unquantized or fails."""
    # deferred: a heavy import, paid only where it is used
    import onnx

    # deferred: a heavy import, paid only where it is used
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    try:
        inferred = SymbolicShapeInference.infer_shapes(onnx.load(path), auto_merge=True)
    except Exception as err:  # bare Exception ("Incomplete symbolic shape inference"), ValueError, TypeError
        raise CompressError(f"ONNX Runtime's symbolic shape inference failed on the fused graph, which its quantizer "
                            f"needs: {str(err).splitlines()[0]}; quantize without --fuse") from None
    onnx.save(inferred, path)
