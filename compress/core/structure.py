"""The only module that knows BERT's module paths.

Everything that needs to find a layer, an attention block or an FFN, or to change their
shapes, goes through here: the pruning, distillation and analysis stages, the artifact
loader, and FLOP counting. Shapes use PyTorch's Linear convention ``(out, in)``.

A *structure* is a plain dict (it is stored in ``compression.json``)::

    {"num_layers": 6, "hidden_size": 384, "head_size": 32,
     "heads": [12, 12, 8, ...],          # attention heads kept per layer
     "pruned_heads": {"2": [0, 5, ...]}, # original head ids removed, per layer
     "ffn": [1536, 1536, 900, ...],      # intermediate width per layer
     "kept_layers": [0, 1, 2, ...]}      # original layer ids, in order
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import torch
from torch import nn
from transformers import BertConfig

from compress.core.compat import STOCK_PRUNED_HEADS
from compress.core.errors import CompressError

# ---------------------------------------------------------------------------- finding modules


def base_model(model: nn.Module) -> nn.Module:
    """The ``BertModel`` inside any ``BertFor*`` head (or the model itself)."""
    inner = getattr(model, "bert", None)
    if inner is not None:
        return inner
    if hasattr(model, "encoder") and hasattr(model, "embeddings"):
        return model
    raise CompressError(f"{type(model).__name__} is not a BERT-architecture model")


def encoder_layers(model: nn.Module) -> nn.ModuleList:
    """The transformer blocks, in order: ``BertLayer`` modules."""
    return base_model(model).encoder.layer


def attention(layer: nn.Module) -> nn.Module:
    """The ``BertAttention`` block of one layer (self-attention + output projection)."""
    return layer.attention


def self_attention(layer: nn.Module) -> nn.Module:
    """Q/K/V projections of one layer: ``.query``, ``.key``, ``.value`` are Linear(hidden, heads*d)."""
    return layer.attention.self


def attention_output(layer: nn.Module) -> nn.Linear:
    """Output projection Linear(heads*d, hidden) of one layer."""
    return layer.attention.output.dense


def ffn_in(layer: nn.Module) -> nn.Linear:
    """First FFN Linear(hidden, ffn) of one layer (followed by GELU)."""
    return layer.intermediate.dense


def ffn_activation(layer: nn.Module) -> nn.Module:
    """The module whose output is one layer's FFN activations (batch, seq, ffn), after GELU."""
    return layer.intermediate


def ffn_out(layer: nn.Module) -> nn.Linear:
    """Second FFN Linear(ffn, hidden) of one layer."""
    return layer.output.dense


def embeddings(model: nn.Module) -> nn.Module:
    return base_model(model).embeddings


