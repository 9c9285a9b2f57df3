"""What ``compress quantize`` can be asked: :class:`QuantizeConfig`, and the backends table it is checked against.

The one description of the stage's options, read by everything in ``compress.quantize``: the
stage (``run``), its calibration, its guards (``checks``) and each backend module, which
take ``job.cfg`` as a :class:`QuantizeConfig`. :data:`BACKENDS` names each backend's schemes,
format, packages and heads, and its function as a ``"module:attr"`` name that ``run`` imports
when it runs a job, so this module imports no backend (and no backend's heavy library).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from compress.core.config import SEEDS, flat_keywords, option
from compress.core.data.config import TaskData
from compress.core.data.tasks import get_task, is_kind, task_choices
from compress.core.errors import CompressError
from compress.core.formats.layout import OPENVINO
from compress.core.model.heads import EXPORTABLE_HEADS
from compress.core.registry import Registry
from compress.distill.config import EmbeddingDistillConfig

SCHEMES = ("dynamic", "static", "qat")
PRESETS = ("auto", "avx512_vnni", "avx2", "arm64")
# The backends that calibrate a sentence-embedding folder (a bare encoder): INC's PT2E annotator fails on its graph.
EMBEDDING_STATIC = ("onnxruntime", "openvino")


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
    seed: int = option(0, "seed for choosing the calibration examples (and the held-out check sentences)", bounds=SEEDS)
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


@dataclass(frozen=True)
class Backend:
    """One quantization backend: what it does and the function that writes its files."""

    schemes: tuple[str, ...]
    format: str  # compression.json "format" of its outputs
    packages: tuple[str, ...]  # versions recorded in compression.json
    # "module:function" (imported when a job runs): Job -> extra record fields, after writing the model files into job.out
    run: str
    needs_torch: bool = True  # reads PyTorch weights (an ONNX parent will not do)
    heads: tuple[str, ...] | None = None  # heads it can export (None: all)


BACKENDS: Registry[Backend] = Registry("quantization backend")
BACKENDS.register("torch", Backend(("dynamic",), "torch-int8-dynamic", ("torch",), "compress.quantize.torch:quantize_torch"))
BACKENDS.register("onnxruntime", Backend(
    ("dynamic", "static"), "onnx", ("torch", "onnx", "onnxruntime"), "compress.quantize.onnxruntime:quantize_onnxruntime",
    needs_torch=False, heads=EXPORTABLE_HEADS,
))
BACKENDS.register("inc", Backend(
    ("static", "qat"), "inc-pt2e", ("torch", "neural-compressor-pt", "torchao"), "compress.quantize.inc:quantize_inc",
    heads=EXPORTABLE_HEADS,
))
BACKENDS.register("openvino", Backend(
    ("static",), OPENVINO, ("torch", "openvino", "nncf"), "compress.quantize.openvino:quantize_openvino", needs_torch=False,
    heads=EXPORTABLE_HEADS,
))
