"""One adapter per model: the encoder family decided once, its layers seen through it, and the surgery.

``Encoder.of(model)`` looks the family up from ``config.model_type`` once and keeps it:
the base model, the layer list, the sizes, the embeddings, the inputs the forward takes,
and the model-level surgery (remove heads, drop layers, reshape to a stored structure).
``encoder.layers`` are :class:`Layer` views that know their family too: the Q/K/V
projections, the attention output, the FFN input and output, the heads and their width,
and the surgery on one layer (remove heads, keep FFN neurons). Nothing else asks "which
family?" again; :mod:`compress.core.model.families` is the data (paths and names per family)
and :mod:`compress.core.model.structure` keeps the shape bookkeeping that needs no family.

Config sizes (layers, hidden, heads, FFN, positions, vocabulary) are read and written
here too (:class:`Sizes`), under each family's attribute names: DistilBERT calls the
hidden width ``dim``. Shapes use PyTorch's Linear convention ``(out, in)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import torch
from torch import nn

from compress.core.compat import STOCK_PRUNED_HEADS, TRANSFORMERS_MAJOR
from compress.core.errors import CompressError
from compress.core.model.families import Family, family_of

FIRST_TOKEN = "first_token_last_layer"  # structure key, and the marker on a layer made to compute its first token only
TARGETS = ("labels", "start_positions", "end_positions")  # what a head's loss reads from a batch


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


def slice_linear(linear: nn.Linear, index: torch.Tensor, dim: int) -> nn.Linear:
    """A new Linear keeping ``index`` along ``dim`` (0: output rows, 1: input columns)."""
    index = index.to(linear.weight.device)
    weight = linear.weight.detach().index_select(dim, index).clone()
    has_bias = linear.bias is not None
    out_f, in_f = weight.shape
    new = nn.Linear(in_f, out_f, bias=has_bias, device=weight.device, dtype=weight.dtype)
    new.weight.data.copy_(weight)
    if has_bias:
        new.bias.data.copy_(linear.bias.detach().clone() if dim == 1 else linear.bias.detach()[index].clone())
    new.weight.requires_grad_(linear.weight.requires_grad)
    return new


# ---------------------------------------------------------------------------- sizes of a config


@dataclass(frozen=True)
class Sizes:
    """A config's sizes read once under its family's names: layers, hidden, heads, FFN, positions, vocabulary."""

    layers: int
    hidden: int
    heads: int
    ffn: int
    max_positions: int  # the longest sequence the model takes (RoBERTa, MPNet: 2 fewer than their position embeddings)
    vocab: int

    @classmethod
    def of(cls, config) -> "Sizes":
        family = family_of(config)
        names = family.sizes
        return cls(*(int(getattr(config, getattr(names, n))) for n in ("layers", "hidden", "heads", "ffn")),
                   family.max_tokens(config), int(getattr(config, "vocab_size", 0)))

    @property
    def head_size(self) -> int:
        return self.hidden // self.heads


def set_config_sizes(config, **sizes: int) -> None:
    """Write ``layers``, ``hidden``, ``heads`` or ``ffn`` into a config under its family's attribute names."""
    names = family_of(config).sizes
    for name, value in sizes.items():
        setattr(config, getattr(names, name), value)


def set_config_shape(config, *, layers: int, hidden: int, heads: int, ffn: int) -> None:
    """Give a (copied) config a fresh shape: sizes, no pruned heads, the family's own per-layer settings."""
    fam = family_of(config)
    set_config_sizes(config, layers=layers, hidden=hidden, heads=heads, ffn=ffn)
    setattr(config, fam.pruned_heads_key, {})  # a fresh model has every head (read by transformers 4.x)
    if fam.default_layer_config is not None:
        for key, values in fam.default_layer_config(config, layers).items():
            if hasattr(config, key):
                setattr(config, key, values)


# ---------------------------------------------------------------------------- one layer


