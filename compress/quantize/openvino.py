"""The ``openvino`` int8 backend: NNCF post-training static quantization of the parent's OpenVINO IR, with accuracy control.

The OpenVINO IR of the fp32 parent (``compress.core.formats.openvino``; a PyTorch or ONNX
directory) gets int8 weights (per output channel, symmetric) and uint8 activations with
ranges from the calibration batches (NNCF's ``mixed`` preset, ``ModelType.TRANSFORMER``,
which also applies SmoothQuant). The pooler and a classification or span head stay fp32 (a
PyTorch parent's; recorded as ``fp32_matmuls``): at b1 they are one [CLS] vector, and
quantized they cost the STS-B teacher 2.3 Pearson points. With ``max_drop``, NNCF's accuracy
control (``quantize_with_accuracy_control``) scores candidates by the task's primary dev
metric and returns layers to fp32 until the drop fits; if it cannot run, plain quantization
and the stage's guard decide. Stored as an int8 IR (``openvino_model.xml`` + ``.bin``, format
``openvino``), checked to run its layers' matrix multiplications in int8.
"""

from __future__ import annotations

import io
import logging
import sys
from contextlib import contextmanager, redirect_stdout
from typing import Any, Iterator

import numpy as np

from compress.core.data.features import encode_examples
from compress.core.errors import CompressError, reason
from compress.core.formats.onnx import copy_sidecars
from compress.core.formats.layout import OPENVINO_FILE
from compress.core.formats.openvino import INT8_TYPES, convert, int8_weights, matmuls_outside, no_telemetry, save_ir
from compress.core.formats.openvino_runtime import OpenVINORunner, compile_openvino, inference_precision, layer_precisions
from compress.core.formats.runners import Runner
from compress.core.logs import show_bars
from compress.core.model.heads import HEADS
from compress.core.model.structure import layers_path
from compress.eval.evaluate import dev_evaluator
from compress.quantize.calibration import Calibration
from compress.quantize.job import Job


def quantize_openvino(job: Job) -> dict[str, Any]:
    """NNCF static int8 of the parent's OpenVINO IR; an int8 IR whose matrix multiplications run in int8."""
    with quiet_nncf():
        # deferred: a heavy import, paid only where it is used
        import nncf

        converted = convert(job.parent_dir)  # fp32 IR: PyTorch (any structure) or ONNX parent
        names = converted.inputs  # the IR's inputs: no token_type_ids for DistilBERT, ModernBERT
        items = _openvino_calibration(job.calibration, names)
        calibration = nncf.Dataset(items)
        examples = len(items)
        weights = nncf.AdvancedQuantizationParameters(
            weights_quantization_params=nncf.quantization.advanced_parameters.QuantizationParameters(per_channel=job.cfg.per_channel),
        )
        settings = {"preset": nncf.QuantizationPreset.MIXED, "model_type": nncf.ModelType.TRANSFORMER,
                    "subset_size": examples}  # every calibration example
        # The pooler and a classification or span head stay fp32: their error reaches the output unattenuated (the
        # STS-B teacher's int8 lost 2.3 Pearson points with them quantized, none without), and they cost next to
        # nothing (one [CLS] vector; two outputs a token). An MLM head's vocabulary projection is no such thing.
        keep = not HEADS[job.head].masked_lm and not isinstance(job.reference, Runner)  # an ONNX parent: no module to name the layers by
        head = matmuls_outside(converted.model, layers_path(job.reference)) if keep else []
        if head:
            settings["ignored_scope"] = nncf.IgnoredScope(names=head)
        control = None
        if job.cfg.max_drop is not None and job.task is not None:  # with --eval-tasks the guard after quantizing decides
            quantized, control = _openvino_accuracy_control(nncf, job, converted, calibration, settings, weights)
        else:
            quantized = nncf.quantize(converted.model, calibration, advanced_parameters=weights, **settings)
    stored = int8_weights(quantized)
    if not stored:
        raise CompressError(f"NNCF left no int8 weight in the OpenVINO model of {job.parent_dir}"
                            + (" (accuracy control returned every layer to fp32)" if control and control.get("used") else ""))
    save_ir(quantized, job.out)
    copy_sidecars(job.parent_dir, job.out)
    compiled = compile_openvino(job.out / OPENVINO_FILE)  # as evaluation and latency will run it
    ran = layer_precisions(compiled)
    if not any(ran.get(kind) for kind in INT8_TYPES):
        raise CompressError(f"OpenVINO runs none of the int8 model's matrix multiplications in int8 ({ran}); it was not written")
    return {
        "structure": converted.structure,  # the graph's: a classifier's last layer computes the first token only
        "outputs": list(converted.outputs),
        "source_format": converted.source_format,
        "inference_precision": inference_precision(compiled),  # what the non-int8 layers run in
        "layer_precisions": ran,
        "openvino_quantization": {
            "tool": "nncf", "preset": "mixed", "model_type": "transformer", "subset_size": examples,
            "weights": f"int8 symmetric, per {'channel' if job.cfg.per_channel else 'tensor'}",
            "activations": "8-bit asymmetric, per tensor", "int8_weight_matrices": stored,
            "fp32_matmuls": head,
            "accuracy_control": control,
        },
    }