def pretraining_heads(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """(MLM head: hidden -> vocab logits, NSP head: pooled -> 2 logits) of a BertForPreTraining."""
    heads = getattr(model, "cls", None)
    if heads is None or not hasattr(heads, "seq_relationship"):
        raise CompressError(f"{type(model).__name__} has no pretraining heads; build a BertForPreTraining")
    return heads.predictions, heads.seq_relationship


class PretrainingForward(nn.Module):
    """A ``BertForPreTraining`` whose MLM head runs on the selected positions only.

    ``forward(input_ids, token_type_ids, attention_mask, labels)`` -> (MLM logits
    (n_selected, vocab), NSP logits (batch, 2)); ``labels`` is -100 where nothing is
    predicted. (n_selected, vocab) instead of (batch, seq, vocab) is what lets a 30k
    vocabulary fit. Training wraps this module, not the bare model, so that
    ``DistributedDataParallel`` sees the whole computation inside its own forward.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, token_type_ids, attention_mask, labels):
        mlm, nsp = pretraining_heads(self.model)
        out = base_model(self.model)(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
        return mlm(out.last_hidden_state[labels != -100]), nsp(out.pooler_output)


def mlm_head(model: nn.Module) -> nn.Module:
    """The MLM head (transform + decoder tied to the word embeddings) of a pretraining or MLM model."""
    heads = getattr(model, "cls", None)
    if heads is None:
        raise CompressError(f"{type(model).__name__} has no masked-LM head")
    return heads.predictions


def value_projection(model: nn.Module, layer_index: int) -> nn.Linear:
    """The value Linear(hidden, heads*d) of one layer (MiniLM's value relations read its output)."""
    return self_attention(encoder_layers(model)[layer_index]).value


@contextlib.contextmanager
def capture(modules: dict[str, nn.Module]) -> Iterator[dict[str, Any]]:
    """Record the forward outputs of ``modules`` by name while the block runs.

    The hooks are always removed on exit, also when the forward pass raises.
    """
    store: dict[str, Any] = {}
    handles = [
        module.register_forward_hook(lambda _m, _inp, out, name=name: store.__setitem__(name, out))
        for name, module in modules.items()
    ]
    try:
        yield store
    finally:
        for handle in handles:
            handle.remove()


def pooler(model: nn.Module) -> nn.Module | None:
    """The pooler (dense + tanh over [CLS]), or None when the model was built without one."""
    return getattr(base_model(model), "pooler", None)


def task_head(model: nn.Module) -> nn.Module | None:
    """The head on top of the encoder: ``classifier``, ``qa_outputs`` or ``cls`` (MLM/pretraining).

    None for a bare ``BertModel``.
    """
    for name in ("classifier", "qa_outputs", "cls"):
        head = getattr(model, name, None)
        if head is not None:
            return head
    return None


# ---------------------------------------------------------------------------- reading shapes


def heads_per_layer(model: nn.Module) -> list[int]:
    return [self_attention(layer).num_attention_heads for layer in encoder_layers(model)]


def ffn_widths(model: nn.Module) -> list[int]:
    return [ffn_in(layer).out_features for layer in encoder_layers(model)]


def describe(model: nn.Module) -> dict[str, Any]:
    """The structure dict of a model (see the module docstring)."""
    config = model.config
    pruned = {str(k): v for k, v in removed_heads(model).items()}
    kept = getattr(config, "compress_kept_layers", None)
    n = len(encoder_layers(model))
    return {
        "num_layers": n,
        "hidden_size": config.hidden_size,
        "head_size": config.hidden_size // config.num_attention_heads,
        "heads": heads_per_layer(model),
        "pruned_heads": pruned,
        "ffn": ffn_widths(model),
        "kept_layers": list(kept) if kept else list(range(n)),
    }


def count_parameters(model: nn.Module) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    seen, total = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def flops_per_sequence(structure: dict[str, Any], seq_len: int) -> int:
    """Matmul FLOPs of the encoder for one sequence (2 FLOPs per multiply-add).

    Per layer with hidden h, attention width a = heads*d and FFN width f, over s tokens:
    Q, K, V and output projections 4*s*h*a, scores QK^T and context AV 2*s*s*a,
    FFN 2*s*h*f multiply-adds. Embedding lookups, LayerNorm, softmax and the task head
    are left out, as in the usual BERT-base figure (22.35 GFLOPs at s=128).
    """
    h = structure["hidden_size"]
    d = structure["head_size"]
    macs = 0
    for heads, f in zip(structure["heads"], structure["ffn"]):
        a = heads * d
        macs += 4 * seq_len * h * a + 2 * seq_len * seq_len * a + 2 * seq_len * h * f
    return 2 * macs


# ---------------------------------------------------------------------------- surgery


def _slice_linear(linear: nn.Linear, index: torch.Tensor, dim: int) -> nn.Linear:
    """A new Linear keeping ``index`` along ``dim`` (0: output rows, 1: input columns)."""
    index = index.to(linear.weight.device)
    weight = linear.weight.detach().index_select(dim, index).clone()
    has_bias = linear.bias is not None
    bias = None
    if has_bias:
        bias = linear.bias.detach().clone() if dim == 1 else linear.bias.detach()[index].clone()
    out_f, in_f = weight.shape
    new = nn.Linear(in_f, out_f, bias=has_bias, device=weight.device, dtype=weight.dtype)
    new.weight.data.copy_(weight)
    if has_bias:
        new.bias.data.copy_(bias)
    new.weight.requires_grad_(linear.weight.requires_grad)
    return new


def resize_ffn(model: nn.Module, layer_index: int, keep: Iterable[int]) -> None:
    """Keep only the FFN neurons ``keep`` in one layer (rows of W1, columns of W2)."""
    layer = encoder_layers(model)[layer_index]
    keep = sorted(set(int(i) for i in keep))
    width = ffn_in(layer).out_features
    if not keep:
        raise CompressError(f"layer {layer_index}: cannot remove every FFN neuron; keep at least one")
    if keep[-1] >= width:
        raise CompressError(f"layer {layer_index}: FFN neuron {keep[-1]} does not exist (width {width})")
    index = torch.tensor(keep, dtype=torch.long)
    layer.intermediate.dense = _slice_linear(ffn_in(layer), index, 0)  # (ffn', hidden)
    layer.output.dense = _slice_linear(ffn_out(layer), index, 1)  # (hidden, ffn')


def set_ffn_widths(model: nn.Module, widths: list[int]) -> None:
    """Reshape (not slice) each layer's FFN to ``widths``: used before loading pruned weights."""
    layers = encoder_layers(model)
    if len(widths) != len(layers):
        raise CompressError(f"structure lists {len(widths)} FFN widths for {len(layers)} layers")
    for i, width in enumerate(widths):
        if ffn_in(layers[i]).out_features != width:
            resize_ffn(model, i, range(width))


def prune_heads(model: nn.Module, heads: dict[int, Iterable[int]]) -> None:
    """Physically remove attention heads: Q/K/V output rows and output-projection columns.

    ``heads`` maps layer index to *current* head ids. The toolkit's own surgery (no
    ``prune_heads`` of transformers, which 5.x removed); ``config.pruned_heads`` records
    the *original* ids removed per layer, which transformers 4.x reads to rebuild the
    narrower heads, so the folder also reloads with stock ``from_pretrained`` there.
    """
    current = heads_per_layer(model)
    plan: dict[int, list[int]] = {}
    for layer, ids in heads.items():
        ids = sorted(set(int(h) for h in ids))
        if not ids:
            continue
        if not 0 <= layer < len(current):
            raise CompressError(f"cannot prune heads of layer {layer}: the model has {len(current)} layers")
        if ids[-1] >= current[layer] or ids[0] < 0:
            raise CompressError(f"layer {layer} has {current[layer]} heads; head {ids[-1]} does not exist")
        if len(ids) >= current[layer]:
            raise CompressError(
                f"pruning layer {layer} would remove all {current[layer]} heads; keep at least one "
                "or drop the whole layer"
            )
        plan[layer] = ids
    removed = removed_heads(model)
    for layer, ids in plan.items():
        # Current id c is the c-th original head still present in this layer.
        present = [h for h in range(current[layer] + len(removed.get(layer, []))) if h not in removed.get(layer, [])]
        removed[layer] = sorted({*removed.get(layer, []), *(present[c] for c in ids)})
        _remove_heads(encoder_layers(model)[layer], ids)
    model.config.pruned_heads = removed


def removed_heads(model: nn.Module) -> dict[int, list[int]]:
    """Original head ids removed so far, per layer (from ``config.pruned_heads``; {} when none)."""
    # getattr: transformers 5.x configs have no pruned_heads unless the toolkit set one.
    recorded = getattr(model.config, "pruned_heads", None) or {}
    return {int(k): sorted(int(h) for h in v) for k, v in recorded.items() if v}


def _remove_heads(layer: nn.Module, ids: list[int]) -> None:
    """Slice heads ``ids`` (current ids) out of one layer's Q/K/V rows and output columns."""
    sa = self_attention(layer)
    d = sa.attention_head_size
    keep = [h for h in range(sa.num_attention_heads) if h not in set(ids)]
    index = torch.tensor([h * d + i for h in keep for i in range(d)], dtype=torch.long)  # (kept heads * d,)
    sa.query = _slice_linear(sa.query, index, 0)
    sa.key = _slice_linear(sa.key, index, 0)
    sa.value = _slice_linear(sa.value, index, 0)
    layer.attention.output.dense = _slice_linear(attention_output(layer), index, 1)
    # Forward passes reshape with these (4.x: num_attention_heads, all_head_size; 5.x: head size only).
    sa.num_attention_heads = len(keep)
    sa.all_head_size = len(keep) * d


def set_heads(model: nn.Module, heads: list[int]) -> None:
    """Reshape (not choose) each layer's attention to ``heads`` heads: used before loading pruned weights."""
    for i, (now, want) in enumerate(zip(heads_per_layer(model), heads)):
        if now != want:
            _remove_heads(encoder_layers(model)[i], list(range(want, now)))


def drop_layers(model: nn.Module, keep: Iterable[int]) -> None:
    """Keep only the encoder layers ``keep`` (current indices, any order kept sorted)."""
    layers = encoder_layers(model)
    keep = sorted(set(int(i) for i in keep))
    if not keep:
        raise CompressError("cannot drop every layer; keep at least one")
    if keep[-1] >= len(layers) or keep[0] < 0:
        raise CompressError(f"layer {keep[-1]} does not exist; the model has {len(layers)} layers")
    previous = getattr(model.config, "compress_kept_layers", None) or list(range(len(layers)))
    pruned = removed_heads(model)
    base_model(model).encoder.layer = nn.ModuleList([layers[i] for i in keep])
    for new_index, layer in enumerate(base_model(model).encoder.layer):
        # Newer transformers use layer_idx for caches; keep it consistent after the cut.
        sa = self_attention(layer)
        if hasattr(sa, "layer_idx"):
            sa.layer_idx = new_index
    model.config.num_hidden_layers = len(keep)
    model.config.pruned_heads = {new: pruned[old] for new, old in enumerate(keep) if pruned.get(old)}
    model.config.compress_kept_layers = [previous[i] for i in keep]


def apply_structure(model: nn.Module, structure: dict[str, Any]) -> None:
    """Give a freshly built model (from its config.json) the stored per-layer shapes.

    Layers come from ``num_hidden_layers``; heads from ``config.pruned_heads`` at
    construction time on transformers 4.x, and from here on 5.x; a per-layer FFN width is
    what no BertConfig can express.
    """
    if structure.get("num_layers", len(encoder_layers(model))) != len(encoder_layers(model)):
        raise CompressError(
            f"compression.json says {structure['num_layers']} layers but config.json builds "
            f"{len(encoder_layers(model))}; the directory is inconsistent"
        )
    if "ffn" in structure:
        set_ffn_widths(model, list(structure["ffn"]))
    if "heads" in structure and not STOCK_PRUNED_HEADS:
        set_heads(model, list(structure["heads"]))
    if "heads" in structure and heads_per_layer(model) != list(structure["heads"]):
        raise CompressError(
            f"compression.json lists heads {structure['heads']} but config.json's pruned_heads "
            f"builds {heads_per_layer(model)}; the directory is inconsistent"
        )


# ---------------------------------------------------------------------------- shapes


@dataclass(frozen=True)
class Shape:
    """An encoder shape: layers, hidden width, attention heads, FFN width."""

    layers: int
    hidden: int
    heads: int
    ffn: int
    origin: str = ""  # where the shape was published

    def __post_init__(self):
        for name in ("layers", "hidden", "heads", "ffn"):
            if getattr(self, name) < 1:
                raise CompressError(f"shape {name} must be at least 1, got {getattr(self, name)}")
        if self.hidden % self.heads:
            raise CompressError(f"hidden size {self.hidden} is not divisible by {self.heads} heads")

    @property
    def label(self) -> str:
        return f"{self.layers}L-{self.hidden}" + (f"-{self.ffn}" if self.ffn != 4 * self.hidden else "")


def make_config(shape: Shape, vocab_size: int, max_positions: int = 512, **extra):
    """A ``BertConfig`` for ``shape`` with BERT's defaults (GELU, dropout 0.1, 2 segments)."""
    return BertConfig(
        vocab_size=vocab_size,
        hidden_size=shape.hidden,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        intermediate_size=shape.ffn,
        max_position_embeddings=max_positions,
        hidden_act="gelu",
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        type_vocab_size=2,
        **extra,
    )


def parse_shape(text: str) -> Shape:
    """``"4L-312-1200"`` or ``"6L-384"`` (FFN 4x hidden, heads = hidden/64 or 12 if it divides)."""
    m = re.fullmatch(r"(\d+)L-(\d+)(?:-(\d+))?(?:-(\d+)H)?", text.strip(), flags=re.IGNORECASE)
    if not m:
        raise CompressError(f"cannot read shape {text!r}; write LAYERSL-HIDDEN[-FFN], e.g. 4L-312-1200")
    layers, hidden = int(m[1]), int(m[2])
    ffn = int(m[3]) if m[3] else 4 * hidden
    heads = int(m[4]) if m[4] else (hidden // 64 if hidden % 64 == 0 and hidden >= 64 else 1)
    return Shape(layers, hidden, heads, ffn)
