"""Module paths, surgery, shapes and FLOPs of every supported encoder, through its family.

Everything that needs to find a layer, an attention block or an FFN, or to change their
shapes, goes through here: the pruning, distillation and analysis stages, the artifact
loader, and FLOP counting. What differs between encoder families (BERT, RoBERTa, XLM-R,
DistilBERT, ELECTRA, ModernBERT: module paths, attribute names, head classes, inputs) is
written once per family in ``compress.core.families``; this module applies it, so no
other module names a family's modules. Model-level accessors find the family from
``model.config.model_type``; layer-level ones from the layer's layout (families whose
layers are laid out alike share it). Shapes use PyTorch's Linear convention ``(out, in)``.

A *structure* is a plain dict (it is stored in ``compression.json``)::

    {"num_layers": 6, "hidden_size": 384, "head_size": 32,
     "heads": [12, 12, 8, ...],          # attention heads kept per layer
     "pruned_heads": {"2": [0, 5, ...]}, # original head ids removed, per layer
     "ffn": [1536, 1536, 900, ...],      # intermediate width per layer
     "kept_layers": [0, 1, 2, ...]}      # original layer ids, in order

plus ``"glu": true`` for a gated FFN (ModernBERT: two input rows per neuron), and
``"first_token_last_layer": true`` for a graph whose last layer computes the first token
only (:func:`first_token_only`; its FLOPs are counted that way).
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import torch
from torch import nn
from transformers import BertConfig

from compress.core.compat import STOCK_PRUNED_HEADS, TRANSFORMERS_MAJOR
from compress.core.errors import CompressError
from compress.core.families import FAMILIES, Family, family_of

# ---------------------------------------------------------------------------- finding modules


def _has(module: nn.Module, path: str) -> bool:
    try:
        module.get_submodule(path)
    except AttributeError:
        return False
    return True


def _replace(root: nn.Module, path: str, new: nn.Module) -> None:
    """Put ``new`` at the dotted ``path`` below ``root``."""
    parent, _, name = path.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, name, new)


def family(model: nn.Module) -> Family:
    """The model's encoder family (from ``config.model_type``); unknown ones fail naming the known families."""
    return family_of(model)


def base_model(model: nn.Module) -> nn.Module:
    """The base encoder (``BertModel``, ``RobertaModel``, ``ModernBertModel``, ...) inside any task model, or the model itself."""
    fam = family_of(model)
    inner = getattr(model, fam.base, None)
    if isinstance(inner, nn.Module) and _has(inner, fam.layers):
        return inner
    if _has(model, fam.layers):
        return model
    raise CompressError(f"{type(model).__name__} is not a {fam.model_type} encoder model")


def encoder_layers(model: nn.Module) -> nn.ModuleList:
    """The transformer blocks, in order (``BertLayer``, ``TransformerBlock``, ``ModernBertEncoderLayer`` ...)."""
    return base_model(model).get_submodule(family_of(model).layers)


def layers_path(model: nn.Module) -> str:
    """The qualified name of the encoder's layer list in ``model`` (``bert.encoder.layer``, ``model.layers``)."""
    layers = encoder_layers(model)
    return next(name for name, module in model.named_modules() if module is layers)


_LAYOUTS: dict[type, Family] = {}  # layer class -> the (first) family laid out like it


def layer_family(layer: nn.Module) -> Family:
    """The family whose layer layout ``layer`` has (BERT, RoBERTa, XLM-R and ELECTRA share one)."""
    kind = type(layer)
    if kind not in _LAYOUTS:
        for _, fam in FAMILIES.items():
            att = fam.attention
            paths = (att.output, fam.ffn_in, fam.ffn_out, *(f"{att.module}.{p}" for p in att.projections))
            if all(_has(layer, p) for p in paths):
                _LAYOUTS[kind] = fam
                break
        else:
            raise CompressError(f"{kind.__name__} is not an encoder layer of a known family ({', '.join(FAMILIES.names())})")
    return _LAYOUTS[kind]


