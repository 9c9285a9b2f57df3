"""Post-training int8 quantization of a model directory, with checked outputs and an accuracy guard.

``quantize(model_dir, out, cfg)`` turns an fp32 model directory into an int8 one that
``compress eval`` and ``compress latency`` load like any other (through
``compress.core.formats.runtime``). Three backends, chosen by name from :data:`BACKENDS`:

* ``torch``: PyTorch dynamic quantization of every ``nn.Linear`` (qint8 weights, per
  output channel; activations quantized per batch at run time). Stored as int8 values +
  scales + zero points in ``model.int8.safetensors`` (format ``torch-int8-dynamic``; stock
  loaders find no ``model.safetensors`` and refuse the folder).
* ``onnxruntime``: the plain fp32 ONNX export (``compress.core.formats.onnx``) quantized by
  ``onnxruntime.quantization`` with the CPU's preset (the presets Optimum's
  ``AutoQuantizationConfig`` names), dynamic or static (min-max calibration on training
  examples). Stored as ``model.onnx`` (format ``onnx``). By default the export is quantized
  *unfused* (the session applies its own fusions at load). With ``fuse`` the graph is first
  fused by ONNX Runtime's transformer optimizer (``compress.core.formats.onnx.fuse_onnx``) and typed
  by its symbolic shape inference, without which the quantizer fails on the com.microsoft
  nodes (dynamic: no type for the MatMul after an Attention; static: activations left
  unquantized, or no scale for a shared bias). Dynamic then quantizes the fused Attention
  (QAttention) and EmbedLayerNormalization too; static QDQ has no Attention quantizer, so the
  fused attention (its Q/K/V projection included) stays fp32 there.
* ``inc``: Intel Neural Compressor 3.x static post-training quantization on a
  ``torch.export`` (PT2E) graph with dynamic batch and sequence dimensions, int8
  weights folded in, saved with ``torch.export.save`` as ``model.pt2`` (format
  ``inc-pt2e``); the runtime compiles it with inductor freezing, without which it is
  not faster than fp32, one static graph per padded input shape
  (``compress.core.formats.runtime.padded_shape``). Its ``qat`` scheme is quantization-aware training on the same
  graph and the same x86 inductor int8 scheme (torchao's ``prepare_qat_pt2e``; INC 3.x
  has no PT2E QAT of its own): fake-quantized weights and activations are trained for
  ``qat_steps`` to match the fp32 parent's outputs on the task's training inputs
  (logit matching, no labels needed), then converted like the static result.
* ``openvino``: NNCF post-training static quantization of the OpenVINO IR of the fp32
  parent (``compress.core.formats.openvino``; a PyTorch or ONNX directory): int8 weights (per
  output channel, symmetric) and uint8 activations with ranges from the calibration
  batches (NNCF's ``mixed`` preset, ``ModelType.TRANSFORMER``, which also applies
  SmoothQuant). The pooler and a classification or span head stay fp32 (a PyTorch
  parent's; recorded as ``fp32_matmuls``): at b1 they are one [CLS] vector, and quantized
  they cost the STS-B teacher 2.3 Pearson points. With ``max_drop``, NNCF's accuracy control
  (``quantize_with_accuracy_control``) scores candidates by the task's primary dev metric
  and returns layers to fp32 until the drop fits; if it cannot run, plain quantization
  and the guard below decide. Stored as an int8 IR (``openvino_model.xml`` + ``.bin``,
  format ``openvino``), checked to run its layers' matrix multiplications in int8.

Embeddings stay fp32 in the torch and inc backends (ONNX Runtime's dynamic preset also
quantizes the embedding Gathers), so a BERT-base shrinks about 2.4x there, not 4x.

Nothing is trusted blindly: the int8 model is run next to the fp32 one on a few
examples and degenerate outputs (NaN/inf, all zeros, one constant output while the
fp32 outputs vary) abort the run with nothing written. With a task, both are scored on
its dev split (at the eval batch size ``compress eval`` uses by default, recorded: dynamic
int8 scores move with batch composition); with ``max_drop`` a larger drop of the primary
metric moves the result to ``<out>.rejected`` and fails. The command prints both scores,
the drop and the output check.

A sentence-embedding folder (a base encoder, sentence-transformers files beside it) has no
task: with ``corpus`` / ``sentences_from`` its unlabelled sentences (gathered as embedding
distillation gathers them) calibrate the static schemes, tokenised as SentenceTransformer
tokenises them, and a disjoint held-out set checks the result: the mean cosine between each
sentence's fp32 and int8 embeddings (pooled and normalised as the folder says), refused
below ``min_cosine``, and with ``eval_tasks`` the pair tasks' embedding scores, refused
when one drops more than ``max_drop``.
"""

from __future__ import annotations

import copy
import io
import itertools
import logging
import os
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch.export import Dim

from compress.core import hardware
from compress.core.formats import runtime
from compress.core.formats.artifacts import (
    COMPRESSION_FILE,
    METRICS_FILE,
    ONNX_FILE,
    append_metrics,
    apply_umask,
    artifact_format,
    check_output,
    compression_record,
    is_quantized,
    load_config,
    load_tokenizer,
    output_dir,
    read_compression,
    read_metrics,
    require_model_dir,
    saved_head,
    write_json_atomic,
)
from compress.core.formats.card import sentence_loading_line
from compress.core.config import flat_keywords, option
from compress.core.data.sources import TaskData, check_max_length, encode_examples, load_split
from compress.core.errors import CompressError
from compress.core.logs import errors_only, quiet_root_logger, show_bars
from compress.core.formats.onnx import OUTPUTS, _Positional, copy_sidecars, export_onnx, format_fusion, fuse_onnx
from compress.core.formats.openvino import (
    INT8_TYPES,
    OPENVINO,
    OPENVINO_FILE,
    OpenVINORunner,
    compile_openvino,
    convert,
    inference_precision,
    int8_weights,
    layer_precisions,
    matmuls_outside,
    no_telemetry,
    save_ir,
)
from compress.core.registry import Registry
from compress.core.data.resolve import resolve_task, task_fields, task_of_model
from compress.core.formats.runtime import INPUTS, PT2_FILE, Runner, load_model, quantize_linears, structure_of, write_torch_int8
from compress.core.formats.sentence import (
    SentenceSpec, copy_sentence_files, finish, is_sentence_folder, pooled, prepare_texts, read_spec,
)
from compress.core.model.structure import config_sizes, describe, input_names, layers_path, model_inputs
from compress.core.data.tasks import Task, get_task, is_kind, task_choices
from compress.distill.embedding import EmbeddingDistillConfig, embedding_scorers, embedding_sentences
from compress.eval.embeddings import EMBEDDING_EVAL, embedding_record
from compress.eval.embeddings import primary_metric as embedding_primary_metric
from compress.eval.evaluate import dev_evaluator, format_table, split_records
from compress.eval.latency.runs import megabytes, size_on_disk

