"""Batches cut by length: the sub-batches of a batch that cost the least padding plus calls.

A CPU runtime (ONNX Runtime, OpenVINO, PyTorch) computes every position of a padded batch, real or
not, so a batch of 32 sentences of random lengths pays for 32 x the longest. CTranslate2 strips
padding inside the encoder; the other runtimes do not, so the toolkit cuts the batch instead. The
rows are sorted longest first and split where a new call costs less than the padding it saves.

Cost of one call on rows ``i..j`` of the sorted lengths (``l_i`` the longest of them):
``call_tokens + (j - i + 1) * l_i``, in token positions. ``call_tokens`` is what one more call costs
beside the positions it computes (the runtime's per-call overhead and smaller matrices being slower
per position), in the same unit; ``bench/batching.py`` measures which value serves each runtime.
The split minimising the sum is found exactly by dynamic programming over the sorted lengths
(O(n^2) for n rows: 32 rows is 528 candidate sub-batches).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

CALL_TOKENS = 64  # the default price of one more call, in token positions (bench/batching.py)
# Per runtime, the price that served it best at batch 32 on all-MiniLM-L6-v2 (bench/results/2026-12-07/batching, two
# runs on a 2-core Zen 4: PyTorch 206-211 -> 292-304 sentences/s at 64, ONNX Runtime 203-209 -> 252-318 at 0, OpenVINO
# 249-250 -> 351-361 at 64). CTranslate2 strips padding itself: nothing to cut. Keyed by the runner's ``format``.
CALL_TOKENS_BY_FORMAT = {"pytorch": 64.0, "onnx": 0.0, "openvino": 64.0, "ctranslate2": float("inf")}


def call_tokens_for(model) -> float:
    """The measured price of one more call for the runtime running ``model`` (a runner's ``format``; else PyTorch)."""
    return CALL_TOKENS_BY_FORMAT.get(getattr(model, "format", "pytorch"), float(CALL_TOKENS))


def longest_first(lengths: Sequence[int]) -> np.ndarray:
    """Row indices, longest first; equal lengths keep their order (stable)."""
    return np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable")


def split_by_length(lengths: Sequence[int], call_tokens: float = CALL_TOKENS) -> list[np.ndarray]:
    """Sub-batches (arrays of row indices into ``lengths``, each longest first) minimising padding plus calls.

    ``call_tokens=inf`` keeps one batch; ``0`` gives one call per distinct length.
    """
    n = len(lengths)
    if n == 0:
        return []
    order = longest_first(lengths)
    sorted_lengths = np.asarray(lengths, dtype=np.float64)[order]  # (n,), descending
    if not np.isfinite(call_tokens):
        return [order]
    best = np.full(n + 1, np.inf)  # best[k]: least cost of the first k sorted rows
    best[0], cut = 0.0, np.zeros(n + 1, dtype=np.int64)
    for end in range(1, n + 1):
        starts = np.arange(end)  # a sub-batch of sorted rows start..end-1; its longest is sorted_lengths[start]
        costs = best[:end] + call_tokens + (end - starts) * sorted_lengths[:end]
        cut[end] = int(np.argmin(costs))
        best[end] = costs[cut[end]]
    pieces, end = [], n
    while end > 0:
        pieces.append(order[cut[end] : end])
        end = cut[end]
    return pieces[::-1]


def padded_positions(lengths: Sequence[int], pieces: list[np.ndarray]) -> int:
    """Token positions the runtime computes for ``pieces``: each sub-batch's rows times its longest."""
    values = np.asarray(lengths)
    return int(sum(len(p) * values[p].max() for p in pieces if len(p)))
