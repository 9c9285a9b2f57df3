"""FFN-neuron pruning through torch-pruning's dependency graph (Fang et al. 2023, "DepGraph").

The graph is traced from one forward pass, so the pruner itself finds every parameter
coupled to an FFN neuron (the first Linear's row and bias entry, the second Linear's
column, anything else an architecture ties to them) instead of relying on hand-written
slicing. Only the FFN's first Linear is named, through the structure accessors, with
each neuron's rows there (a gated FFN such as ModernBERT's has an input and a gate row;
the graph follows its split into the second Linear).
``compress.core.model.structure.resize_ffn`` remains the hand-written surgery the loader uses
to rebuild stored shapes; a test asserts both give identical logits for the same neurons.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch_pruning as tp
from torch import nn

from compress.core.model import structure as st
from compress.core.errors import CompressError

TRACE_LENGTH = 8  # tokens per example sequence traced to build the graph


def example_inputs(model: nn.Module, batch: int = 2, length: int = TRACE_LENGTH) -> dict[str, torch.Tensor]:
    """Token ids (batch, length) and a full attention mask on the model's device, for tracing."""
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, st.config_sizes(model.config).vocab, (batch, length), generator=generator)
    return {"input_ids": ids.to(device), "attention_mask": torch.ones_like(ids).to(device)}


def prune_ffn_neurons(model: nn.Module, keep: Sequence[Sequence[int]]) -> None:
    """Keep only the FFN neurons ``keep[l]`` of each layer ``l`` (sorted ids), removing the rest physically."""
    layers = st.layers(model)
    if len(keep) != len(layers):
        raise CompressError(f"FFN neurons to keep are given for {len(keep)} layers; the model has {len(layers)}")
    plans = []
    for index, (layer, ids) in enumerate(zip(layers, keep)):
        width = layer.ffn_width
        ids = sorted(set(int(i) for i in ids))
        if not ids:
            raise CompressError(f"layer {index}: cannot remove every FFN neuron; keep at least one")
        if ids[0] < 0 or ids[-1] >= width:
            raise CompressError(f"layer {index}: FFN neuron {ids[-1]} does not exist (width {width})")
        plans.append((layer.ffn_in, layer.ffn_rows(sorted(set(range(width)) - set(ids)))))
    was_training = model.training
    model.eval()  # dropout off while tracing; the graph only needs the operations
    with torch.enable_grad():  # the tracer follows grad_fn links
        graph = tp.DependencyGraph().build_dependency(model, example_inputs=example_inputs(model), verbose=False)
    for first_linear, remove in plans:
        if remove:
            graph.get_pruning_group(first_linear, tp.prune_linear_out_channels, idxs=remove).prune()
    model.train(was_training)