SCHEMES = ("dynamic", "static", "qat")
PRESETS = ("auto", "avx512_vnni", "avx2", "arm64")
CALIBRATION_BATCH = 8  # sequences per calibration forward pass
# The backends that calibrate a sentence-embedding folder (a bare encoder): INC's PT2E annotator fails on its graph.
EMBEDDING_STATIC = ("onnxruntime", "openvino")
CHECK_EXAMPLES = 16  # examples run through fp32 and int8 side by side
CHECK_POSITIONS = 4  # per-token outputs (MLM logits) are compared on the first positions only
RANDOM_CHECK_LENGTH = 32  # tokens per random check sequence when no task is given
# The outputs each head returns, compared between fp32 and int8.
OUTPUT_NAMES = {
    "sequence-classification": ("logits",),
    "token-classification": ("logits",),
    "question-answering": ("start_logits", "end_logits"),
    "base": ("last_hidden_state",),
    "masked-lm": ("logits",),
    "pretraining": ("prediction_logits", "seq_relationship_logits"),
}
# An int8 output whose spread across examples is below this fraction of the fp32
# spread is "constant": the quantized model ignores its input.
CONSTANT_RATIO = 1e-3


@flat_keywords
@dataclass(frozen=True)
class QuantizeConfig:
    """How to quantize: backend and scheme, calibration, kernels preset, the accuracy guard."""

    backend: str = option("onnxruntime", "int8 backend: torch (PyTorch dynamic, Linear layers), onnxruntime (ONNX export + Optimum), inc (Neural Compressor 3.x static PT2E), openvino (OpenVINO IR + NNCF static; the pooler and task head stay fp32)",
                          choices=lambda: BACKENDS.names())
    scheme: str = option("dynamic", "dynamic (activation ranges per batch), static (calibrated) or qat (quantization-aware training); torch: dynamic, onnxruntime: dynamic/static, inc: static/qat, openvino: static",
                         choices=SCHEMES)
    task: str = option("", "task whose train split calibrates static ranges and whose dev split scores the result "
                       "(default with --train-file/--dev-file: the model's own task)", choices=task_choices)
    calibration_examples: int = option(128, "training examples (with --corpus/--sentences-from: sentences) for static "
                                       "calibration (a seeded random sample)")
    corpus: tuple[str, ...] = option(
        (), "for a sentence-embedding folder (no task): unlabelled text whose sentences calibrate static int8 and check "
        "the int8 embeddings: text files or folders of *.txt, datasets save_to_disk folders, or hf:NAME[:CONFIG]",
        metavar="PATH[,...]")
    sentences_from: tuple[str, ...] = option(
        (), "for a sentence-embedding folder (no task): GLUE tasks whose training sentences are added to that text "
        "(both sides of a pair; labels unused; read from --data-dir)", metavar="TASK[,...]")
    preset: str = option("auto", "onnxruntime kernels: auto (from the CPU's flags), avx512_vnni, avx2, arm64", choices=PRESETS)
    per_channel: bool = option(True, "one weight scale per output channel (else one per tensor)")
    fuse: bool = option(False, "onnxruntime: quantize ONNX Runtime's transformer-optimised graph (fused Attention, "
                               "SkipLayerNormalization, EmbedLayerNormalization, Gelu nodes) instead of the plain export; "
                               "dynamic quantizes the fused Attention too, static leaves it fp32")
    max_drop: float | None = option(None, "refuse the result when the dev primary metric (with --eval-tasks: each task's "
                                    "embedding score) drops by more than this many points")
    check_sentences: int = option(256, "with --corpus/--sentences-from: held-out sentences (never calibrated on; at most "
                                       "half the text) embedded by the fp32 and the int8 model and compared by cosine")
    min_cosine: float | None = option(None, "with --corpus/--sentences-from: refuse the result when the mean cosine of its "
                                            "embeddings to the fp32 ones is below this (0 < X <= 1)")
    eval_tasks: tuple[str, ...] = option(
        (), "with --corpus/--sentences-from: pair tasks whose dev split scores the fp32 and int8 embeddings: stsb (cosine "
        "Spearman), mrpc, qqp, rte ... (retrieval MRR)", metavar="TASK[,...]")
    seed: int = option(0, "seed for choosing the calibration examples (and the held-out check sentences)")
    qat_steps: int = option(200, "qat: optimizer steps of quantization-aware training (batches of 8 calibration examples)")
    qat_lr: float = option(1e-6, "qat: AdamW learning rate (small: int8 grid steps are ~1e-3 of the weights)")
    data: TaskData = field(default_factory=TaskData)

    def validate(self) -> None:
        backend = BACKENDS.get(self.backend)  # unknown names list the valid ones
        if self.scheme not in SCHEMES:
            raise CompressError(f"unknown --scheme {self.scheme!r}; valid: {', '.join(SCHEMES)}")
        if self.scheme not in backend.schemes:
            raise CompressError(
                f"the {self.backend} backend does not do {self.scheme} quantization; "
                f"it does {', '.join(backend.schemes)}"
            )
        self._validate_data()
        if self.qat_steps < 1 or self.qat_lr <= 0:
            raise CompressError(f"--qat-steps must be at least 1 and --qat-lr positive, got {self.qat_steps} and {self.qat_lr}")
        if self.task and not is_kind(self.task):
            get_task(self.task)
        if self.calibration_examples < 1:
            raise CompressError(f"--calibration-examples must be at least 1, got {self.calibration_examples}")
        if self.preset not in PRESETS:
            raise CompressError(f"unknown --preset {self.preset!r}; valid: {', '.join(PRESETS)}")
        if self.preset != "auto" and self.backend != "onnxruntime":
            raise CompressError(f"--preset chooses ONNX Runtime kernels; the {self.backend} backend has none (leave it at auto)")
        if self.fuse and self.backend != "onnxruntime":
            raise CompressError(f"--fuse quantizes ONNX Runtime's fused graph; use it with --backend onnxruntime, not {self.backend}")

    def _validate_data(self) -> None:
        """What calibrates and what scores: a task's rows, or a sentence-embedding folder's unlabelled sentences."""
        if self.embedding and self.has_task:
            raise CompressError("--corpus/--sentences-from are for a sentence-embedding folder without a task; with --task "
                                "(or --train-file) the task's own training rows calibrate, so drop --corpus/--sentences-from")
        if self.scheme == "static" and not self.has_task and not self.embedding:
            raise CompressError("static quantization needs a task's training examples to calibrate on; pass --task, e.g. "
                                "--task sst2, or your task's --train-file and --dev-file; for a sentence-embedding folder, "
                                "unlabelled sentences: --corpus FILE_OR_DIR[,...] or --sentences-from TASK[,...]")
        if self.scheme == "qat" and not self.has_task:
            raise CompressError("qat quantization needs a task's training examples to train on; pass --task, e.g. "
                                "--task sst2, or your task's --train-file and --dev-file")
        if self.embedding and self.scheme == "static" and self.backend not in EMBEDDING_STATIC:
            raise CompressError(f"static int8 of a sentence-embedding folder runs on --backend {' or '.join(EMBEDDING_STATIC)}; "
                                f"the {self.backend} backend fails on a bare encoder's graph")
        if self.max_drop is not None and not self.has_task and not self.eval_tasks:
            raise CompressError("--max-drop compares dev scores; pass --task too (or your task's --train-file and --dev-file), "
                                "or --eval-tasks for a sentence-embedding folder")
        if (self.min_cosine is not None or self.eval_tasks) and not self.embedding:
            raise CompressError("--min-cosine and --eval-tasks check a sentence-embedding folder's int8 embeddings; pass the "
                                "unlabelled text they are checked on too: --corpus FILE_OR_DIR[,...] or --sentences-from TASK[,...]")
        if self.min_cosine is not None and not 0 < self.min_cosine <= 1:
            raise CompressError(f"--min-cosine is a mean cosine similarity: pass a number in (0, 1], got {self.min_cosine:g}")
        if self.check_sentences < 1:
            raise CompressError(f"--check-sentences must be at least 1, got {self.check_sentences}")
        if self.embedding:
            self.sentence_config().validate()  # the sentence sources and eval tasks, checked as distillation checks them

    @property
    def has_task(self) -> bool:
        """Whether a task's data is given: a task name, or a user's files (the task is then the model's own)."""
        return bool(self.task or self.data.train_file)

    @property
    def embedding(self) -> bool:
        """Whether unlabelled sentences are given: a sentence-embedding folder is calibrated and checked on them."""
        return bool(self.corpus or self.sentences_from)

    def sentence_config(self) -> EmbeddingDistillConfig:
        """The sentence sources as embedding distillation reads them (its seeded order is this config's seed)."""
        return EmbeddingDistillConfig(corpus=self.corpus, sentences_from=self.sentences_from, data_dir=self.data.data_dir,
                                      eval_tasks=self.eval_tasks, heldout_sentences=0, seed=self.seed)


