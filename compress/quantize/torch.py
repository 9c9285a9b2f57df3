"""The ``torch`` int8 backend: PyTorch dynamic quantization of every ``nn.Linear``.

qint8 weights, per output channel; activations quantized per batch at run time. Stored as
int8 values + scales + zero points in ``model.int8.safetensors`` (format
``torch-int8-dynamic``; stock loaders find no ``model.safetensors`` and refuse the folder).
Embeddings stay fp32, so a BERT-base shrinks about 2.4x, not 4x.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from compress.core.formats.onnx import copy_sidecars
from compress.core.formats.torch_int8 import quantize_linears, write_torch_int8
from compress.quantize.job import Job


def quantize_torch(job: Job) -> dict[str, Any]:
    """PyTorch dynamic int8: every Linear gets qint8 weights; stored as int8 + scales."""
    model = quantize_linears(copy.deepcopy(job.reference), per_channel=job.cfg.per_channel)
    write_torch_int8(model, job.out)
    copy_sidecars(job.parent_dir, job.out)
    return {"engine": _torch_engine()}


def _torch_engine() -> str:
    return torch.backends.quantized.engine  # the kernels packed weights are laid out for (x86, qnnpack)

