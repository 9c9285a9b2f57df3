"""Teacher outputs computed once per (teacher, data, tokenisation) and reused across epochs.

A distillation epoch then costs about what a plain fine-tuning epoch of the student
costs. Logits are stored in float32; selected hidden states, when asked, in float16 as
one token-major memory map ``(total_tokens, n_layers, hidden)`` with per-example
offsets. The key hashes the teacher's weights, the token ids of every example and the
cached layers, so any change (another checkpoint, other data, another max length or
tokenizer) misses the cache instead of silently reusing stale outputs. Runs that miss the
same entry at once run the teacher once: the others wait for its outputs (a lock beside
the entry).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from compress.core.formats.writes import apply_umask, build_lock, writing
from compress.core.logs import progress
from compress.core.model.structure import model_inputs

CACHE_ENV = "COMPRESS_CACHE"

log = logging.getLogger(__name__)


def default_cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "compress")
    return Path(root) / "teacher-outputs"


def cache_key(teacher_hash: str, input_ids: Sequence[Sequence[int]], outputs: Sequence[str], layers: Sequence[int]) -> str:
    """A hash of the teacher's weights, every example's token ids and what is cached."""
    digest = hashlib.sha256()
    digest.update(teacher_hash.encode())
    digest.update(json.dumps({"outputs": list(outputs), "layers": list(layers), "n": len(input_ids)}).encode())
    for ids in input_ids:
        digest.update(np.asarray(ids, dtype=np.int32).tobytes())
        digest.update(b"|")
    return digest.hexdigest()[:24]


@dataclass
class TeacherCache:
    """Cached teacher outputs for the examples of one training set, by example position."""

    path: Path
    outputs: dict[str, np.ndarray]  # "logits": (n, C), per token (n, seq_max, C); "start_logits"/"end_logits": (n, seq_max)
    hidden: np.ndarray | None  # (total_tokens, n_layers, hidden) float16, memory-mapped
    offsets: np.ndarray | None  # (n + 1,) token offsets into `hidden`
    layers: tuple[int, ...]  # teacher hidden-state indices cached, in order
    hit: bool  # True when read from disk, False when just computed

    def batch_outputs(self, index: Sequence[int], name: str):
        return torch.from_numpy(np.ascontiguousarray(self.outputs[name][list(index)]))

    def batch_hidden(self, index: Sequence[int], seq_len: int):
        """Cached hidden states of some examples, padded to ``seq_len``: (n_layers, batch, seq, hidden)."""
        n_layers, width = self.hidden.shape[1], self.hidden.shape[2]
        out = np.zeros((n_layers, len(index), seq_len, width), dtype=np.float32)
        for row, i in enumerate(index):
            start, end = int(self.offsets[i]), int(self.offsets[i + 1])
            out[:, row, : end - start] = np.transpose(self.hidden[start:end], (1, 0, 2))
        return torch.from_numpy(out)


def load_or_build(
    teacher,
    teacher_hash: str,
    features,
    collator,
    *,
    outputs: Sequence[str],
    layers: Sequence[int] = (),
    cache_dir: Path | None = None,
    batch_size: int = 64,
    device=None,
) -> TeacherCache:
    """Read the cache for (teacher, features) or run the teacher once and write it atomically."""
    input_ids = features["input_ids"]
    key = cache_key(teacher_hash, input_ids, outputs, layers)
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    path = root / key
    if (path / "meta.json").is_file():
        return _read(path, outputs, layers)
    with build_lock(path, "the teacher outputs"):  # runs started together run the teacher once
        if (path / "meta.json").is_file():  # made while this process waited
            return _read(path, outputs, layers)
        arrays, hidden, offsets = _compute(teacher, features, collator, outputs=outputs, layers=layers,
                                           batch_size=batch_size, device=device)
        with writing(path):
            tmp = Path(tempfile.mkdtemp(prefix=f".{key}.tmp-", dir=root))
        try:
            with writing(path, staging=tmp):  # a full disk or a size limit: one line naming the file
                for name, array in arrays.items():
                    np.save(tmp / f"{name}.npy", array)
                if hidden is not None:
                    np.save(tmp / "hidden.npy", hidden)
                    np.save(tmp / "offsets.npy", offsets)
                meta = {"outputs": list(outputs), "layers": list(layers), "n": len(input_ids), "teacher": teacher_hash}
                (tmp / "meta.json").write_text(json.dumps(meta))
                apply_umask(tmp)  # mkdtemp made it private
                os.replace(tmp, path)
        except BaseException as err:  # a signal too: no temporary folder is left behind
            shutil.rmtree(tmp, ignore_errors=True)
            # A process without the lock (no fcntl) may have won the race: its entry is as good as ours.
            if not isinstance(err, OSError) or not (path / "meta.json").is_file():
                raise
    cache = _read(path, outputs, layers)
    cache.hit = False
    return cache


def _read(path: Path, outputs: Sequence[str], layers: Sequence[int]) -> TeacherCache:
    arrays = {name: np.load(path / f"{name}.npy", mmap_mode="r") for name in outputs}
    hidden = offsets = None
    if layers:
        hidden = np.load(path / "hidden.npy", mmap_mode="r")
        offsets = np.load(path / "offsets.npy")
    return TeacherCache(path, arrays, hidden, offsets, tuple(layers), hit=True)


def _compute(teacher, features, collator, *, outputs, layers, batch_size, device) -> tuple[dict[str, Any], Any, Any]:
    """One teacher pass in eval mode (no dropout: the outputs are deterministic)."""

    device = device or next(teacher.parameters()).device
    teacher.eval()
    columns = [c for c in ("input_ids", "attention_mask", "token_type_ids") if c in features.column_names]
    rows = features.select_columns(columns)
    n = len(rows)
    lengths = np.array([len(x) for x in features["input_ids"]])
    results: dict[str, list] = {name: [None] * n for name in outputs}
    hidden_rows: list[Any] = [None] * n
    # Batches of similar length, so that little of each batch is padding (on SST-2 at max length 64 the
    # dataset order pads to about 3x the tokens); each output is stored at its example's position.
    order = np.argsort(lengths, kind="stable")
    log.info("teacher: scoring %s training examples once (%s tokens); later runs read them from the cache",
             f"{n:,}", f"{int(lengths.sum()):,}")
    with torch.inference_mode():
        for start in progress(range(0, n, batch_size), desc="teacher outputs (cached)", unit="batch", leave=False):
            index = [int(i) for i in order[start:start + batch_size]]
            batch = {k: v.to(device) for k, v in collator([rows[i] for i in index]).items() if k in columns}
            out = teacher(**model_inputs(teacher, batch), output_hidden_states=bool(layers))
            for name in outputs:
                values = getattr(out, name).float().cpu().numpy()
                for j, i in enumerate(index):
                    results[name][i] = values[j]
            if layers:
                stacked = torch.stack([out.hidden_states[k] for k in layers], dim=2)  # (batch, seq, layers, hidden)
                for j, i in enumerate(index):
                    hidden_rows[i] = stacked[j, : lengths[i]].to(torch.float16).cpu().numpy()
    arrays = {}
    for name in outputs:
        rows_ = results[name]
        if rows_[0].ndim == 2:  # a token classifier's logits, (seq, C) each: padded to (n, longest, C) with zeros
            padded = np.zeros((n, int(lengths.max()), rows_[0].shape[1]), dtype=np.float32)
            for i, r in enumerate(rows_):
                padded[i, : lengths[i]] = r[: lengths[i]]
            arrays[name] = padded
        elif rows_[0].ndim == 0 or name == "logits":
            arrays[name] = np.stack(rows_).astype(np.float32)  # (n, C)
        else:  # per-token outputs (start/end logits): each row cut to its example's length, padded to the longest
            padded = np.full((n, int(lengths.max())), -1e4, dtype=np.float32)
            for i, r in enumerate(rows_):
                padded[i, : lengths[i]] = r[: lengths[i]]  # r is as long as its batch's longest example
            arrays[name] = padded
    hidden = offsets = None
    if layers:
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        hidden = np.concatenate(hidden_rows, axis=0)  # (total_tokens, layers, hidden)
    return arrays, hidden, offsets