# ---------------------------------------------------------------------------- backends


@dataclass
class Job:
    """What a backend needs: the parent, where to write, the config, calibration inputs."""

    parent_dir: Path
    out: Path  # the temporary output directory
    cfg: QuantizeConfig
    head: str
    reference: Any  # the fp32 parent as loaded (torch model, or ONNX runner)
    calibration: "Calibration"
    # The task and its dev data, for a backend that scores candidates itself (openvino's accuracy control).
    task: Task | None = None
    tokenizer: Any = None
    dev: dict[str, Any] | None = None  # split name -> raw dev examples, as the accuracy guard scores them
    max_length: int | None = None


@dataclass(frozen=True)
class Backend:
    """One quantization backend: what it does and the function that writes its files."""

    schemes: tuple[str, ...]
    format: str  # compression.json "format" of its outputs
    packages: tuple[str, ...]  # versions recorded in compression.json
    run: Callable[[Job], dict[str, Any]]  # writes model files into job.out; extra record fields
    needs_torch: bool = True  # reads PyTorch weights (an ONNX parent will not do)
    heads: tuple[str, ...] | None = None  # heads it can export (None: all)


BACKENDS: Registry[Backend] = Registry("quantization backend")


def _quantize_torch(job: Job) -> dict[str, Any]:
    """PyTorch dynamic int8: every Linear gets qint8 weights; stored as int8 + scales."""
    model = quantize_linears(copy.deepcopy(job.reference), per_channel=job.cfg.per_channel)
    write_torch_int8(model, job.out)
    copy_sidecars(job.parent_dir, job.out)
    return {"engine": _torch_engine()}


def _torch_engine() -> str:
    return torch.backends.quantized.engine  # the kernels packed weights are laid out for (x86, qnnpack)


def resolve_preset(preset: str) -> str:
    """The ONNX Runtime preset for this CPU: arm64, avx512_vnni (int8 weights) or avx2 (uint8)."""
    if preset != "auto":
        return preset
    info = hardware.cpu_info()  # looked up on the module at call time: tests fake the CPU
    if info["arch"].lower() in ("arm64", "aarch64"):
        return "arm64"
    # avx2's preset uses uint8 weights with reduced range: 3x slower where VNNI exists.
    return "avx512_vnni" if "avx512_vnni" in info["flags"] else "avx2"