class Layer:
    """One encoder layer through its family: projections, FFN, heads, and the surgery on them."""

    def __init__(self, module: nn.Module, family: Family):
        self.module = module
        self.family = family

    @property
    def attention(self) -> nn.Module:
        """The module holding the Q/K/V projections and the head-count attributes."""
        return self.module.get_submodule(self.family.attention.module)

    @property
    def projections(self) -> list[nn.Linear]:
        """Q, K, V Linear(hidden, heads*d), or one fused Linear(hidden, 3*heads*d)."""
        return [self.attention.get_submodule(p) for p in self.family.attention.projections]

    @property
    def fused(self) -> bool:
        return self.family.attention.fused

    @property
    def glu(self) -> bool:
        """A gated FFN: ``ffn_in`` has an input row and a gate row per neuron."""
        return self.family.glu

    @property
    def qkv_weights(self) -> list[torch.Tensor]:
        """[W_q, W_k, W_v], each (heads*d, hidden) with head h in rows h*d..(h+1)*d."""
        weights = [p.weight for p in self.projections]
        return list(weights[0].chunk(3, dim=0)) if self.fused else weights  # fused rows: Q, then K, then V

    @property
    def output(self) -> nn.Linear:
        """The attention output projection Linear(heads*d, hidden); its input is every head's output."""
        return self.module.get_submodule(self.family.attention.output)

    @property
    def ffn_in(self) -> nn.Linear:
        """First FFN Linear(hidden, ffn) (gated: (2*ffn, hidden), input rows then gate rows)."""
        return self.module.get_submodule(self.family.ffn_in)

    @property
    def ffn_out(self) -> nn.Linear:
        """Second FFN Linear(ffn, hidden); its input is the FFN activations (batch, seq, ffn)."""
        return self.module.get_submodule(self.family.ffn_out)

    @property
    def ffn_width(self) -> int:
        return self.ffn_out.in_features

    @property
    def head_size(self) -> int:
        """d, the width of one attention head."""
        return int(getattr(self.attention, self.family.attention.head_size))

    @property
    def heads(self) -> int:
        """Attention heads, read from the projection's width (every transformers version keeps that right)."""
        return self.projections[0].out_features // (3 if self.fused else 1) // self.head_size

    def value(self) -> nn.Module | tuple[nn.Module, Callable]:
        """What a capture records as the layer's values (batch, seq, heads*d): the value Linear, or the fused
        Linear and the function taking its value rows out of the output."""
        if not self.fused:
            return self.projections[2]
        return self.projections[0], lambda out: out.chunk(3, dim=-1)[2]  # (batch, seq, 3*heads*d): Q, K, V

    def ffn_rows(self, keep: Iterable[int]) -> list[int]:
        """Rows of ``ffn_in`` that belong to FFN neurons ``keep`` (gated: each neuron's input and gate row)."""
        keep = list(keep)
        return keep + [self.ffn_width + i for i in keep] if self.glu else keep

    def keep_ffn(self, keep: Iterable[int], where: str = "the layer") -> None:
        """Keep only the FFN neurons ``keep`` (rows of W1, columns of W2)."""
        keep = sorted(set(int(i) for i in keep))
        if not keep:
            raise CompressError(f"{where}: cannot remove every FFN neuron; keep at least one")
        if keep[-1] >= self.ffn_width:
            raise CompressError(f"{where}: FFN neuron {keep[-1]} does not exist (width {self.ffn_width})")
        rows = torch.tensor(self.ffn_rows(keep), dtype=torch.long)
        _replace(self.module, self.family.ffn_in, slice_linear(self.ffn_in, rows, 0))  # (ffn' (x2 gated), hidden)
        _replace(self.module, self.family.ffn_out, slice_linear(self.ffn_out, torch.tensor(keep, dtype=torch.long), 1))

    def remove_heads(self, ids: list[int]) -> None:
        """Slice heads ``ids`` (current ids) out of the Q/K/V rows and the output columns."""
        att = self.family.attention
        d, n = self.head_size, self.heads
        keep = [h for h in range(n) if h not in set(ids)]
        index = torch.tensor([h * d + i for h in keep for i in range(d)], dtype=torch.long)  # (kept heads * d,)
        module = self.attention
        if att.fused:
            # Rows (3 * heads * d,): Q of every head, then K, then V; the same heads from each block.
            rows = torch.cat([index + block * n * d for block in range(3)])
            _replace(module, att.projections[0], slice_linear(self.projections[0], rows, 0))
        else:
            for path, linear in zip(att.projections, self.projections):
                _replace(module, path, slice_linear(linear, index, 0))
        _replace(self.module, att.output, slice_linear(self.output, index, 1))
        # What the forward passes reshape with (see each family's Attention entry).
        for name in att.count:
            setattr(module, name, len(keep))
        for name in att.width:
            setattr(module, name, len(keep) * d)


