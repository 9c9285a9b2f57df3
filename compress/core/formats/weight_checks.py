"""What a model folder's tensors must be before anything runs on them: one place, one line per failure.

Every loader of stored weights passes what it read through :func:`check_tensors` (dtypes,
NaN/inf) and the shard names of a weights index through :func:`check_shard_names` (inside the
folder). The checks cost one pass over the weights (``isfinite`` on ~110M floats takes about
0.1 s on one core) and turn weights that cannot be right into a refusal naming the file and
the tensor, instead of logits that are silently NaN or noise.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Mapping

import torch

from compress.core.errors import CompressError

# Integer tensors a float checkpoint may hold: transformers' index buffers, which older versions saved.
INTEGER_BUFFERS = ("position_ids", "token_type_ids")


def check_tensors(state: Mapping[str, torch.Tensor], file: Path | str, *,
                  integer: Mapping[str, tuple[torch.dtype, ...]] | None = None) -> None:
    """Refuse a non-floating tensor and any NaN/inf value, naming the first tensor at fault.

    ``integer`` maps a name suffix to the integer dtypes a layout stores under it (the torch-int8
    layout's ``.weight_int8`` values and ``.weight_zero_point``); other integer or bool tensors are
    refused unless they are index buffers (:data:`INTEGER_BUFFERS`).
    """
    integer = dict(integer or {})
    for name, tensor in state.items():
        if not (tensor.is_floating_point() or tensor.is_complex()):
            allowed = next((dtypes for suffix, dtypes in integer.items() if name.endswith(suffix)), None)
            if allowed is not None and tensor.dtype in allowed:
                continue
            if allowed is None and name.endswith(INTEGER_BUFFERS) and tensor.dtype in (torch.int64, torch.int32):
                continue
            want = " or ".join(str(d).removeprefix("torch.") for d in allowed) if allowed else "floating point"
            raise CompressError(
                f"{file}: tensor {name} is stored as {str(tensor.dtype).removeprefix('torch.')}, but weights here must be "
                f"{want}; the file was not written by a model's save_pretrained, re-save the model from its source"
            )
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            nans = int(torch.isnan(tensor).sum())
            raise CompressError(
                f"{file}: tensor {name} holds {bad:,} non-finite values of {tensor.numel():,} ({nans:,} NaN, "
                f"{bad - nans:,} infinite); the weights are corrupt (a diverged training?), use an earlier checkpoint"
            )


def check_shard_names(folder: Path, index_file: Path, weight_map: object) -> list[str]:
    """The shard files a weights index names, each a plain file name inside ``folder``; else one line naming the entry."""
    if not isinstance(weight_map, dict) or not weight_map:
        raise CompressError(f"{index_file} has no weight_map of tensor names to shard files; re-create the model directory")
    shards = sorted({str(v) for v in weight_map.values()})
    for shard in shards:
        parts = PurePosixPath(shard.replace("\\", "/"))
        if parts.is_absolute() or len(parts.parts) != 1 or shard in ("", ".", ".."):
            raise CompressError(
                f"{index_file} maps tensors to {shard!r}, which is not a file in {folder}; an index may only name "
                "shard files beside it, re-create the model directory"
            )
        if not (folder / shard).is_file():
            raise CompressError(f"{index_file} names the shard {shard}, which is missing from {folder}; "
                                "copy every shard or re-create the model directory")
    return shards