def self_attention(layer: nn.Module) -> nn.Module:
    """The module holding one layer's Q/K/V projections and head-count attributes."""
    return layer.get_submodule(layer_family(layer).attention.module)


def qkv_projections(layer: nn.Module) -> list[nn.Linear]:
    """Q, K, V Linear(hidden, heads*d) of one layer, or its one fused Linear(hidden, 3*heads*d)."""
    att = layer_family(layer).attention
    module = self_attention(layer)
    return [module.get_submodule(p) for p in att.projections]


def head_size(layer: nn.Module) -> int:
    """d, the width of one attention head."""
    return int(getattr(self_attention(layer), layer_family(layer).attention.head_size))


def num_heads(layer: nn.Module) -> int:
    """Attention heads of one layer, read from the projection's width (every version keeps that right)."""
    width = qkv_projections(layer)[0].out_features
    return width // (3 if layer_family(layer).attention.fused else 1) // head_size(layer)


def qkv_weights(layer: nn.Module) -> list[torch.Tensor]:
    """[W_q, W_k, W_v] of one layer, each (heads*d, hidden) with head h in rows h*d..(h+1)*d."""
    weights = [p.weight for p in qkv_projections(layer)]
    return list(weights[0].chunk(3, dim=0)) if len(weights) == 1 else weights  # fused rows: Q, then K, then V


def attention_output(layer: nn.Module) -> nn.Linear:
    """Output projection Linear(heads*d, hidden) of one layer; its input is every head's output."""
    return layer.get_submodule(layer_family(layer).attention.output)


def ffn_in(layer: nn.Module) -> nn.Linear:
    """First FFN Linear(hidden, ffn) of one layer (gated FFN: (2*ffn, hidden), input rows then gate rows)."""
    return layer.get_submodule(layer_family(layer).ffn_in)


def ffn_out(layer: nn.Module) -> nn.Linear:
    """Second FFN Linear(ffn, hidden) of one layer; its input is the FFN activations (batch, seq, ffn)."""
    return layer.get_submodule(layer_family(layer).ffn_out)


def ffn_width(layer: nn.Module) -> int:
    return ffn_out(layer).in_features


def embeddings(model: nn.Module) -> nn.Module:
    return base_model(model).get_submodule(family_of(model).embeddings)


def input_names(model) -> tuple[str, ...]:
    """The inputs the model's forward takes, in exported-graph order (DistilBERT, ModernBERT: no token_type_ids)."""
    return family_of(model).inputs


TARGETS = ("labels", "start_positions", "end_positions")  # what a head's loss reads from a batch


def model_inputs(model, batch: dict, *, targets: bool = False) -> dict:
    """The entries of ``batch`` the model's forward takes (a BERT tokenizer's token_type_ids go to BERT only).

    With ``targets``, also the labels or answer positions its head computes the loss from.
    """
    if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
        model = model.module  # a training loop's wrapper: the family is the wrapped model's
    names = (*input_names(model), *TARGETS) if targets else input_names(model)
    return {k: batch[k] for k in names if k in batch}


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
    """The MLM head (hidden states -> vocabulary logits, decoder tied to the word embeddings) of a pretraining or MLM model."""
    fam = family_of(model)
    try:
        head = fam.mlm_head(model) if fam.mlm_head is not None else None
    except AttributeError:
        head = None
    if head is None:
        raise CompressError(f"{type(model).__name__} has no masked-LM head")
    return head


def value_projection(model: nn.Module, layer_index: int) -> nn.Module | tuple[nn.Module, Callable]:
    """What :func:`capture` records as one layer's values (batch, seq, heads*d) (MiniLM's value relations).

    The value Linear(hidden, heads*d); for a fused Q/K/V projection, that Linear and the
    function taking its value rows out of the output.
    """
    layer = encoder_layers(model)[layer_index]
    att = layer_family(layer).attention
    if not att.fused:
        return self_attention(layer).get_submodule(att.projections[2])
    return qkv_projections(layer)[0], lambda out: out.chunk(3, dim=-1)[2]  # (batch, seq, 3*heads*d): Q, K, V