def _openvino_calibration(calibration: Calibration, names: list[str]) -> list[dict[str, np.ndarray]]:
    """One NNCF item per calibration example, (1, its own length): padding positions stay out of the ranges."""
    items = []
    for batch in calibration.batches:
        for row, length in enumerate(batch["attention_mask"].sum(axis=1)):
            items.append({name: batch[name][row : row + 1, : int(length)] for name in names})
    return items


def _openvino_accuracy_control(nncf, job: Job, converted, calibration, settings: dict[str, Any], weights) -> tuple[Any, dict[str, Any]]:
    """``nncf.quantize_with_accuracy_control`` scored by the task's primary metric on the first dev split.

    NNCF validates the fp32 and int8 models on the dev examples, ranks layer groups by how
    much they change each example's outputs, and returns groups to fp32 until the drop is
    at most ``max_drop`` points. If that API fails, plain ``nncf.quantize`` runs instead and
    the toolkit's own guard (in :func:`compress.quantize.run.quantize`) decides; the record says which happened.
    """
    split, examples = next(iter(job.dev.items()))
    metric = job.task.primary_metric
    encoded = encode_examples(job.task, job.tokenizer, examples, job.max_length)  # one unpadded sequence per example

    def inputs_of(index: int) -> dict[str, np.ndarray]:
        ids = np.asarray([encoded["input_ids"][index]], dtype=np.int64)  # (1, seq)
        return {name: np.asarray([encoded[name][index]], dtype=np.int64) if name in encoded else np.zeros_like(ids)
                for name in converted.inputs}

    def validate(compiled, items) -> tuple[float, list[list[np.ndarray]]]:
        """(the primary metric on these dev examples, every example's outputs, for NNCF's ranking)."""
        items = [int(i) for i in items]
        runner = OpenVINORunner(job.parent_dir, job.reference.config, job.head, compiled=compiled)
        score = dev_evaluator(job.task, job.tokenizer, {split: examples.select(items)}, job.max_length,
                              batch_size=job.cfg.data.eval_batch_size, doc_stride=job.cfg.data.doc_stride)(runner)
        return float(score[metric]), [list(compiled(inputs_of(i)).values()) for i in items]

    record = {"split": split, "metric": metric, "examples": len(examples), "max_drop": job.cfg.max_drop}
    try:
        model = nncf.quantize_with_accuracy_control(
            converted.model, calibration, nncf.Dataset(list(range(len(examples))), inputs_of), validate,
            max_drop=job.cfg.max_drop, drop_type=nncf.DropType.ABSOLUTE,  # metrics are in points
            advanced_quantization_parameters=weights,
            advanced_accuracy_restorer_parameters=nncf.AdvancedAccuracyRestorerParameters(num_ranking_workers=1),
            **settings,
        )
    except Exception as err:  # the API refused this model or task: the guard still applies
        why = reason(err)
        model = nncf.quantize(converted.model, calibration, advanced_parameters=weights, **settings)
        return model, {**record, "used": False, "reason": f"{type(err).__name__}: {why}"}
    return model, {**record, "used": True}


@contextmanager
def quiet_nncf() -> Iterator[None]:
    """NNCF without usage telemetry, with errors only (it logs each step at INFO on stdout), and its
    progress bars (rich, on stdout) on stderr where ours would show, nowhere otherwise."""
    with no_telemetry():
        # deferred: a heavy import, paid only where it is used
        import nncf  # noqa: F401  (decides about telemetry and resets its log level when first imported)

        nncf_logger = logging.getLogger("nncf")
        level = nncf_logger.level
        nncf_logger.setLevel(logging.ERROR)
        try:
            with redirect_stdout(sys.stderr if show_bars() else io.StringIO()):
                yield
        finally:
            nncf_logger.setLevel(level)

