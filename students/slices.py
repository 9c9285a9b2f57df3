"""A narrower student cut out of the teacher: chosen layers, hidden dimensions, heads, head dimensions, FFN neurons.

A student of the teacher's width starts as a copy of some of its layers (``init.py``).
A narrower one (TinyBERT's 4L-312 from a 384-wide teacher) would start at random and
need days of general distillation; instead every weight is taken from the teacher, keeping
the most important slices of each dimension (the width-pruning initialisation of
Minitron, Muralidharan et al. 2024):

* **hidden** (the residual stream, one choice for the whole model): the dimensions with
  the largest mean ``|activation|`` over the teacher's hidden states, measured on seeded
  random token sequences (no data needed; the few outlier dimensions every trained
  encoder has are what must stay);
* **heads**: the heads whose value/output path has the largest norm, ``||W_v^h|| ||W_o^h||``; where every layer
  reads one table with a column per head (MPNet's position bias), the same heads in every layer, ranked by that norm
  summed over the layers (each layer's norms scaled to sum to 1), and the table keeps their columns;
* **head dimensions**: for queries and keys the dimensions with the largest
  ``||W_q[i]|| ||W_k[i]||``, for values the largest ``||W_v[i]|| ||W_o[:, i]||``. Queries are
  not rescaled: the student's ``1/sqrt(d_student)`` sharpens the logits a little, which
  makes up for the dimensions dropped (rescaling by ``sqrt(d_student / d_teacher)`` to keep
  the teacher's temperature measured 0.5 point worse zero-shot on STS-B, ``bench/slices.py``);
* **FFN neurons**: the largest ``||W_in[j]|| ||W_out[:, j]||`` (gated FFNs: input and gate rows together).

LayerNorms then normalise over the kept dimensions only, so the student is close to,
not equal to, the teacher's layers; distillation closes the gap. Shapes follow PyTorch's
Linear convention ``(out, in)``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from compress.core.model import structure as st
from compress.core.errors import CompressError
from compress.core.model.shapes import Shape
from compress.core.model.structure import Layer

PROBE_SEQUENCES, PROBE_LENGTH = 8, 128  # random-token probe for the hidden-dimension ranking
RESCALE_QUERIES = False  # keep the teacher's attention temperature exactly (the ablation in bench/slices.py)


def _top(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` largest scores, in their original order (so slices keep the teacher's layout)."""
    return torch.sort(torch.topk(scores, k).indices).values


def hidden_importance(teacher: nn.Module, seed: int = 0) -> torch.Tensor:
    """Mean |activation| per hidden dimension over every hidden state, on seeded random tokens; shape (hidden,)."""
    sizes = st.config_sizes(teacher.config)
    vocab, positions = sizes.vocab, sizes.max_positions
    length = min(PROBE_LENGTH, positions - 2)  # RoBERTa's positions start after the padding index
    device = next(teacher.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (PROBE_SEQUENCES, length), generator=generator).to(device)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if "token_type_ids" in st.input_names(teacher):
        inputs["token_type_ids"] = torch.zeros_like(ids)
    base, was_training = st.base_model(teacher), teacher.training
    teacher.eval()
    try:
        with torch.no_grad():
            states = base(**inputs, output_hidden_states=True).hidden_states
    finally:
        teacher.train(was_training)
    return torch.stack([h.float().abs().mean(dim=(0, 1)) for h in states]).mean(dim=0).cpu()


def fits_inside(teacher_config, shape: Shape) -> bool:
    """True when ``shape`` can be cut from an unpruned teacher of ``teacher_config``: no size wider than the teacher's."""
    size = st.config_sizes(teacher_config)
    head = shape.hidden // shape.heads
    rotary = st.rotary_heads(teacher_config)  # ModernBERT heads keep their width (see cut_problems)
    return (shape.layers <= size.layers and shape.hidden <= size.hidden and shape.heads <= size.heads
            and shape.ffn <= size.ffn and (head == size.head_size if rotary else head <= size.head_size))