@contextlib.contextmanager
def capture(modules: dict[str, nn.Module | tuple[nn.Module, Callable]]) -> Iterator[dict[str, Any]]:
    """Record the forward outputs of ``modules`` by name while the block runs.

    A ``(module, transform)`` pair records ``transform(output)``. The hooks are always
    removed on exit, also when the forward pass raises.
    """
    store: dict[str, Any] = {}
    handles = []
    for name, entry in modules.items():
        module, transform = entry if isinstance(entry, tuple) else (entry, None)

        def hook(_m, _inp, out, name=name, transform=transform):
            store[name] = transform(out) if transform is not None else out

        handles.append(module.register_forward_hook(hook))
    try:
        yield store
    finally:
        for handle in handles:
            handle.remove()


def pooler(model: nn.Module) -> nn.Module | None:
    """The pooler (dense + tanh over [CLS]), or None when the model was built without one."""
    return getattr(base_model(model), "pooler", None)


def task_head(model: nn.Module) -> nn.Module | None:
    """The head on top of the encoder: ``classifier``, ``qa_outputs``, ``cls`` (BERT MLM/pretraining) or ``lm_head``.

    None for a bare base model. (Some heads have more parts, e.g. DistilBERT's
    ``pre_classifier``; :func:`outside_layers` lists every part.)
    """
    for name in ("classifier", "qa_outputs", "cls", "lm_head"):
        head = getattr(model, name, None)
        if head is not None:
            return head
    return None


def outside_layers(model: nn.Module) -> dict[str, nn.Module]:
    """Every part of the model outside its encoder layers, by name: embeddings, pooler, final norm, head parts."""
    layers = encoder_layers(model)

    def walk(module: nn.Module, prefix: str) -> Iterator[tuple[str, nn.Module]]:
        for name, child in module.named_children():
            if child is layers:
                continue
            if any(m is layers for m in child.modules()):
                yield from walk(child, f"{prefix}{name}.")
            else:
                yield f"{prefix}{name}", child

    return dict(walk(model, ""))


# ---------------------------------------------------------------------------- reading shapes


def config_size(config, name: str) -> int:
    """``layers``, ``hidden``, ``heads`` or ``ffn`` from a config, under its family's attribute name."""
    return getattr(config, getattr(family_of(config).sizes, name))


def set_config_size(config, name: str, value: int) -> None:
    setattr(config, getattr(family_of(config).sizes, name), value)


def heads_per_layer(model: nn.Module) -> list[int]:
    return [num_heads(layer) for layer in encoder_layers(model)]


def ffn_widths(model: nn.Module) -> list[int]:
    return [ffn_width(layer) for layer in encoder_layers(model)]


def layer_origins(model: nn.Module) -> list[int]:
    """Original layer ids of the current layers (after dropped layers, or a student's teacher layers)."""
    kept = getattr(model.config, "compress_kept_layers", None)
    return list(kept) if kept else list(range(len(encoder_layers(model))))


def describe(model: nn.Module) -> dict[str, Any]:
    """The structure dict of a model (see the module docstring)."""
    config = model.config
    pruned = {str(k): v for k, v in removed_heads(model).items()}
    n = len(encoder_layers(model))
    structure = {
        "num_layers": n,
        "hidden_size": config_size(config, "hidden"),
        "head_size": config_size(config, "hidden") // config_size(config, "heads"),
        "heads": heads_per_layer(model),
        "pruned_heads": pruned,
        "ffn": ffn_widths(model),
        "kept_layers": layer_origins(model),
    }
    if family_of(model).glu:
        structure["glu"] = True
    if getattr(encoder_layers(model)[-1], FIRST_TOKEN, False):
        structure[FIRST_TOKEN] = True
    return structure


FIRST_TOKEN = "first_token_last_layer"  # structure key, and the marker on a layer first_token_only changed


