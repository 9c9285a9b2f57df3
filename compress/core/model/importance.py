"""How much each attention head, FFN neuron and layer matters: measured with hooks.

Gates are multiplied into a unit's output by forward hooks inside context managers that
always remove them; nothing here edits weights (``compress.prune`` does the surgery).

* Heads: the absolute gradient of the loss w.r.t. a per-head gate on the head's output
  (Michel et al. 2019, "Are Sixteen Heads Really Better than One?"), accumulated over
  batches and optionally normalised per layer; or the weight magnitude of the head's
  Q/K/V rows and output columns; or (negated) attention entropy.
* FFN neurons: |activation x gradient| (first-order Taylor, Molchanov et al. 2017) or the
  magnitude of the neuron's input row and output column.
* Layers: the absolute gradient w.r.t. a gate on the layer's residual contribution.

Per-layer results are lists of 1-D tensors, because pruned models have different head
counts and FFN widths per layer.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterable, Iterator, Sequence

import torch
from torch import nn

from compress.core.model import structure as st
from compress.core.errors import CompressError

LossFn = Callable[[nn.Module, dict], torch.Tensor]


def model_loss(model: nn.Module, batch: dict) -> torch.Tensor:
    """The task loss the model's head computes from the batch's labels (or start/end positions)."""
    return model(**st.model_inputs(model, batch, targets=True)).loss


# ---------------------------------------------------------------------------- gates


@contextlib.contextmanager
def _removing(handles: list) -> Iterator[None]:
    """Run the block, then remove every hook handle, also when the block raises."""
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def head_gates(model: nn.Module, gates: Sequence[torch.Tensor]) -> Iterator[None]:
    """Multiply head h of layer l's output by ``gates[l][h]`` while the block runs.

    A head's output is its slice of the context (batch, seq, heads * d) that enters the
    output projection, so a gate of 0 is exactly removing the head. The hook sits on the
    projection's input, which every encoder family has (DistilBERT's and ModernBERT's
    attention modules return the projected output, BERT's the context).
    """
    handles = []
    for layer, gate in zip(st.layers(model), gates):

        def hook(_module, args, gate=gate, heads=layer.heads):
            context = args[0]  # (batch, seq, heads * d)
            shape = context.shape
            split = context.view(*shape[:-1], heads, shape[-1] // heads)  # (batch, seq, heads, d)
            gated = (split * gate.to(context.dtype).view(heads, 1)).view(shape)
            return (gated, *args[1:])

        handles.append(layer.output.register_forward_pre_hook(hook))
    with _removing(handles):
        yield


@contextlib.contextmanager
def masked_heads(model: nn.Module, keep: Sequence[Sequence[bool]]) -> Iterator[None]:
    """Evaluate as if the heads with ``keep[l][h] == False`` were removed (no surgery)."""
    gates = [torch.tensor([1.0 if k else 0.0 for k in row]) for row in keep]
    with head_gates(model, gates):
        yield


@contextlib.contextmanager
def ffn_gates(model: nn.Module, gates: Sequence[torch.Tensor]) -> Iterator[None]:
    """Multiply FFN neuron i of layer l (after the activation; gated FFN: after the gate) by ``gates[l][i]``."""
    handles = []
    for layer, gate in zip(st.layers(model), gates):

        def hook(_module, args, gate=gate):
            return (args[0] * gate.to(args[0].dtype), *args[1:])  # (batch, seq, ffn) entering the second Linear

        handles.append(layer.ffn_out.register_forward_pre_hook(hook))
    with _removing(handles):
        yield


@contextlib.contextmanager
def layer_gates(model: nn.Module, gates: torch.Tensor) -> Iterator[None]:
    """Scale each layer's residual contribution: out = x + g * (layer(x) - x); g = 0 skips it."""
    handles = []
    for layer, gate in zip(st.encoder_layers(model), gates):
        seen: dict[str, torch.Tensor] = {}

        def pre(_module, args, kwargs, seen=seen):
            seen["x"] = args[0] if args else kwargs["hidden_states"]

        def post(_module, _inputs, output, gate=gate, seen=seen):
            out = output[0] if isinstance(output, tuple) else output
            gated = seen["x"] + gate.to(out.dtype) * (out - seen["x"])
            return (gated, *output[1:]) if isinstance(output, tuple) else gated

        handles.append(layer.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(layer.register_forward_hook(post))
    with _removing(handles):
        yield


# ---------------------------------------------------------------------------- scores


def _to(batch: dict, device) -> dict:
    return {k: v.to(device) if hasattr(v, "to") else v for k, v in batch.items()}


def head_importance_gradient(
    model: nn.Module, batches: Iterable[dict], *, loss_fn: LossFn = model_loss, normalize: bool = True
) -> list[torch.Tensor]:
    """Michel et al.'s head importance: sum over batches of |dL/d gate_h|, gates at 1.

    With ``normalize`` each layer's scores are divided by their L2 norm (as in the
    authors' code), so layers with large gradients do not take every pruning slot.
    """
    device = next(model.parameters()).device
    gates = [torch.ones(n, device=device, requires_grad=True) for n in st.heads_per_layer(model)]
    scores = [torch.zeros(n) for n in st.heads_per_layer(model)]
    was_training = model.training
    model.eval()  # no dropout: the score measures the trained function
    with head_gates(model, gates):
        for batch in batches:
            loss = loss_fn(model, _to(batch, device))
            grads = torch.autograd.grad(loss, gates)
            for i, g in enumerate(grads):
                scores[i] += g.detach().abs().cpu()
    model.train(was_training)
    if normalize:
        scores = [s / (s.norm() + 1e-12) for s in scores]
    return scores


def head_importance_magnitude(model: nn.Module) -> list[torch.Tensor]:
    """L2 norm of each head's Q, K, V rows and output-projection columns."""
    scores = []
    for layer in st.layers(model):
        heads, d = layer.heads, layer.head_size
        total = torch.zeros(heads)
        for weight in layer.qkv_weights:  # (heads * d, hidden) each
            total += weight.detach().view(heads, d, -1).pow(2).sum(dim=(1, 2)).cpu()  # rows of head h
        out = layer.output.weight.detach()  # (hidden, heads * d)
        total += out.view(out.shape[0], heads, d).pow(2).sum(dim=(0, 2)).cpu()
        scores.append(total.sqrt())
    return scores


def head_importance_entropy(model: nn.Module, batches: Iterable[dict]) -> list[torch.Tensor]:
    """Negative mean attention entropy: a head that spreads attention evenly scores low."""
    device = next(model.parameters()).device
    sums = [torch.zeros(n) for n in st.heads_per_layer(model)]
    count = 0
    with torch.no_grad():
        for batch in batches:
            batch = _to(batch, device)
            out = model(**st.model_inputs(model, batch), output_attentions=True)
            mask = batch["attention_mask"].float()  # (batch, seq)
            for i, att in enumerate(out.attentions):  # (batch, heads, seq, seq)
                ent = -(att * torch.log(att.clamp_min(1e-12))).sum(-1)  # (batch, heads, seq)
                sums[i] += ((ent * mask[:, None, :]).sum(dim=(0, 2)) / mask.sum()).cpu()
            count += 1
    return [-(s / max(1, count)) for s in sums]


def ffn_importance_taylor(model: nn.Module, batches: Iterable[dict], *, loss_fn: LossFn = model_loss) -> list[torch.Tensor]:
    """|sum over tokens of activation x gradient| per FFN neuron (first-order Taylor)."""
    device = next(model.parameters()).device
    gates = [torch.ones(w, device=device, requires_grad=True) for w in st.ffn_widths(model)]
    scores = [torch.zeros(w) for w in st.ffn_widths(model)]
    was_training = model.training
    model.eval()
    with ffn_gates(model, gates):
        for batch in batches:
            # d L / d gate_i = sum over tokens of a_i * dL/da_i: the Taylor estimate of removing neuron i.
            grads = torch.autograd.grad(loss_fn(model, _to(batch, device)), gates)
            for i, g in enumerate(grads):
                scores[i] += g.detach().abs().cpu()
    model.train(was_training)
    return scores


def ffn_importance_magnitude(model: nn.Module) -> list[torch.Tensor]:
    """L2 norm of each neuron's input row and output column."""
    scores = []
    for layer in st.layers(model):
        w_in = layer.ffn_in.weight.detach()  # (ffn, hidden); gated: (2 * ffn, hidden)
        w_out = layer.ffn_out.weight.detach()  # (hidden, ffn)
        rows = w_in.pow(2).sum(1)
        if len(rows) != w_out.shape[1]:
            rows = rows.view(2, -1).sum(0)  # a gated neuron's input row and gate row
        scores.append((rows + w_out.pow(2).sum(0)).sqrt().cpu())
    return scores


def layer_importance_gradient(model: nn.Module, batches: Iterable[dict], *, loss_fn: LossFn = model_loss) -> torch.Tensor:
    """|dL/d g_l| summed over batches, g_l gating layer l's residual contribution."""
    device = next(model.parameters()).device
    gates = torch.ones(len(st.encoder_layers(model)), device=device, requires_grad=True)
    scores = torch.zeros(len(gates))
    was_training = model.training
    model.eval()
    with layer_gates(model, gates):
        for batch in batches:
            (grad,) = torch.autograd.grad(loss_fn(model, _to(batch, device)), [gates])
            scores += grad.detach().abs().cpu()
    model.train(was_training)
    return scores


def heads_to_remove(scores: Sequence[Sequence[float]], count: int, scope: str = "global") -> dict[int, list[int]]:
    """The ``count`` lowest-scoring heads, never the last head of a layer.

    ``global`` ranks all heads together; ``layer`` takes an equal share from each layer
    (the remainder from the layers whose next candidate scores lowest).
    """
    sizes = [len(s) for s in scores]
    removable = sum(n - 1 for n in sizes)
    if count > removable:
        raise CompressError(
            f"cannot remove {count} heads: only {removable} can go while keeping one per layer "
            f"(heads per layer {sizes}); drop whole layers with --remove-layers instead"
        )
    chosen: dict[int, list[int]] = {}
    if scope == "layer":
        per_layer = [sorted(range(n), key=lambda h, l=l: scores[l][h]) for l, n in enumerate(sizes)]
        taken = [0] * len(sizes)
        for _ in range(count):
            # the layer whose next head (in its own order) scores lowest, relative to its share
            candidates = [l for l in range(len(sizes)) if taken[l] < sizes[l] - 1]
            l = min(candidates, key=lambda l: (taken[l] / sizes[l], scores[l][per_layer[l][taken[l]]]))
            chosen.setdefault(l, []).append(per_layer[l][taken[l]])
            taken[l] += 1
        return {l: sorted(h) for l, h in chosen.items()}
    order = sorted(((float(scores[l][h]), l, h) for l, n in enumerate(sizes) for h in range(n)))
    left = list(sizes)
    for _, l, h in order:
        if len([x for v in chosen.values() for x in v]) == count:
            break
        if left[l] > 1:
            chosen.setdefault(l, []).append(h)
            left[l] -= 1
    return {l: sorted(h) for l, h in chosen.items()}
