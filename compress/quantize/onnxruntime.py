"""The ``onnxruntime`` int8 backend: ``onnxruntime.quantization`` on the fp32 ONNX graph, dynamic or static.

The plain fp32 ONNX export (``compress.core.formats.onnx``) is quantized by
``onnxruntime.quantization`` with the CPU's preset (the presets Optimum's
``AutoQuantizationConfig`` names). Stored as ``model.onnx`` (format ``onnx``). By default the
export is quantized *unfused* (the session applies its own fusions at load). With ``fuse``
the graph is first fused by ONNX Runtime's transformer optimizer
(``compress.core.formats.onnx.fuse_onnx``) and typed by its symbolic shape inference, without
which the quantizer fails on the com.microsoft nodes (dynamic: no type for the MatMul after
an Attention; static: activations left unquantized, or no scale for a shared bias). Dynamic
then quantizes the fused Attention (QAttention) and EmbedLayerNormalization too; static QDQ
has no Attention quantizer, so the fused attention (its Q/K/V projection included) stays
fp32 there. The dynamic preset also quantizes the embedding Gathers.

Dynamic: integer ops (QOperator), weights per preset, activations quantized at run time,
driven exactly as Optimum's ``ORTQuantizer`` drives the quantizer.

Static: QDQ nodes with ranges from the calibration rows, in a :class:`StaticRecipe`. The
``plain`` recipe is Optimum's (every operator the QDQ quantizer takes, min-max ranges on the
padded batches). On all-MiniLM-L6-v2 it broke the embeddings (mean cosine 0.82 to fp32) and
cost a WNUT-17 teacher 7.7 F1: LayerNorm inputs (the residual stream, with its outlier
dimensions) quantized per tensor, MatMul outputs (attention scores, the FFN output)
quantized, and every reader of a quantized tensor, the residual ``Add`` included, reading
it through its DequantizeLinear. The ``measured`` recipe, the default, quantizes the inputs
of MatMul, Gemm and Gather only, per output channel, ranges from each calibration example
at its own length; nodes never asked to be quantized read fp32 again; and each quantized
node's error is measured (``compress.quantize.ort_search``), the nodes that break the
outputs staying fp32 (``nodes_to_exclude``, recorded with the measurements).
bench/results/2026-12-07/ort-int8 holds the measurements behind each choice.
"""

from __future__ import annotations

import copy
import io
import shutil
import tempfile
from contextlib import contextmanager, redirect_stdout
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from compress.core import hardware
from compress.core.errors import CompressError, reason
from compress.core.formats.artifacts import artifact_format, load_config
from compress.core.formats.layout import ONNX_FILE
from compress.core.formats.records import read_compression
from compress.core.formats.onnx import copy_sidecars, export_onnx, fuse_onnx
from compress.core.formats.architecture import structure_of
from compress.core.logs import quiet_root_logger
from compress.core.model.structure import input_names
from compress.quantize import ort_search as search
from compress.quantize.calibration import Calibration
from compress.quantize.job import Job


def resolve_preset(preset: str) -> str:
    """The ONNX Runtime preset for this CPU: arm64, avx512_vnni (int8 weights) or avx2 (uint8)."""
    if preset != "auto":
        return preset
    return hardware.precisions().int8_preset  # looked up on the module at call time: tests fake the CPU


# ONNX Runtime's CPU presets: (weight type, reduce range); activations are always uint8,
# weights symmetric, activations asymmetric (the presets Optimum's AutoQuantizationConfig names).
ORT_PRESETS = {"avx512_vnni": ("QInt8", False), "avx2": ("QUInt8", False), "arm64": ("QInt8", False)}


@dataclass(frozen=True)
class StaticRecipe:
    """How the static scheme quantizes: which operators, how ranges are calibrated, which nodes stay fp32."""

    name: str
    operators: tuple[str, ...] | None  # the operators whose inputs get QDQ nodes (None: all the QDQ quantizer takes)
    calibration: str = "minmax"  # minmax, entropy or percentile (onnxruntime.quantization.CalibrationMethod)
    symmetric_activations: bool = False  # activation zero point fixed at the middle (else from the range)
    reduce_range: bool | None = None  # 7-bit weights (None: the preset's)
    own_length: bool = True  # calibrate on each example at its own length (else on the padded batches)
    matmul_outputs: bool = False  # QDQ on MatMul outputs too (attention scores, the FFN output)
    fp32_consumers: bool = True  # nodes not asked to be quantized read fp32 activations, not a DequantizeLinear's
    search: bool = True  # measure each quantized node and keep the ones that break the outputs fp32


PLAIN = StaticRecipe("plain", None, own_length=False, matmul_outputs=True, fp32_consumers=False, search=False)
MEASURED = StaticRecipe("measured", ("MatMul", "Gemm", "Gather"))
RECIPES = {recipe.name: recipe for recipe in (MEASURED, PLAIN)}
_RECIPE: ContextVar[StaticRecipe] = ContextVar("ort_static_recipe", default=MEASURED)


