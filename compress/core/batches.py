"""A run's data order as pure functions of its seed: epoch permutations, length grouping, global batches, step seeds.

What makes resume exact: the examples of a step depend only on (seed, epoch) and the
batch randomness (e.g. MLM masks) only on (seed, step), never on what ran before.
"""

from __future__ import annotations

from typing import Sequence

import torch


def step_seed(seed: int, step: int) -> int:
    """A per-step seed for batch randomness (MLM masks) that does not depend on history."""
    return (seed * 1_000_003 + step * 7919) % (2**63 - 1)


def epoch_order(
    n: int, seed: int, epoch: int, shuffle: bool = True, lengths: Sequence[int] | None = None, batch_size: int = 1
) -> list[int]:
    """The example order of one epoch: a permutation fixed by (seed, epoch).

    With ``lengths``, examples are grouped by length as in Hugging Face's
    ``group_by_length``: the permutation is cut into mega-batches of 50 batches, each
    sorted by length, so a batch holds similar lengths (little padding) while the data
    order stays random. The batches are then shuffled too, keeping the longest first
    (an out-of-memory error shows up at step one, not hours later).
    """
    if not shuffle:
        return list(range(n))
    g = torch.Generator().manual_seed(seed * 1009 + epoch)
    order = torch.randperm(n, generator=g).tolist()
    if lengths is None or batch_size <= 1:
        return order
    mega = batch_size * 50
    grouped: list[int] = []
    for start in range(0, n, mega):
        grouped.extend(sorted(order[start : start + mega], key=lambda i: -lengths[i]))
    batches = [grouped[i : i + batch_size] for i in range(0, n, batch_size)]
    full = [b for b in batches if len(b) == batch_size]
    tail = [b for b in batches if len(b) < batch_size]  # a short batch stays last
    longest = max(range(len(full)), key=lambda b: lengths[full[b][0]]) if full else None
    rest = [b for i, b in enumerate(full) if i != longest]
    shuffled = [rest[i] for i in torch.randperm(len(rest), generator=g).tolist()]
    head = [full[longest]] if longest is not None else []
    return [i for b in head + shuffled + tail for i in b]


def global_batches(n: int, batch_size: int, world: int) -> list[tuple[int, int]]:
    """(start, end) of each global batch; the last one is trimmed to a multiple of ``world``."""
    out = []
    for start in range(0, n, batch_size):
        end = min(start + batch_size, n)
        end = start + ((end - start) // world) * world
        if end > start:
            out.append((start, end))
    return out