# ONNX Runtime's CPU presets: (weight type, reduce range); activations are always uint8,
# weights symmetric, activations asymmetric (the presets Optimum's AutoQuantizationConfig names).
ORT_PRESETS = {"avx512_vnni": ("QInt8", False), "avx2": ("QUInt8", False), "arm64": ("QInt8", False)}


class _CalibrationReader:
    """``onnxruntime.quantization.CalibrationDataReader`` over the calibration batches (int64 numpy)."""

    def __init__(self, batches: list[dict[str, Any]]):
        self._batches = iter(batches)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._batches, None)


def _quantize_onnxruntime(job: Job) -> dict[str, Any]:
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


def _quantize_inc(job: Job) -> dict[str, Any]:
    """Neural Compressor 3.x static PT2E: export, prepare, calibrate, convert (int8 weights folded), save."""

    positional = _Positional(copy.deepcopy(job.reference), OUTPUTS[job.head])
    wrapper, names = positional.module, positional.inputs
    example = job.calibration.example(names)
    batch = Dim("batch", min=1)
    seq = Dim("seq", min=2, max=config_sizes(job.reference.config).max_positions)
    dynamic = tuple({0: batch, 1: seq} for _ in names)  # one per positional input
    with quiet_inc():
        # deferred: a heavy import, paid only where it is used
        from neural_compressor.torch.algorithms.pt2e_quant.core import W8A8PT2EQuantizer

        # deferred: a heavy import, paid only where it is used
        from neural_compressor.torch.export import export

        # deferred: a heavy import, paid only where it is used
        from neural_compressor.torch.quantization import get_default_static_config, prepare

        try:
            exported = export(wrapper, example, dynamic_shapes=dynamic)
        except RuntimeError as err:
            raise CompressError(f"Neural Compressor could not export the model to a PT2E graph: {str(err).splitlines()[0]}") from None
        if job.cfg.scheme == "qat":
            converted, extra = _qat_pt2e(exported, wrapper, job)
        else:
            qconfig = get_default_static_config()
            prepared = prepare(exported, qconfig)
            with torch.no_grad():
                for inputs in job.calibration.tensors(names):
                    prepared(*inputs)  # observers record activation ranges
            # INC's convert() does not pass fold_quantize on, which would leave fp32 weights
            # behind q/dq nodes ("int8" stored in fp32); its own quantizer folds them to int8.
            converted = W8A8PT2EQuantizer(qconfig).convert(prepared, fold_quantize=True)
            extra = {"inc_config": qconfig.to_dict()}
        drop_unused_parameters(converted)
        program = torch.export.export(converted, example, dynamic_shapes=dynamic)
    torch.export.save(program, str(job.out / PT2_FILE))
    copy_sidecars(job.parent_dir, job.out)
    return {**extra, "outputs": list(OUTPUTS[job.head])}


def _qat_pt2e(exported, wrapper, job: Job) -> tuple[Any, dict[str, Any]]:
    """Fake-quantize the exported graph, train it to match the fp32 outputs, convert to int8.

    The observers first see every training batch once (the static calibration), then
    are frozen: moving ranges would coarsen the grid as batches vary and undo training.
    The loss is the mean squared error between the fake-quantized and the fp32 outputs
    (every output of the head: logits, or start and end logits), averaged over outputs;
    gradients pass the rounding by the straight-through estimator. The graph was
    exported in eval mode, so no dropout is in it.
    """
    # deferred: a heavy import, paid only where it is used
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_qat_pt2e

    # deferred: a heavy import, paid only where it is used
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer,
        get_default_x86_inductor_quantization_config,
    )

    quantizer = X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config(is_qat=True))
    prepared = prepare_qat_pt2e(exported, quantizer)
    batches = list(job.calibration.tensors(input_names(job.reference)))
    with torch.no_grad():
        targets = [tuple(t.detach() for t in wrapper(*inputs)) for inputs in batches]  # fp32 parent's outputs
        for inputs in batches:  # start from the static result: observers see every batch once ...
            prepared(*inputs)
    for module in prepared.modules():  # ... then the ranges stay fixed while the weights learn around them
        if hasattr(module, "disable_observer"):
            module.disable_observer()
    def loss_of(index: int):
        outputs = prepared(*batches[index])
        return sum(torch.nn.functional.mse_loss(o.float(), t.float()) for o, t in zip(outputs, targets[index])) / len(outputs)

    def mean_loss() -> float:  # over every training batch: before vs after is a like-for-like comparison
        with torch.no_grad():
            return sum(float(loss_of(i)) for i in range(len(batches))) / len(batches)

    optimizer = torch.optim.AdamW(prepared.parameters(), lr=job.cfg.qat_lr, weight_decay=0.0)
    torch.manual_seed(job.cfg.seed)
    started, before = time.monotonic(), mean_loss()
    for _, index in zip(range(job.cfg.qat_steps), itertools.cycle(range(len(batches)))):
        loss = loss_of(index)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    after = mean_loss()
    converted = convert_pt2e(prepared, fold_quantize=True)
    return converted, {"qat": {"steps": job.cfg.qat_steps, "lr": job.cfg.qat_lr, "loss": "mse to fp32 outputs",
                               "loss_before": before, "loss_after": after, "seconds": round(time.monotonic() - started, 1),
                               "quantizer": "torchao X86InductorQuantizer (is_qat=True)"}}


def drop_unused_parameters(graph_module) -> list[str]:
    """Delete parameters no graph node reads (the fp32 originals of folded int8 weights); their names."""
    used = {node.target for node in graph_module.graph.nodes if node.op == "get_attr"}
    dropped = [name for name, _ in graph_module.named_parameters() if name not in used]
    for name in dropped:
        owner, _, leaf = name.rpartition(".")
        delattr(graph_module.get_submodule(owner) if owner else graph_module, leaf)
    return dropped


@contextmanager
def quiet_inc() -> Iterator[None]:
    """Neural Compressor logs every step at INFO on stderr; keep its errors only."""
    # deferred: a heavy import, paid only where it is used
    from neural_compressor.common.utils.logger import Logger

    with errors_only(Logger().get_logger()):  # the singleton resets the level when first created
        yield