@contextmanager
def static_recipe(recipe: StaticRecipe) -> Iterator[StaticRecipe]:
    """Quantize statically with ``recipe`` inside the block (the default is :data:`MEASURED`)."""
    token = _RECIPE.set(recipe)
    try:
        yield recipe
    finally:
        _RECIPE.reset(token)


class _CalibrationReader:
    """``onnxruntime.quantization.CalibrationDataReader`` over the calibration batches (int64 numpy)."""

    def __init__(self, batches: list[dict[str, Any]]):
        self._batches = iter(batches)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._batches, None)


def quantize_onnxruntime(job: Job) -> dict[str, Any]:
    """onnxruntime.quantization on the plain fp32 export (with ``fuse``: the fused one); the result is this
    directory's model.onnx.

    Dynamic: integer ops (QOperator), weights per preset, activations quantized at run time,
    the quantizer classes driven exactly as Optimum's ``ORTQuantizer`` drives them (same
    options, the graph as exported, no shape-inference pass), so the int8 graph is the same on
    every transformers version, including 5.x where Optimum's ONNX Runtime integration is
    absent. Static: QDQ nodes in the current :class:`StaticRecipe` (:func:`_quantize_static`).
    A fused graph gets ONNX Runtime's symbolic shape inference first (:func:`_fp32_graph`).
    """
    # deferred: a heavy import, paid only where it is used
    import onnx

    preset = resolve_preset(job.cfg.preset)
    static = job.cfg.scheme == "static"
    with tempfile.TemporaryDirectory(prefix=".work-", dir=job.out) as work, quiet_root_logger():
        work = Path(work)
        fp32 = work / "fp32"
        structure, fusion = _fp32_graph(job, fp32)
        quantize = _quantize_static if static else _quantize_dynamic
        model, details = quantize(job, fp32 / ONNX_FILE, work, ORT_PRESETS[preset])
        onnx.save(model, str(job.out / ONNX_FILE))
        copy_sidecars(fp32, job.out)
    return {"structure": structure, "preset": preset, "onnx_quantization": details, **fusion}


def _options(weight_symmetric: bool = True, **changes) -> dict[str, Any]:
    """The quantizer's extra options as Optimum sets them, with ``changes``."""
    return {"WeightSymmetric": weight_symmetric, "ActivationSymmetric": False, "EnableSubgraph": False,
            "ForceSymmetric": False, "AddQDQPairToWeight": False, "DedicatedQDQPair": False,
            "QDQOpTypePerChannelSupportToAxis": {"MatMul": 1}, **changes}


def _quantize_dynamic(job: Job, path: Path, work: Path, preset: tuple[str, bool]) -> tuple[Any, dict[str, Any]]:
    """Dynamic int8 (QOperator integer ops) of the fp32 graph at ``path``; the model and its record."""
    # deferred: a heavy import, paid only where it is used
    import onnx

    # deferred: a heavy import, paid only where it is used
    from onnxruntime.quantization import QuantizationMode, QuantType

    # deferred: a heavy import, paid only where it is used
    from onnxruntime.quantization.onnx_quantizer import ONNXQuantizer

    # deferred: a heavy import, paid only where it is used
    from onnxruntime.quantization.registry import IntegerOpsRegistry

    weight_type, reduce_range = preset
    operators = list(IntegerOpsRegistry)
    quantizer = ONNXQuantizer(
        model=onnx.load(path), per_channel=job.cfg.per_channel, reduce_range=reduce_range,
        weight_qType=getattr(QuantType, weight_type), activation_qType=QuantType.QUInt8, nodes_to_quantize=[],
        nodes_to_exclude=[], op_types_to_quantize=operators, extra_options=_options(),
        mode=QuantizationMode.IntegerOps, static=False, tensors_range=None,
    )
    quantizer.quantize_model()
    quantizer.model.topological_sort()  # the quantizer appends its nodes; a saved graph is sorted
    return quantizer.model.model, {"format": "QOperator", "mode": "IntegerOps", "weights": weight_type,
                                   "activations": "QUInt8", "operators": operators}