def first_token_only(model: nn.Module) -> bool:
    """Make the last encoder layer compute the first token's output only; False if the family cannot.

    For a head that reads nothing but the first token (sequence classification: BERT's
    pooler, RoBERTa's and ELECTRA's classifier, DistilBERT's pre-classifier): its keys and
    values still come from every token, but its query, output projection and FFN run on one
    token instead of s, and the encoder's output becomes (batch, 1, hidden). The logits are
    the full model's (to float rounding). Changes the model in place: for exports, whose
    graphs are traced from this forward; training and hidden-state distillation keep every token.
    """
    fam = family(model)
    if fam.finish_layer is None or fam.attention.fused:
        return False
    layer = encoder_layers(model)[-1]
    if num_heads(layer) == 0:
        return False  # every head pruned: no attention to split
    query, key, value = qkv_projections(layer)
    d = head_size(layer)

    def forward(hidden_states, attention_mask=None, *args, **kwargs):
        batch, seq = hidden_states.shape[0], hidden_states.shape[1]
        first = hidden_states[:, :1]  # (batch, 1, hidden)
        q = query(first).view(batch, 1, -1, d).transpose(1, 2)  # (batch, heads, 1, d)
        k = key(hidden_states).view(batch, seq, -1, d).transpose(1, 2)  # (batch, heads, seq, d)
        v = value(hidden_states).view(batch, seq, -1, d).transpose(1, 2)
        scores = _mask_first_query(q @ k.transpose(-1, -2) * d ** -0.5, attention_mask)  # (batch, heads, 1, seq)
        context = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(batch, 1, -1)  # (batch, 1, heads*d)
        out = fam.finish_layer(layer, context, first)
        return out if TRANSFORMERS_MAJOR >= 5 else (out,)  # 4.x layers return a tuple

    layer.forward = forward
    setattr(layer, FIRST_TOKEN, True)
    return True