def cut_problems(teacher: nn.Module, shape: Shape) -> list[str]:
    """Why ``shape`` cannot be cut from ``teacher`` (empty when it can)."""
    encoder = st.Encoder.of(teacher)
    hidden, first = encoder.sizes.hidden, encoder.layer(0)
    problems = []
    if st.removed_heads(teacher) or len(set(st.heads_per_layer(teacher))) != 1:
        problems.append(f"the teacher has pruned heads (heads per layer {st.heads_per_layer(teacher)})")
    if shape.hidden > hidden:
        problems.append(f"hidden size {shape.hidden} is wider than the teacher's {hidden}")
    if shape.heads > first.heads:
        problems.append(f"{shape.heads} heads are more than the teacher's {first.heads}")
    if shape.hidden // shape.heads > first.head_size:  # (Shape guarantees heads divide the width)
        problems.append(f"heads of {shape.hidden // shape.heads} dimensions are wider than the teacher's {first.head_size}")
    elif shape.hidden // shape.heads != first.head_size and first.fused:
        # ModernBERT's rotary embedding pairs dimension i with i + d/2 at a frequency set by d.
        problems.append(f"{encoder.family.model_type} heads (rotary positions) cannot lose dimensions")
    narrowest = min(st.ffn_widths(teacher))
    if shape.ffn > narrowest:
        problems.append(f"FFN width {shape.ffn} is wider than the teacher's {narrowest}")
    return problems


def _head_scores(layer: Layer) -> torch.Tensor:
    """``||W_v^h|| ||W_o^h||`` per head: (heads, head size) per-dimension products, normed per head; shape (heads,)."""
    w_v, w_o = layer.qkv_weights[2].detach().float(), layer.output.weight.detach().float()
    return (w_v.norm(dim=1) * w_o.norm(dim=0)).view(layer.heads, layer.head_size).norm(dim=1)


def shared_heads(layers: list[Layer], heads: int) -> torch.Tensor:
    """The ``heads`` teacher heads every student layer keeps when the layers share a per-head table (MPNet).

    Each layer's head scores are scaled to sum to 1, so no layer outweighs the others, then summed.
    """
    total = sum(scores / scores.sum().clamp_min(1e-12) for scores in map(_head_scores, layers))
    return _top(total, heads)


