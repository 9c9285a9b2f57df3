"""What a model directory holds: its file names and its artifact formats (its heads: ``compress.core.model.heads``).

A model directory is an ordinary Hugging Face folder (``config.json``,
``model.safetensors``, tokenizer files) plus two sidecars (:mod:`compress.core.formats.records`):

* ``compression.json``: what produced it (stage, method, resolved config, parent and
  its hash), its structure (see ``compress.core.model.structure``), and provenance (argv, git
  revision, package versions, seed, date, hardware).
* ``metrics.json``: ``{"results": [...]}``, one record per evaluation or latency run,
  appended.
"""

from __future__ import annotations

from compress.core.errors import CompressError

COMPRESSION_FILE = "compression.json"
METRICS_FILE = "metrics.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
LEGACY_WEIGHTS = "pytorch_model.bin"
ONNX_FILE = "model.onnx"
OPENVINO_FILE = "openvino_model.xml"  # OpenVINO IR (graph); its weights are openvino_model.bin beside it
CTRANSLATE2_FILE = "model.bin"  # a CTranslate2 encoder's weights (its vocabulary.json beside it)
HEAD_FILE = "head.safetensors"  # a task head's tensors, run beside an encoder-only runtime (CTranslate2)
CARD_FILE = "README.md"
SENTENCE_MODULES_FILE = "modules.json"  # a sentence-transformers folder's module list (compress.core.formats.sentence)
# int8 PyTorch weights: a name no stock loader looks for, so transformers, pipeline and
# SentenceTransformer refuse the folder (no model.safetensors) instead of loading the fp32
# config.json with its Linear weights silently re-initialised.
INT8_WEIGHTS_FILE = "model.int8.safetensors"

# Artifact formats (compression.json's "format"); each has a loader in compress.core.formats.runtime.
TORCH = "torch"
TORCH_INT8 = "torch-int8-dynamic"
ONNX = "onnx"
INC_PT2E = "inc-pt2e"
OPENVINO = "openvino"
CTRANSLATE2 = "ctranslate2"  # a CTranslate2 Encoder folder (compress.core.formats.ctranslate2); the head in HEAD_FILE
STATIC = "static"  # model2vec static token vectors (compress.core.formats.static); config.json's model_type is "model2vec"
INT8_FORMATS = (TORCH_INT8, INC_PT2E)  # an "onnx" directory is int8 when its precision says so

# --quantization: CTranslate2's weight types -> the precision compression.json records. int8 and int8_float32 store
# the same int8 weights (the second keeps the other weights in float32); bfloat16 runs in float32 on a CPU whose
# CTranslate2 build has no bf16 kernels (the folder records the compute type it ran here).
QUANTIZATIONS = {"float32": "fp32", "int8": "int8", "int8_float32": "int8", "bfloat16": "bf16"}


def check_quantization(quantization: str) -> str:
    """``quantization``, refused in one line unless CTranslate2 stores it for a CPU (:data:`QUANTIZATIONS`)."""
    if quantization not in QUANTIZATIONS:
        raise CompressError(f"unknown CTranslate2 quantization {quantization!r}; valid: {', '.join(QUANTIZATIONS)}")
    return quantization
