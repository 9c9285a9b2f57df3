"""A model directory's architecture without its weights: the module, its parameter count, its structure dict.

The architecture is ``config.json`` plus the per-layer shapes ``compression.json`` records
(pruned heads, FFN widths), whatever format the weights are stored in; the stored formats'
loaders build it before filling in their weights, and size reports count it.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from compress.core.compat import no_init_weights
from compress.core.formats.artifacts import architecture_class, load_config, saved_head
from compress.core.formats.records import read_compression
from compress.core.model.structure import apply_structure, count_parameters, describe


def build_architecture(path: Path, config=None, head: str | None = None, *, empty: bool = False):
    """The directory's model (config.json + compression.json's per-layer shapes), without its weights.

    ``empty`` skips the random initialisation (the caller overwrites every weight).
    """

    config = config or load_config(path)
    head = head or saved_head(path)
    cls = architecture_class(config, head)
    if empty:
        context = no_init_weights()
    else:
        context = contextlib.nullcontext()
    with context:
        model = cls(config)  # transformers 4.x builds pruned heads from config.pruned_heads
    structure = read_compression(path).get("structure")
    if structure:
        apply_structure(model, structure)  # per-layer FFN widths (and heads on 5.x)
    return model


def parameter_count(path: Path | str) -> int:
    """Distinct parameters of the directory's architecture, as in its fp32 form.

    Built uninitialised on the CPU (``torch.empty`` pages are never touched), not on the
    meta device: transformers' head pruning indexes with a boolean mask, which meta tensors refuse.
    """
    model = build_architecture(Path(path), empty=True)
    model.tie_weights()
    return count_parameters(model)


def structure_of(path: Path | str) -> dict[str, Any]:
    """The structure dict (heads, FFN widths, layers) from compression.json, else from the config."""
    stored = read_compression(path).get("structure")
    if stored:
        return stored
    return describe(build_architecture(Path(path), empty=True))