# ---------------------------------------------------------------------------- a model's encoder


class Encoder:
    """A model's encoder with its family decided once: base model, layers, sizes and the model-level surgery."""

    def __init__(self, model: nn.Module, family: Family):
        self.model = model
        self.family = family
        inner = getattr(model, family.base, None)
        if isinstance(inner, nn.Module) and _has(inner, family.layers):
            self.base = inner
        elif _has(model, family.layers):
            self.base = model
        else:
            raise CompressError(f"{type(model).__name__} is not a {family.model_type} encoder model")

    @classmethod
    def of(cls, model: nn.Module) -> "Encoder":
        """The encoder of ``model`` (a training wrapper's inner model); its family from ``config.model_type``."""
        if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            model = model.module
        return cls(model, family_of(model))

    # -- parts

    @property
    def layer_list(self) -> nn.ModuleList:
        """The transformer blocks, in order (``BertLayer``, ``TransformerBlock``, ``ModernBertEncoderLayer``, ...)."""
        return self.base.get_submodule(self.family.layers)

    @property
    def layers(self) -> list[Layer]:
        return [Layer(module, self.family) for module in self.layer_list]

    def layer(self, index: int) -> Layer:
        return Layer(self.layer_list[index], self.family)

    @property
    def layers_path(self) -> str:
        """The qualified name of the layer list in the model (``bert.encoder.layer``, ``model.layers``)."""
        layers = self.layer_list
        return next(name for name, module in self.model.named_modules() if module is layers)

    @property
    def embeddings(self) -> nn.Module:
        return self.base.get_submodule(self.family.embeddings)

    @property
    def head_table(self) -> nn.Embedding | None:
        """The table (buckets, heads) whose head columns every layer reads (MPNet's position bias); None elsewhere."""
        path = self.family.head_table
        return self.base.get_submodule(path) if path else None

    @property
    def inputs(self) -> tuple[str, ...]:
        """The inputs the forward takes, in exported-graph order (DistilBERT, ModernBERT: no token_type_ids)."""
        return self.family.inputs

    @property
    def pooler(self) -> nn.Module | None:
        """The pooler (dense + tanh over [CLS]), or None when the model was built without one."""
        return getattr(self.base, "pooler", None)

    def mlm_head(self) -> nn.Module:
        """The MLM head (hidden states -> vocabulary logits, decoder tied to the word embeddings)."""
        try:
            head = self.family.mlm_head(self.model) if self.family.mlm_head is not None else None
        except AttributeError:
            head = None
        if head is None:
            raise CompressError(f"{type(self.model).__name__} has no masked-LM head")
        return head

    def outside_layers(self) -> dict[str, nn.Module]:
        """Every part of the model outside its layers, by name: embeddings, pooler, final norm, head parts."""
        layers = self.layer_list

        def walk(module: nn.Module, prefix: str) -> Iterator[tuple[str, nn.Module]]:
            for name, child in module.named_children():
                if child is layers:
                    continue
                if any(m is layers for m in child.modules()):
                    yield from walk(child, f"{prefix}{name}.")
                else:
                    yield f"{prefix}{name}", child

        return dict(walk(self.model, ""))

    # -- sizes

    @property
    def sizes(self) -> Sizes:
        """The config's sizes (the shape it was built with; per-layer widths are :meth:`heads` / :meth:`ffn_widths`)."""
        return Sizes.of(self.model.config)

    def heads(self) -> list[int]:
        """Attention heads kept per layer."""
        return [layer.heads for layer in self.layers]

    def ffn_widths(self) -> list[int]:
        return [layer.ffn_width for layer in self.layers]

    def origins(self) -> list[int]:
        """Original layer ids of the current layers (after dropped layers, or a student's teacher layers)."""
        kept = getattr(self.model.config, "compress_kept_layers", None)
        return list(kept) if kept else list(range(len(self.layer_list)))

    def removed_heads(self) -> dict[int, list[int]]:
        """Original head ids removed so far, per layer (from the config's record; {} when none)."""
        # getattr: transformers 5.x configs have no pruned_heads unless the toolkit set one.
        recorded = getattr(self.model.config, self.family.pruned_heads_key, None) or {}
        return {int(k): sorted(int(h) for h in v) for k, v in recorded.items() if v}

    def describe(self) -> dict[str, Any]:
        """The structure dict of the model (see :mod:`compress.core.model.structure`)."""
        sizes = self.sizes
        structure = {
            "num_layers": len(self.layer_list),
            "hidden_size": sizes.hidden,
            "head_size": sizes.head_size,
            "heads": self.heads(),
            "pruned_heads": {str(k): v for k, v in self.removed_heads().items()},
            "ffn": self.ffn_widths(),
            "kept_layers": self.origins(),
        }
        if self.family.glu:
            structure["glu"] = True
        if getattr(self.layer_list[-1], FIRST_TOKEN, False):
            structure[FIRST_TOKEN] = True
        return structure

    # -- surgery

    def prune_heads(self, heads: dict[int, Iterable[int]]) -> None:
        """Physically remove attention heads: Q/K/V output rows and output-projection columns.

        ``heads`` maps layer index to *current* head ids. The toolkit's own surgery (no
        ``prune_heads`` of transformers, which 5.x removed). The *original* ids removed per
        layer are recorded in the config under the family's key: ``config.pruned_heads``,
        which transformers 4.x reads to rebuild the narrower heads, so the folder also reloads
        with stock ``from_pretrained`` there (ModernBERT, which 4.x cannot prune, uses
        ``compress_pruned_heads``).
        """
        current = self.heads()
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
        removed = self.removed_heads()
        for layer, ids in plan.items():
            # Current id c is the c-th original head still present in this layer.
            present = [h for h in range(current[layer] + len(removed.get(layer, []))) if h not in removed.get(layer, [])]
            removed[layer] = sorted({*removed.get(layer, []), *(present[c] for c in ids)})
            self.layer(layer).remove_heads(ids)
        setattr(self.model.config, self.family.pruned_heads_key, removed)
        if self.family.heads_changed is not None:
            self.family.heads_changed(self.model, removed)

    def keep_ffn(self, layer_index: int, keep: Iterable[int]) -> None:
        """Keep only the FFN neurons ``keep`` in one layer."""
        self.layer(layer_index).keep_ffn(keep, where=f"layer {layer_index}")

    def drop_layers(self, keep: Iterable[int]) -> None:
        """Keep only the encoder layers ``keep`` (current indices, any order kept sorted)."""
        fam, layers = self.family, self.layer_list
        keep = sorted(set(int(i) for i in keep))
        if not keep:
            raise CompressError("cannot drop every layer; keep at least one")
        if keep[-1] >= len(layers) or keep[0] < 0:
            raise CompressError(f"layer {keep[-1]} does not exist; the model has {len(layers)} layers")
        previous, pruned = self.origins(), self.removed_heads()
        per_layer = fam.layer_config(self.model) if fam.layer_config else {}  # read before the cut
        _replace(self.base, fam.layers, nn.ModuleList([layers[i] for i in keep]))
        for new_index, layer in enumerate(self.layer_list):
            # Newer transformers use layer_idx for caches; keep it consistent after the cut.
            for module in layer.modules():
                if hasattr(module, "layer_idx"):
                    module.layer_idx = new_index
        config = self.model.config
        set_config_sizes(config, layers=len(keep))
        setattr(config, fam.pruned_heads_key, {new: pruned[old] for new, old in enumerate(keep) if pruned.get(old)})
        for key, values in per_layer.items():  # per-layer config lists follow their layers (ModernBERT's layer_types)
            setattr(config, key, [values[i] for i in keep])
        config.compress_kept_layers = [previous[i] for i in keep]

    def set_ffn_widths(self, widths: list[int]) -> None:
        """Reshape (not slice) each layer's FFN to ``widths``: used before loading pruned weights."""
        layers = self.layers
        if len(widths) != len(layers):
            raise CompressError(f"structure lists {len(widths)} FFN widths for {len(layers)} layers")
        for i, (layer, width) in enumerate(zip(layers, widths)):
            if layer.ffn_width != width:
                layer.keep_ffn(range(width), where=f"layer {i}")

    def set_heads(self, heads: list[int]) -> None:
        """Reshape (not choose) each layer's attention to ``heads`` heads: used before loading pruned weights."""
        for layer, want in zip(self.layers, heads):
            if layer.heads != want:
                layer.remove_heads(list(range(want, layer.heads)))

    def place_layers(self, origins: list[int] | None = None) -> None:
        """Give each layer the layout of the original layer it was (ModernBERT's norm and attention kind)."""
        if self.family.place_layers is not None:
            self.family.place_layers(self.model, list(origins) if origins is not None else self.origins())

    def apply_structure(self, structure: dict[str, Any]) -> None:
        """Give a freshly built model (from its config.json) the stored per-layer shapes.

        Layers come from the config's layer count, placed as the original layers they were;
        heads from ``config.pruned_heads`` at construction time on transformers 4.x (the
        families it can prune), and from here otherwise; a per-layer FFN width is what no
        config can express.
        """
        n = len(self.layer_list)
        if structure.get("num_layers", n) != n:
            raise CompressError(f"compression.json says {structure['num_layers']} layers but config.json builds {n}; "
                                "the directory is inconsistent")
        if "kept_layers" in structure:
            self.place_layers(structure["kept_layers"])
        if "ffn" in structure:
            self.set_ffn_widths(list(structure["ffn"]))
        built_by_constructor = STOCK_PRUNED_HEADS and self.family.stock_pruned_heads
        if "heads" in structure and not built_by_constructor:
            self.set_heads(list(structure["heads"]))
        if "heads" in structure and self.heads() != list(structure["heads"]):
            raise CompressError(
                f"compression.json lists heads {structure['heads']} but config.json's pruned_heads "
                f"builds {self.heads()}; the directory is inconsistent"
            )
        if self.family.heads_changed is not None:
            self.family.heads_changed(self.model, self.removed_heads())

    def inherit_layer_layout(self, config, layers: list[int]) -> None:
        """Give a student ``config`` the position-dependent settings of this model's layers ``layers`` (0-based).

        ModernBERT: their attention kinds and original positions (``compress_kept_layers``, which
        the loader reads back); nothing for families whose layers do not depend on their position.
        """
        if not self.family.positional:
            return
        for key, values in self.family.layer_config(self.model).items():
            setattr(config, key, [values[i] for i in layers])
        origins = self.origins()
        config.compress_kept_layers = [origins[i] for i in layers]

    def first_token_only(self) -> bool:
        """Make the last layer compute the first token's output only; False if the family cannot.

        For a head that reads nothing but the first token (sequence classification: BERT's
        pooler, RoBERTa's and ELECTRA's classifier, DistilBERT's pre-classifier): its keys and
        values still come from every token, but its query, output projection and FFN run on one
        token instead of s, and the encoder's output becomes (batch, 1, hidden). The logits are
        the full model's (to float rounding). Changes the model in place: for exports, whose
        graphs are traced from this forward; training and hidden-state distillation keep every token.
        """
        fam = self.family
        if fam.finish_layer is None or fam.attention.fused:
            return False
        view = self.layer(-1)
        if view.heads == 0:
            return False  # every head pruned: no attention to split
        layer, (query, key, value), d = view.module, view.projections, view.head_size

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

    def model_inputs(self, batch: dict, *, targets: bool = False) -> dict:
        """The entries of ``batch`` the forward takes (a BERT tokenizer's token_type_ids go to BERT only);
        with ``targets``, also the labels or answer positions its head computes the loss from."""
        names = (*self.inputs, *TARGETS) if targets else self.inputs
        return {k: batch[k] for k in names if k in batch}


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