# ---------------------------------------------------------------------------- openvino (NNCF)


def _quantize_openvino(job: Job) -> dict[str, Any]:
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
        keep = job.head != "masked-lm" and not isinstance(job.reference, Runner)  # an ONNX parent: no module to name the layers by
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


def _openvino_calibration(calibration: "Calibration", names: list[str]) -> list[dict[str, np.ndarray]]:
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
    the toolkit's own guard (in :func:`quantize`) decides; the record says which happened.
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
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        model = nncf.quantize(converted.model, calibration, advanced_parameters=weights, **settings)
        return model, {**record, "used": False, "reason": f"{type(err).__name__}: {reason}"}
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


# The heads the graph backends quantize (not pretraining's two-headed output).
TASK_HEADS = ("sequence-classification", "token-classification", "question-answering", "base", "masked-lm")
BACKENDS.register("torch", Backend(("dynamic",), "torch-int8-dynamic", ("torch",), _quantize_torch))
BACKENDS.register("onnxruntime", Backend(
    ("dynamic", "static"), "onnx", ("torch", "onnx", "onnxruntime"), _quantize_onnxruntime,
    needs_torch=False, heads=TASK_HEADS,
))
BACKENDS.register("inc", Backend(
    ("static", "qat"), "inc-pt2e", ("torch", "neural-compressor-pt", "torchao"), _quantize_inc, heads=TASK_HEADS,
))
BACKENDS.register("openvino", Backend(
    ("static",), OPENVINO, ("torch", "openvino", "nncf"), _quantize_openvino, needs_torch=False, heads=TASK_HEADS,
))


# ---------------------------------------------------------------------------- calibration data


@dataclass
class Calibration:
    """Fixed-length int64 input batches (each (batch, length)) and where they came from."""

    batches: list[dict[str, Any]]
    source: dict[str, Any]

    def tensors(self, names: tuple[str, ...] = INPUTS) -> Iterator[tuple]:
        """Each batch as positional torch tensors ``names`` (input_ids, attention_mask[, token_type_ids])."""

        for batch in self.batches:
            yield tuple(torch.from_numpy(batch[name]) for name in names)

    def example(self, names: tuple[str, ...] = INPUTS) -> tuple:
        """The first batch as export's example inputs, at least 2 rows (a batch of 1 would be specialised)."""
        inputs = next(self.tensors(names))
        return tuple(torch.cat([t, t]) if t.shape[0] < 2 else t for t in inputs)

    def check_batches(self) -> list[dict[str, Any]]:
        """The first CHECK_EXAMPLES rows, in calibration-sized batches."""
        batches, left = [], CHECK_EXAMPLES
        for batch in self.batches:
            if left <= 0:
                break
            batches.append({k: v[:left] for k, v in batch.items()})
            left -= len(batch["input_ids"])
        return batches


def task_calibration(task: Task, tokenizer, cfg: QuantizeConfig, max_length: int, n: int) -> Calibration:
    """``n`` seeded random training examples of ``task``, tokenised and padded to ``max_length``."""
    train_src, _ = cfg.data.sources()
    ds = load_split(task, "train", train_src)
    n = min(n, len(ds))
    ds = ds.shuffle(seed=cfg.seed).select(range(n))
    enc = encode_examples(task, tokenizer, ds, max_length, padding="max_length", return_tensors="np")
    batches = _batches(enc, n)
    source = {"task": task.name, "split": "train", "examples": n, "max_length": max_length, "seed": cfg.seed,
              "data": cfg.data.describe()}
    return Calibration(batches, source)