def _mask_first_query(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Scores (batch, heads, 1, seq) with the padding masked, for the masks the encoders hand their layers."""
    if mask is None:
        return scores
    if mask.dim() == 2:  # (batch, seq), 1 keep / 0 padding: DistilBERT's eager path on transformers 4.x
        return scores.masked_fill(mask[:, None, None, :] == 0, torch.finfo(scores.dtype).min)
    mask = mask[..., :1, :]  # (batch, 1, 1 or seq, seq): the first query's row
    if mask.dtype == torch.bool:  # True: attend
        return scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return scores + mask  # additive: 0, or a large negative number at padding


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
    FFN 2*s*h*f multiply-adds (3*s*h*f for a gated FFN: input, gate and output matrices).
    Embedding lookups, LayerNorm, softmax and the task head are left out, as in the usual
    BERT-base figure (22.35 GFLOPs at s=128). A last layer that computes the first token
    only (``first_token_last_layer``) counts K and V over s tokens and the rest over one:
    2*s*h*a + 2*h*a + 2*s*a + 2*h*f.
    """
    h = structure["hidden_size"]
    d = structure["head_size"]
    ffn_matrices = 3 if structure.get("glu") else 2
    last = len(structure["heads"]) - 1
    macs = 0
    for i, (heads, f) in enumerate(zip(structure["heads"], structure["ffn"])):
        a = heads * d
        queries = 1 if i == last and structure.get(FIRST_TOKEN) else seq_len  # tokens whose outputs the layer computes
        macs += 2 * seq_len * h * a + 2 * queries * h * a + 2 * queries * seq_len * a + ffn_matrices * queries * h * f
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


def ffn_rows(layer: nn.Module, keep: Iterable[int]) -> list[int]:
    """Rows of :func:`ffn_in` that belong to FFN neurons ``keep`` (a gated FFN: each neuron's input and gate row)."""
    keep = list(keep)
    if layer_family(layer).glu:
        width = ffn_width(layer)
        return keep + [width + i for i in keep]
    return keep


def resize_ffn(model: nn.Module, layer_index: int, keep: Iterable[int]) -> None:
    """Keep only the FFN neurons ``keep`` in one layer (rows of W1, columns of W2)."""
    layer = encoder_layers(model)[layer_index]
    fam = layer_family(layer)
    keep = sorted(set(int(i) for i in keep))
    width = ffn_width(layer)
    if not keep:
        raise CompressError(f"layer {layer_index}: cannot remove every FFN neuron; keep at least one")
    if keep[-1] >= width:
        raise CompressError(f"layer {layer_index}: FFN neuron {keep[-1]} does not exist (width {width})")
    rows = torch.tensor(ffn_rows(layer, keep), dtype=torch.long)
    index = torch.tensor(keep, dtype=torch.long)
    _replace(layer, fam.ffn_in, _slice_linear(ffn_in(layer), rows, 0))  # (ffn' (x2 gated), hidden)
    _replace(layer, fam.ffn_out, _slice_linear(ffn_out(layer), index, 1))  # (hidden, ffn')


def set_ffn_widths(model: nn.Module, widths: list[int]) -> None:
    """Reshape (not slice) each layer's FFN to ``widths``: used before loading pruned weights."""
    layers = encoder_layers(model)
    if len(widths) != len(layers):
        raise CompressError(f"structure lists {len(widths)} FFN widths for {len(layers)} layers")
    for i, width in enumerate(widths):
        if ffn_width(layers[i]) != width:
            resize_ffn(model, i, range(width))


def prune_heads(model: nn.Module, heads: dict[int, Iterable[int]]) -> None:
    """Physically remove attention heads: Q/K/V output rows and output-projection columns.

    ``heads`` maps layer index to *current* head ids. The toolkit's own surgery (no
    ``prune_heads`` of transformers, which 5.x removed). The *original* ids removed per
    layer are recorded in the config under the family's key: ``config.pruned_heads``,
    which transformers 4.x reads to rebuild the narrower heads, so the folder also reloads
    with stock ``from_pretrained`` there (ModernBERT, which 4.x cannot prune, uses
    ``compress_pruned_heads``).
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
    setattr(model.config, family_of(model).pruned_heads_key, removed)


def removed_heads(model: nn.Module) -> dict[int, list[int]]:
    """Original head ids removed so far, per layer (from the config's record; {} when none)."""
    # getattr: transformers 5.x configs have no pruned_heads unless the toolkit set one.
    recorded = getattr(model.config, family_of(model).pruned_heads_key, None) or {}
    return {int(k): sorted(int(h) for h in v) for k, v in recorded.items() if v}


def _remove_heads(layer: nn.Module, ids: list[int]) -> None:
    """Slice heads ``ids`` (current ids) out of one layer's Q/K/V rows and output columns."""
    att = layer_family(layer).attention
    module = self_attention(layer)
    d, n = head_size(layer), num_heads(layer)
    keep = [h for h in range(n) if h not in set(ids)]
    index = torch.tensor([h * d + i for h in keep for i in range(d)], dtype=torch.long)  # (kept heads * d,)
    if att.fused:
        # Rows (3 * heads * d,): Q of every head, then K, then V; the same heads from each block.
        rows = torch.cat([index + block * n * d for block in range(3)])
        _replace(module, att.projections[0], _slice_linear(qkv_projections(layer)[0], rows, 0))
    else:
        for path, linear in zip(att.projections, qkv_projections(layer)):
            _replace(module, path, _slice_linear(linear, index, 0))
    _replace(layer, att.output, _slice_linear(attention_output(layer), index, 1))
    # What the forward passes reshape with (see each family's Attention entry).
    for name in att.count:
        setattr(module, name, len(keep))
    for name in att.width:
        setattr(module, name, len(keep) * d)


def set_heads(model: nn.Module, heads: list[int]) -> None:
    """Reshape (not choose) each layer's attention to ``heads`` heads: used before loading pruned weights."""
    for i, (now, want) in enumerate(zip(heads_per_layer(model), heads)):
        if now != want:
            _remove_heads(encoder_layers(model)[i], list(range(want, now)))


def drop_layers(model: nn.Module, keep: Iterable[int]) -> None:
    """Keep only the encoder layers ``keep`` (current indices, any order kept sorted)."""
    fam = family_of(model)
    layers = encoder_layers(model)
    keep = sorted(set(int(i) for i in keep))
    if not keep:
        raise CompressError("cannot drop every layer; keep at least one")
    if keep[-1] >= len(layers) or keep[0] < 0:
        raise CompressError(f"layer {keep[-1]} does not exist; the model has {len(layers)} layers")
    previous = layer_origins(model)
    pruned = removed_heads(model)
    per_layer = fam.layer_config(model) if fam.layer_config else {}  # read before the cut
    _replace(base_model(model), fam.layers, nn.ModuleList([layers[i] for i in keep]))
    for new_index, layer in enumerate(encoder_layers(model)):
        # Newer transformers use layer_idx for caches; keep it consistent after the cut.
        for module in layer.modules():
            if hasattr(module, "layer_idx"):
                module.layer_idx = new_index
    set_config_size(model.config, "layers", len(keep))
    setattr(model.config, fam.pruned_heads_key, {new: pruned[old] for new, old in enumerate(keep) if pruned.get(old)})
    for key, values in per_layer.items():  # per-layer config lists follow their layers (ModernBERT's layer_types)
        setattr(model.config, key, [values[i] for i in keep])
    model.config.compress_kept_layers = [previous[i] for i in keep]


def set_config_shape(config, *, layers: int, hidden: int, heads: int, ffn: int) -> None:
    """Give a (copied) config a fresh shape: sizes, no pruned heads, the family's own per-layer settings."""
    fam = family_of(config)
    for name, value in (("layers", layers), ("hidden", hidden), ("heads", heads), ("ffn", ffn)):
        set_config_size(config, name, value)
    setattr(config, fam.pruned_heads_key, {})  # a fresh model has every head (read by transformers 4.x)
    if fam.default_layer_config is not None:
        for key, values in fam.default_layer_config(config, layers).items():
            if hasattr(config, key):
                setattr(config, key, values)


def inherit_layer_layout(config, teacher: nn.Module, layers: list[int]) -> None:
    """Give a student config the position-dependent settings of teacher layers ``layers`` (0-based).

    ModernBERT: their attention kinds and original positions (``compress_kept_layers``,
    which the loader reads back); nothing for families whose layers do not depend on
    their position.
    """
    fam = family_of(teacher)
    if not fam.positional:
        return
    for key, values in fam.layer_config(teacher).items():
        setattr(config, key, [values[i] for i in layers])
    origins = layer_origins(teacher)
    config.compress_kept_layers = [origins[i] for i in layers]


def place_layers(model: nn.Module, origins: list[int] | None = None) -> None:
    """Give each layer the layout of the original layer it was (ModernBERT's norm and attention kind)."""
    fam = family_of(model)
    if fam.place_layers is not None:
        fam.place_layers(model, list(origins) if origins is not None else layer_origins(model))


def apply_structure(model: nn.Module, structure: dict[str, Any]) -> None:
    """Give a freshly built model (from its config.json) the stored per-layer shapes.

    Layers come from the config's layer count, placed as the original layers they were;
    heads from ``config.pruned_heads`` at construction time on transformers 4.x (the
    families it can prune), and from here otherwise; a per-layer FFN width is what no
    config can express.
    """
    if structure.get("num_layers", len(encoder_layers(model))) != len(encoder_layers(model)):
        raise CompressError(
            f"compression.json says {structure['num_layers']} layers but config.json builds "
            f"{len(encoder_layers(model))}; the directory is inconsistent"
        )
    if "kept_layers" in structure:
        place_layers(model, structure["kept_layers"])
    if "ffn" in structure:
        set_ffn_widths(model, list(structure["ffn"]))
    built_by_constructor = STOCK_PRUNED_HEADS and family_of(model).stock_pruned_heads
    if "heads" in structure and not built_by_constructor:
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