def _quantize_static(job: Job, path: Path, work: Path, preset: tuple[str, bool]) -> tuple[Any, dict[str, Any]]:
    """Static QDQ int8 of the fp32 graph at ``path`` in the current recipe; the model and its record (the recipe, the
    ranges, the nodes kept fp32 and the measurements that chose them)."""
    # deferred: a heavy import, paid only where it is used
    import onnx

    # deferred: a heavy import, paid only where it is used
    from onnxruntime.quantization.registry import QDQRegistry

    recipe = _RECIPE.get()
    weight_type, preset_reduce = preset
    reduce_range = preset_reduce if recipe.reduce_range is None else recipe.reduce_range
    operators = list(recipe.operators or QDQRegistry)
    fp32 = onnx.load(path)
    search.name_nodes(fp32)  # nodes are matched by name between the fp32 and the int8 graph
    onnx.save(fp32, str(path))
    names = input_names(job.reference)  # the graph's inputs (no token_type_ids for DistilBERT, ModernBERT)
    rows = job.calibration.rows(names)
    ranges = _calibrate(path, operators, recipe, job.calibration, names, work)
    settings = {"per_channel": job.cfg.per_channel, "reduce_range": reduce_range, "weight_type": weight_type,
                "operators": operators, "ranges": ranges}
    model, restored = _qdq(fp32, settings, recipe, ())
    measured = None
    if recipe.search:
        probe = rows[: search.SEARCH_ROWS]
        reference = search.run_rows(fp32, probe)
        measured = search.search(search.Graphs(fp32, model), probe, reference)
        excluded = [c["node"] for c in measured["excluded"]]
        if excluded:  # quantized again with them excluded: the written graph is the quantizer's own
            model, restored = _qdq(fp32, settings, recipe, excluded)
        measured["output_error_written"] = search.output_error(model, probe, reference)
    return model, {
        "format": "QDQ", "mode": "QLinearOps", "recipe": recipe.name,
        "weights": f"{weight_type} symmetric, per {'channel' if job.cfg.per_channel else 'tensor'}",
        "activations": f"QUInt8 {'symmetric' if recipe.symmetric_activations else 'asymmetric'}, per tensor",
        "reduce_range": reduce_range, "operators": operators,
        "calibration": {"method": recipe.calibration, "rows": len(rows),
                        "inputs": "each example at its own length" if recipe.own_length else "padded batches"},
        "matmul_outputs": "int8" if recipe.matmul_outputs else "fp32", "fp32_consumers": restored,
        "nodes_to_exclude": [c["node"] for c in measured["excluded"]] if measured else [],
        "exclusion_search": measured,
    }


def _calibrate(path: Path, operators: list[str], recipe: StaticRecipe, calibration: Calibration, names: tuple[str, ...],
               work: Path):
    """The activation ranges of the graph at ``path``: the recipe's method over the calibration rows (each at its own
    length, one pass each) or, in the plain recipe, min-max over the padded batches in one pass."""
    # deferred: a heavy import, paid only where it is used
    from onnxruntime.quantization import CalibrationMethod, create_calibrator

    method = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
              "percentile": CalibrationMethod.Percentile}[recipe.calibration]
    options = {"symmetric": False, "moving_average": False} if method == CalibrationMethod.MinMax else {"symmetric": False}
    calibrator = create_calibrator(path, operators, augmented_model_path=str(work / "augmented.onnx"),
                                   calibrate_method=method, extra_options=options)
    # One collection per row: ranges and histograms merge across calls, and a histogram method cannot stack
    # tensors of different lengths in one call. The histogram methods print their progress: kept off stdout.
    groups = [[row] for row in calibration.rows(names)] if recipe.own_length else [
        [{k: b[k] for k in names} for b in calibration.batches]]
    with redirect_stdout(io.StringIO()):
        for group in groups:
            calibrator.collect_data(_CalibrationReader(group))
        return calibrator.compute_data()


def _qdq(fp32, settings: dict[str, Any], recipe: StaticRecipe, excluded) -> tuple[Any, int]:
    """The QDQ int8 graph of ``fp32`` (left as it is) with ``excluded`` nodes kept fp32; how many inputs of nodes not
    asked to be quantized were given their fp32 activations back (the recipe's ``fp32_consumers``)."""
    # deferred: a heavy import, paid only where it is used
    from onnxruntime.quantization import QuantType

    # deferred: a heavy import, paid only where it is used
    from onnxruntime.quantization.qdq_quantizer import QDQQuantizer

    changes = {"ActivationSymmetric": recipe.symmetric_activations}
    if not recipe.matmul_outputs:
        changes["OpTypesToExcludeOutputQuantization"] = ["MatMul"]
    quantizer = QDQQuantizer(
        model=copy.deepcopy(fp32), per_channel=settings["per_channel"], reduce_range=settings["reduce_range"],
        weight_qType=getattr(QuantType, settings["weight_type"]), activation_qType=QuantType.QUInt8,
        tensors_range=settings["ranges"], nodes_to_quantize=[], nodes_to_exclude=list(excluded),
        op_types_to_quantize=settings["operators"], extra_options=_options(**changes),
    )
    requested = {n.name for n in quantizer.model.nodes() if quantizer.should_quantize_node(n)}
    quantizer.quantize_model()
    quantizer.model.topological_sort()  # the quantizer appends its nodes; a saved (or edited) graph is sorted
    model = quantizer.model.model
    restored = search.fp32_consumers(model, requested) if recipe.fp32_consumers else 0
    return model, restored


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
                            f"needs: {reason(err)}; quantize without --fuse") from None
    onnx.save(inferred, path)