def random_calibration(tokenizer, max_positions: int, seed: int) -> Calibration:
    """Random token sequences ([CLS] ... [SEP], varied lengths) for the output check when there is no task."""
    rng = np.random.default_rng(seed)
    length = min(RANDOM_CHECK_LENGTH, max_positions)
    special = set(tokenizer.all_special_ids)
    vocab = np.array([i for i in range(len(tokenizer)) if i not in special])
    ids = rng.choice(vocab, size=(CHECK_EXAMPLES, length))  # (examples, length)
    mask = np.ones_like(ids)
    for row, used in enumerate(rng.integers(length // 2, length + 1, size=CHECK_EXAMPLES)):
        ids[row, 0], ids[row, used - 1] = tokenizer.cls_token_id, tokenizer.sep_token_id
        ids[row, used:], mask[row, used:] = tokenizer.pad_token_id, 0
    enc = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    return Calibration(_batches(enc, CHECK_EXAMPLES), {"task": None, "split": None, "examples": CHECK_EXAMPLES, "inputs": "random token ids"})


@dataclass
class SentenceCheck:
    """A sentence-embedding folder's held-out check: sentences never calibrated on, and how the folder embeds them."""

    sentences: list[str]
    spec: SentenceSpec  # pooling, normalisation, lower-casing
    max_length: int  # tokens per sentence, as SentenceTransformer truncates them
    scorers: dict[str, tuple[Any, Any, Any]]  # --eval-tasks: task name -> (task, dev split, score(model))


def sentence_calibration(model_dir: Path, tokenizer, cfg: QuantizeConfig, max_positions: int) -> tuple[Calibration, SentenceCheck]:
    """A sentence-embedding folder's unlabelled sentences: a seeded calibration sample and disjoint check sentences.

    The sentences are gathered as embedding distillation gathers them (distinct, of at least
    ``min_words`` words, in the order ``cfg.seed`` shuffles them): the first ``check_sentences``
    (at most half) are held out for the cosine check, the next ``calibration_examples`` (the
    output check's few when nothing is calibrated) calibrate, tokenised as SentenceTransformer
    tokenises them, truncated at the folder's length and padded to the sample's longest.
    """
    spec = read_spec(model_dir)
    max_length = cfg.data.max_length or spec.max_length(tokenizer, max_positions)
    check_max_length(max_length, max_positions)
    sentence_cfg = cfg.sentence_config()
    sentences, sources = embedding_sentences(sentence_cfg)  # at least 2, or a one-line error
    n_check = min(cfg.check_sentences, len(sentences) // 2)  # a short text keeps at least half for calibration
    wanted = cfg.calibration_examples if cfg.scheme == "static" else CHECK_EXAMPLES
    held, chosen = sentences[:n_check], sentences[n_check : n_check + wanted]
    enc = tokenizer(prepare_texts(chosen, spec), padding="longest", truncation="longest_first", max_length=max_length,
                    return_tensors="np")  # (examples, the longest one's tokens)
    source = {
        "task": None, "split": None, "inputs": "unlabelled sentences", "examples": len(chosen), "sources": sources,
        "corpus": list(cfg.corpus), "sentences_from": list(cfg.sentences_from),
        "data": cfg.data.describe() if cfg.sentences_from else None, "min_words": sentence_cfg.min_words,
        "seed": cfg.seed, "max_length": max_length, "padded_length": int(enc["input_ids"].shape[1]),
        "check_sentences": n_check,
    }
    check = SentenceCheck(held, spec, max_length, embedding_scorers(sentence_cfg, tokenizer, spec))
    return Calibration(_batches(enc, len(chosen)), source), check


def _batches(enc, n: int) -> list[dict[str, Any]]:
    """Cut (n, length) arrays into int64 batches of CALIBRATION_BATCH rows."""

    arrays = {name: np.asarray(enc[name], dtype=np.int64) if name in enc else np.zeros_like(enc["input_ids"], dtype=np.int64) for name in INPUTS}
    return [{k: v[i : i + CALIBRATION_BATCH] for k, v in arrays.items()} for i in range(0, n, CALIBRATION_BATCH)]


# ---------------------------------------------------------------------------- output checks


def collect_outputs(model, batches: list[dict[str, Any]], names: tuple[str, ...]):
    """The model's outputs ``names`` on ``batches``, flattened per example: (examples, values) float64."""
    rows = []
    with torch.inference_mode():
        for batch in batches:
            out = model(**model_inputs(model, {k: torch.from_numpy(v) for k, v in batch.items()}))
            parts = []
            for name in names:
                value = getattr(out, name).float()
                if value.dim() == 3:
                    value = value[:, :CHECK_POSITIONS]  # (batch, positions, width): MLM logits are huge
                parts.append(value.reshape(value.shape[0], -1).cpu().numpy())
            rows.append(np.concatenate(parts, axis=1))
    return np.concatenate(rows).astype(np.float64)


def degenerate(reference, quantized) -> str | None:
    """Why the int8 outputs (examples, values) are unusable next to the fp32 ones, or None."""
    if not np.isfinite(quantized).all():
        return "NaN or infinite outputs"
    if not np.abs(quantized).any():
        return "all-zero outputs"
    fp32_spread = reference.std(axis=0).max()  # how much outputs vary across examples
    int8_spread = quantized.std(axis=0).max()
    if fp32_spread > 0 and int8_spread <= CONSTANT_RATIO * fp32_spread:
        return "the same output for every example while the fp32 outputs vary"
    return None


def check_outputs(reference, quantized, calibration: Calibration, names: tuple[str, ...], backend: str,
                  per_row: bool = True) -> dict[str, Any]:
    """Run fp32 and int8 side by side on the check examples; raise on degenerate int8 outputs.

    ``per_row``: the logits are one row per example (a sequence classifier), so their argmaxes agree or not.
    """
    batches = calibration.check_batches()
    ref = collect_outputs(reference, batches, names)
    if not np.isfinite(ref).all():  # nothing to compare with (and NaN - NaN passes no check): the fp32 model is broken
        raise CompressError(f"the fp32 model gives NaN or infinite outputs on {len(ref)} check examples, so its int8 "
                            "cannot be checked and was not written; check the fp32 model with compress eval")
    got = collect_outputs(quantized, batches, names)
    problem = degenerate(ref, got)
    if problem:
        raise CompressError(
            f"the {backend} backend produced {problem} on {len(ref)} check examples; the int8 model is "
            "unusable and was not written (try another --backend or --scheme)"
        )
    summary = {
        "examples": int(len(ref)),
        "outputs": list(names),
        "max_abs_diff": float(np.abs(got - ref).max()),
        "fp32_max_abs": float(np.abs(ref).max()),
    }
    if per_row and names == ("logits",) and ref.shape[1] > 1:
        summary["argmax_agreement"] = float((got.argmax(1) == ref.argmax(1)).mean())
    return summary


# ---------------------------------------------------------------------------- entry point


def quantize(model_dir: str | Path, out: str | Path, cfg: QuantizeConfig, *, overwrite: bool = False) -> Path:
    """Quantize the fp32 model in ``model_dir`` to int8 with ``cfg.backend``; the output directory."""
    cfg.validate()
    backend = BACKENDS.get(cfg.backend)
    model_dir = require_model_dir(model_dir)
    out = check_output(out, overwrite, inputs=(model_dir, cfg))
    if is_quantized(model_dir):
        raise CompressError(f"{model_dir} is already quantized to int8; quantize the fp32 model it was made from instead")
    head = saved_head(model_dir)
    task = resolve_task(cfg.task, cfg.data.own, train_file=cfg.data.train_file, model=model_dir) if cfg.has_task else None
    _check_head(backend, cfg, head, model_dir, task)
    if backend.needs_torch and artifact_format(model_dir) != "torch":
        raise CompressError(f"the {cfg.backend} backend needs PyTorch weights; {model_dir} holds an {artifact_format(model_dir)} model")
    own = task or task_of_model(model_dir)  # recorded in the int8 folder, which may travel without its parent
    tokenizer = load_tokenizer(model_dir)
    reference = load_model(model_dir)  # the fp32 parent: quantized from (torch backends) and compared with
    max_positions = config_sizes(reference.config).max_positions
    max_length = cfg.data.resolved_max_length(task, max_positions) if task else None
    sentences = None  # a sentence-embedding folder's held-out check sentences
    if task:
        n = cfg.calibration_examples if cfg.scheme in ("static", "qat") else CHECK_EXAMPLES
        calibration = task_calibration(task, tokenizer, cfg, max_length, n)
    elif cfg.embedding:
        calibration, sentences = sentence_calibration(model_dir, tokenizer, cfg, max_positions)
    else:
        calibration = random_calibration(tokenizer, max_positions, cfg.seed)
    dev = _dev_splits(task, cfg.data) if task else None

    with output_dir(out, overwrite) as tmp:
        extra = backend.run(Job(model_dir, tmp, cfg, head, reference, calibration, task, tokenizer, dev, max_length))
        copy_sentence_files(model_dir, tmp)  # a sentence-transformers folder keeps its pooling and normalisation
        record = _record(model_dir, cfg, backend, head, reference, calibration, extra)
        if own is not None:
            record.update(task_fields(own))
        write_json_atomic(tmp / COMPRESSION_FILE, record)  # the loader reads format and structure from it
        write_json_atomic(tmp / METRICS_FILE, {"results": []})
        quantized = runtime.load_model(tmp)  # looked up on the module at call time: tests break the runtime
        names = tuple(record["outputs"])
        record["check"] = check_outputs(reference, quantized, calibration, names, cfg.backend, per_row=head == "sequence-classification")
        rejection = None
        if task:
            rejection = _accuracy_guard(reference, quantized, task, tokenizer, dev, max_length, cfg, record, tmp)
        elif sentences is not None:
            rejection = _embedding_guard(reference, quantized, tokenizer, sentences, cfg, record, tmp)
        if rejection:
            write_json_atomic(tmp / COMPRESSION_FILE, record)
            rejected = _reject(tmp, out)
            raise CompressError(f"{rejection}; the rejected int8 model is in {rejected}")
        write_json_atomic(tmp / COMPRESSION_FILE, record)
    return out


def _check_head(backend: Backend, cfg: QuantizeConfig, head: str, model_dir: Path, task: Task | None) -> None:
    if backend.heads is not None and head not in backend.heads:
        raise CompressError(f"the {cfg.backend} backend quantizes {', '.join(backend.heads)} models; {model_dir} is a {head} model")
    if cfg.embedding and head != "base":
        raise CompressError(f"{model_dir} is a {head} model; --corpus/--sentences-from are for sentence-embedding (base "
                            "encoder) folders: calibrate a task model on its task's rows with --task")
    if task is not None:
        wanted = task.behaviour.head
        if head != wanted:
            raise CompressError(f"{model_dir} is a {head} model but {task.display} needs a {wanted} model; fine-tune it on {task.name} first")


def _dev_splits(task: Task, data: TaskData) -> dict[str, Any]:
    """The raw dev split(s) (MNLI: matched and mismatched), as fine-tuning loads them."""
    _, dev_src = data.sources()
    names = [s.name for s in task.resolve_splits("dev")]
    if data.dev_file:
        names = names[:1]
    return {name: load_split(task, name, dev_src, data.max_eval_examples) for name in names}


def _record(model_dir: Path, cfg: QuantizeConfig, backend: Backend, head: str, reference, calibration: Calibration, extra: dict[str, Any]) -> dict[str, Any]:
    """compression.json for the int8 directory."""
    structure = extra.pop("structure", None) or (structure_of(model_dir) if isinstance(reference, Runner) else describe(reference))
    outputs = extra.pop("outputs", None) or list(OUTPUT_NAMES[head])
    return compression_record(
        stage="quantize", method=f"{cfg.backend}-{cfg.scheme}", config=cfg, parent=model_dir, structure=structure,
        seed=cfg.seed,
        extra={
            "format": backend.format,
            "backend": cfg.backend,
            "scheme": cfg.scheme,
            "precision": "int8",
            "per_channel": cfg.per_channel,
            "head": head,
            "outputs": outputs,
            "preset": extra.pop("preset", None),
            "calibration": calibration.source if cfg.scheme == "static" else None,
            "check_inputs": calibration.source,
            "packages": _versions(backend.packages),
            **extra,
        },
    )


def _versions(names: tuple[str, ...]) -> dict[str, str]:
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def _accuracy_guard(reference, quantized, task: Task, tokenizer, dev, max_length: int, cfg: QuantizeConfig, record, tmp: Path) -> str | None:
    """Score fp32 and int8 on dev, append both to metrics.json; the reason to reject, or None."""
    evaluate = dev_evaluator(task, tokenizer, dev, max_length, batch_size=cfg.data.eval_batch_size, doc_stride=cfg.data.doc_stride)
    before, after = evaluate(reference), evaluate(quantized)
    metric = task.primary_metric
    drop = before[metric] - after[metric]  # in points: metrics are percentages
    passed = cfg.max_drop is None or drop <= cfg.max_drop
    batch_size = cfg.data.eval_batch_size  # scores of dynamic int8 move with batch composition: recorded
    for entry in split_records(task, dev, after, data=cfg.data.describe("dev"), max_length=max_length, batch_size=batch_size):
        append_metrics(tmp, entry)
    summary = {
        "kind": "quantize", "task": task.name, "metric": metric, "parent": before[metric], "quantized": after[metric],
        "drop": drop, "max_drop": cfg.max_drop, "passed": passed, "batch_size": batch_size, "check": record.get("check"),
        "parent_metrics": before, "quantized_metrics": after,
    }
    append_metrics(tmp, summary)
    record["accuracy"] = {k: summary[k] for k in ("task", "metric", "parent", "quantized", "drop", "max_drop", "passed", "batch_size")}
    if passed:
        return None
    return (
        f"int8 {task.display} dev {metric} dropped {drop:.2f} points ({before[metric]:.2f} -> {after[metric]:.2f}), "
        f"more than --max-drop {cfg.max_drop:g}"
    )


COSINE_CHECK = "mean cosine to fp32"  # the check of a sentence-embedding folder's int8 (compression.json "accuracy")


def _embedding_guard(reference, quantized, tokenizer, check: SentenceCheck, cfg: QuantizeConfig, record, tmp: Path) -> str | None:
    """Embed the held-out sentences with fp32 and int8 and compare them by cosine, score any --eval-tasks,
    record both in compression.json and metrics.json; the reason to reject, or None."""
    def embed(model) -> torch.Tensor:  # (sentences, d): pooled and normalised as the folder says
        return finish(pooled(model, tokenizer, check.sentences, check.spec, max_length=check.max_length), check.spec)

    cosine = torch.nn.functional.cosine_similarity(embed(quantized).double(), embed(reference).double(), dim=-1)  # (sentences,)
    mean, low = float(cosine.mean()), float(cosine.min())
    reasons = []
    if cfg.min_cosine is not None and mean < cfg.min_cosine:
        reasons.append(f"the int8 embeddings of {len(cosine)} held-out sentences have a mean cosine of {mean:.5f} to the "
                       f"fp32 ones, below --min-cosine {cfg.min_cosine:g}")
    tasks, reason = _embedding_task_scores(reference, quantized, check, cfg, tmp)
    reasons += [reason] if reason else []
    accuracy = {"check": COSINE_CHECK, "sentences": len(cosine), "mean_cosine": mean, "min_cosine": low,
                "min_required": cfg.min_cosine, "max_length": check.max_length, "tasks": tasks, "max_drop": cfg.max_drop,
                "passed": not reasons}
    record["accuracy"] = accuracy
    summary = {k: v for k, v in accuracy.items() if k != "check"}
    append_metrics(tmp, {"kind": "quantize", "embedding": True, "measure": COSINE_CHECK, **summary,
                         "metrics": {"mean_cosine": mean, "min_cosine": low}, "check": record.get("check")})
    return "; ".join(reasons) or None


def _embedding_task_scores(reference, quantized, check: SentenceCheck, cfg: QuantizeConfig, tmp: Path) -> tuple[dict, str | None]:
    """Each --eval-tasks dev score of the fp32 and the int8 embeddings (the int8 records appended to metrics.json),
    and the reason to reject (a drop above --max-drop), or None."""
    tasks, reasons = {}, []
    for name, (task, ds, score) in check.scorers.items():
        (before, _), (after, details) = score(reference), score(quantized)
        append_metrics(tmp, embedding_record(task, "dev", len(ds), after, details, check.spec, data=cfg.data.describe("dev")))
        metric = embedding_primary_metric(task)
        drop = before[metric] - after[metric]  # in points: metrics are percentages
        tasks[name] = {"metric": metric, "parent": before[metric], "quantized": after[metric], "drop": drop}
        if cfg.max_drop is not None and drop > cfg.max_drop:
            reasons.append(f"int8 {task.display} dev {metric} of the embeddings dropped {drop:.2f} points "
                           f"({before[metric]:.2f} -> {after[metric]:.2f}), more than --max-drop {cfg.max_drop:g}")
    return tasks, "; ".join(reasons) or None


def summarize(out: Path, cfg: QuantizeConfig, inputs: dict[str, Any]) -> tuple[str, list[str]]:
    """What ``compress quantize`` prints: backend, scheme and weights on disk before and after, the dev results,
    the fp32 and int8 scores with the drop (a sentence-embedding folder: the mean cosine of int8 to fp32 embeddings
    and any eval task's scores), the output check and, for a fused graph, its fused operators (all as recorded in
    metrics.json / compression.json)."""
    record = read_compression(out)
    before, after = size_on_disk(inputs["model"]), size_on_disk(out)
    lines = [f"{record.get('backend')} {record.get('scheme')} int8: weights {megabytes(before):.1f} MB -> {megabytes(after):.1f} MB"]
    results = read_metrics(out)
    evals = [r for r in results if r.get("kind") in ("eval", EMBEDDING_EVAL)]
    if evals:
        lines.append(format_table(evals))
    summary = next((r for r in reversed(results) if r.get("kind") == "quantize"), None)
    if summary and summary.get("embedding"):
        lines.extend(format_cosine(summary))
    elif summary:
        lines.append(f"{summary['task']} dev {summary['metric']}: fp32 {summary['parent']:.2f} -> int8 {summary['quantized']:.2f}, "
                     f"drop {summary['drop']:.2f} points (eval batch size {summary.get('batch_size')})")
    else:
        lines.append("dev score: not measured (no --task); the output check is the only test of the int8 model")
    check = (summary or {}).get("check") or record.get("check")
    if check:
        lines.append(format_check(check))
    if record.get("fusion"):
        lines.append(format_fusion(record["fusion"]))
    line = sentence_loading_line(out, record["format"]) if is_sentence_folder(out) else None
    if line:  # the card's call, as export prints it
        lines.append(line)
    return "\n".join(lines), []


def format_cosine(summary: dict[str, Any]) -> list[str]:
    """A sentence-embedding folder's check (:func:`_embedding_guard`): the cosine line, and a line per eval task."""
    line = (f"embeddings of {summary['sentences']} held-out sentences: mean cosine int8 to fp32 {summary['mean_cosine']:.5f} "
            f"(lowest {summary['min_cosine']:.5f})")
    if summary.get("min_required") is not None:
        line += f", required at least {summary['min_required']:g}"
    lines = [line]
    for name, t in (summary.get("tasks") or {}).items():
        lines.append(f"{name} dev {t['metric']} of the embeddings: fp32 {t['parent']:.2f} -> int8 {t['quantized']:.2f}, "
                     f"drop {t['drop']:.2f} points")
    return lines


def format_check(check: dict[str, Any]) -> str:
    """The output check (:func:`check_outputs`) as one line."""
    line = (f"output check on {check['examples']} examples: max |int8 - fp32| {check['max_abs_diff']:.4f} "
            f"(fp32 max |output| {check['fp32_max_abs']:.4f})")
    if check.get("argmax_agreement") is not None:
        line += f", argmax agreement {100 * check['argmax_agreement']:.1f}%"
    return line


def rejected_path(out: Path) -> Path:
    """Where a result that failed the accuracy guard goes: ``<out>.rejected`` next to ``out``."""
    out = Path(out).absolute()
    return out.parent / f"{out.name}.rejected"


def _reject(tmp: Path, out: Path) -> Path:
    """Move the finished temporary directory to ``<out>.rejected`` (replacing an older rejection)."""
    target = rejected_path(out)
    if target.exists():
        shutil.rmtree(target)
    apply_umask(tmp)  # mkdtemp made it private
    os.replace(tmp, target)
    return target