def _attention_slices(layer: Layer, heads: int, size: int,
                      kept: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Row indices into W_q/W_k and into W_v (teacher layout, head-major) for ``heads`` heads of ``size`` dims.

    ``kept``: the teacher heads to keep (default: this layer's ``heads`` best by :func:`_head_scores`)."""
    w_q, w_k, w_v = (w.detach().float() for w in layer.qkv_weights)
    w_o = layer.output.weight.detach().float()
    d, n = layer.head_size, layer.heads
    qk = (w_q.norm(dim=1) * w_k.norm(dim=1)).view(n, d)
    v = (w_v.norm(dim=1) * w_o.norm(dim=0)).view(n, d)
    kept = _top(_head_scores(layer), heads) if kept is None else kept
    qk_rows = torch.cat([h * d + _top(qk[h], size) for h in kept.tolist()])
    v_rows = torch.cat([h * d + _top(v[h], size) for h in kept.tolist()])
    return qk_rows, v_rows


def _ffn_slice(layer: Layer, width: int) -> torch.Tensor:
    w_in, w_out = layer.ffn_in.weight.detach().float(), layer.ffn_out.weight.detach().float()
    n = w_out.shape[1]
    scores = w_in.norm(dim=1)
    if layer.glu:  # input rows, then gate rows
        scores = scores[:n] * scores[n:]
    return _top(scores * w_out.norm(dim=0), width)


def _layer_axes(teacher_layer: Layer, student_layer: Layer, shape: Shape,
                kept: torch.Tensor | None = None) -> dict[int, dict[int, torch.Tensor]]:
    """For each student parameter of one layer (by id), the teacher indices of each axis that is not hidden."""
    size = shape.hidden // shape.heads
    qk_rows, v_rows = _attention_slices(teacher_layer, shape.heads, size, kept)
    neurons = _ffn_slice(teacher_layer, shape.ffn)
    width, ffn = teacher_layer.qkv_weights[0].shape[0], teacher_layer.ffn_width
    axes: dict[int, dict[int, torch.Tensor]] = {}

    def claim(linear: nn.Linear, axis: int, index: torch.Tensor) -> None:
        axes[id(linear.weight)] = {axis: index}
        if axis == 0 and linear.bias is not None:
            axes[id(linear.bias)] = {0: index}

    projections = student_layer.projections
    if len(projections) == 1:  # fused rows: Q of every head, then K, then V
        claim(projections[0], 0, torch.cat([qk_rows, width + qk_rows, 2 * width + v_rows]))
    else:
        for linear, rows in zip(projections, (qk_rows, qk_rows, v_rows)):
            claim(linear, 0, rows)
    claim(student_layer.output, 1, v_rows)
    claim(student_layer.ffn_in, 0, torch.cat([neurons, ffn + neurons]) if teacher_layer.glu else neurons)
    claim(student_layer.ffn_out, 1, neurons)
    return axes


def _take(source: torch.Tensor, target: torch.Tensor, axes: dict[int, torch.Tensor], hidden: torch.Tensor,
          teacher_hidden: int, name: str) -> torch.Tensor:
    """``source`` cut to ``target``'s shape: claimed axes by their index, other narrowed axes by ``hidden``."""
    out = source.detach()
    for axis, (have, want) in enumerate(zip(source.shape, target.shape)):
        if axis in axes:
            out = out.index_select(axis, axes[axis].to(out.device))
        elif have != want:
            if have != teacher_hidden or want != len(hidden):
                raise RuntimeError(f"no slice rule for {name}: axis {axis} is {have} in the teacher, {want} in the student")
            out = out.index_select(axis, hidden.to(out.device))
    if out.shape != target.shape:
        raise RuntimeError(f"slicing {name} gave {tuple(out.shape)}, the student needs {tuple(target.shape)}")
    return out


def cut_from_teacher(student: nn.Module, teacher: nn.Module, shape: Shape, layers: list[int], seed: int = 0) -> None:
    """Fill every weight of ``student`` (already built at ``shape``, narrower than the teacher) from teacher slices.

    ``layers`` are the 0-based teacher layers, one per student layer.
    """
    problems = cut_problems(teacher, shape)
    if problems:
        raise CompressError(f"cannot cut a {shape.label} student out of the teacher: {'; '.join(problems)}; "
                            "use --init random, or --init DIR with a pretrained student of that shape")
    t_encoder, s_encoder = st.Encoder.of(teacher), st.Encoder.of(student)
    t_hidden = t_encoder.sizes.hidden
    hidden = _top(hidden_importance(teacher, seed), shape.hidden)
    table, kept, table_axes = s_encoder.head_table, None, {}
    if table is not None:  # one table of per-head columns serves every layer: the same heads everywhere
        kept = shared_heads([t_encoder.layer(i) for i in layers], shape.heads)
        table_axes = {id(table.weight): {1: kept}}  # (buckets, heads): the kept heads' columns
    pairs: list[tuple[nn.Module, nn.Module, dict]] = []
    for target, source in zip(s_encoder.layers, layers):
        teacher_layer = t_encoder.layer(source)
        pairs.append((target.module, teacher_layer.module, _layer_axes(teacher_layer, target, shape, kept)))
    outside, teacher_outside = st.outside_layers(student), st.outside_layers(teacher)
    if outside.keys() != teacher_outside.keys():
        raise CompressError("the student and teacher differ in whether they have a pooler or task head")
    pairs += [(outside[name], teacher_outside[name], table_axes) for name in outside]

    filled: set[int] = set()
    with torch.no_grad():
        for target, source, axes in pairs:
            sources = dict(source.named_parameters())
            for name, param in target.named_parameters():
                if id(param) in filled:  # a weight tied to one already cut (the MLM decoder)
                    continue
                param.copy_(_take(sources[name], param, axes.get(id(param), {}), hidden, t_hidden, name))
                filled.add(id(param))
        scale = math.sqrt((shape.hidden // shape.heads) / t_encoder.layer(0).head_size)
        if RESCALE_QUERIES and scale != 1.0:
            for layer in s_encoder.layers:
                _scale_queries(layer, scale)
    student.tie_weights()
    left = [name for name, p in student.named_parameters() if id(p) not in filled]
    if left:
        raise RuntimeError(f"cut_from_teacher left {len(left)} parameters unfilled, e.g. {left[0]}")


def _scale_queries(layer: Layer, scale: float) -> None:
    projections = layer.projections
    rows = slice(0, projections[0].out_features // 3) if len(projections) == 1 else slice(None)
    for p in (projections[0].weight, projections[0].bias):
        if p is not None:
            p[rows] *= scale
