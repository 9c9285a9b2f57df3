"""The shapes of encoders and thin wrappers over their :class:`~compress.core.model.encoder.Encoder`.

Finding a layer, an attention block or an FFN, reading its sizes and changing them is the
job of :mod:`compress.core.model.encoder`, where a model's family is decided once
(``Encoder.of(model)``; its ``layers`` are :class:`~compress.core.model.encoder.Layer` views).
The model-level functions here call it and add nothing of their own, for the many
callers that need one answer (``heads_per_layer(model)``, ``describe(model)``). This
module keeps what needs no family: :class:`Shape` and its parsing, a BERT config for a
shape, FLOP and parameter counts, forward hooks that record outputs, and the
pretraining forward. Shapes use PyTorch's Linear convention ``(out, in)``.

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


from typing import Any, Callable, Iterable, Iterator

from torch import nn
from transformers import BertConfig

from compress.core.model.encoder import (  # noqa: F401  (set_config_shape, set_config_sizes re-exported)
    FIRST_TOKEN,
    TARGETS,
    Encoder,
    Layer,
    Sizes,
    set_config_shape,
    set_config_sizes,
)
from compress.core.errors import CompressError
from compress.core.model.families import Family, family_of
from compress.core.model.shapes import Shape

# ---------------------------------------------------------------------------- the encoder's parts
# Thin wrappers over :class:`compress.core.model.encoder.Encoder`, which decides the family once.


def family(model: nn.Module) -> Family:
    """The model's encoder family (from ``config.model_type``); unknown ones fail naming the known families."""
    return Encoder.of(model).family


def base_model(model: nn.Module) -> nn.Module:
    """The base encoder (``BertModel``, ``RobertaModel``, ``ModernBertModel``, ...) inside any task model, or the model itself."""
    return Encoder.of(model).base


def encoder_layers(model: nn.Module) -> nn.ModuleList:
    """The transformer blocks, in order (``BertLayer``, ``TransformerBlock``, ``ModernBertEncoderLayer`` ...)."""
    return Encoder.of(model).layer_list


def layers(model: nn.Module) -> list[Layer]:
    """The layers as :class:`Layer` views: projections, FFN, heads and their surgery."""
    return Encoder.of(model).layers


def layers_path(model: nn.Module) -> str:
    """The qualified name of the encoder's layer list in ``model`` (``bert.encoder.layer``, ``model.layers``)."""
    return Encoder.of(model).layers_path


def embeddings(model: nn.Module) -> nn.Module:
    return Encoder.of(model).embeddings


def input_names(model) -> tuple[str, ...]:
    """The inputs the model's forward takes, in exported-graph order (DistilBERT, ModernBERT: no token_type_ids).

    Read from the config alone, so a runner (an ONNX or OpenVINO model, no modules) answers too.
    """
    return family_of(model).inputs


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
    return Encoder.of(model).mlm_head()


def value_projection(model: nn.Module, layer_index: int) -> nn.Module | tuple[nn.Module, Callable]:
    """What :func:`capture` records as one layer's values (batch, seq, heads*d) (MiniLM's value relations)."""
    return Encoder.of(model).layer(layer_index).value()


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
    return Encoder.of(model).pooler


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
    return Encoder.of(model).outside_layers()


# ---------------------------------------------------------------------------- reading shapes


def config_sizes(config) -> Sizes:
    """A config's sizes (layers, hidden, heads, FFN, positions, vocabulary) under its family's names."""
    return Sizes.of(config)


def rotary_heads(config) -> bool:
    """Whether the family's heads carry rotary positions in fused projections (ModernBERT): they keep their width."""
    return family_of(config).attention.fused


def heads_per_layer(model: nn.Module) -> list[int]:
    return Encoder.of(model).heads()


def ffn_widths(model: nn.Module) -> list[int]:
    return Encoder.of(model).ffn_widths()


def layer_origins(model: nn.Module) -> list[int]:
    """Original layer ids of the current layers (after dropped layers, or a student's teacher layers)."""
    return Encoder.of(model).origins()


def describe(model: nn.Module) -> dict[str, Any]:
    """The structure dict of a model (see the module docstring)."""
    return Encoder.of(model).describe()


def first_token_only(model: nn.Module) -> bool:
    """Make the last encoder layer compute the first token's output only; False if the family cannot
    (see :meth:`compress.core.model.encoder.Encoder.first_token_only`)."""
    return Encoder.of(model).first_token_only()


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


def resize_ffn(model: nn.Module, layer_index: int, keep: Iterable[int]) -> None:
    """Keep only the FFN neurons ``keep`` in one layer (rows of W1, columns of W2)."""
    Encoder.of(model).keep_ffn(layer_index, keep)


def set_ffn_widths(model: nn.Module, widths: list[int]) -> None:
    """Reshape (not slice) each layer's FFN to ``widths``: used before loading pruned weights."""
    Encoder.of(model).set_ffn_widths(widths)


def prune_heads(model: nn.Module, heads: dict[int, Iterable[int]]) -> None:
    """Physically remove attention heads (``heads``: layer index -> current head ids); see
    :meth:`compress.core.model.encoder.Encoder.prune_heads` for how the removed ids are recorded."""
    Encoder.of(model).prune_heads(heads)


def removed_heads(model: nn.Module) -> dict[int, list[int]]:
    """Original head ids removed so far, per layer (from the config's record; {} when none)."""
    return Encoder.of(model).removed_heads()


def set_heads(model: nn.Module, heads: list[int]) -> None:
    """Reshape (not choose) each layer's attention to ``heads`` heads: used before loading pruned weights."""
    Encoder.of(model).set_heads(heads)


def drop_layers(model: nn.Module, keep: Iterable[int]) -> None:
    """Keep only the encoder layers ``keep`` (current indices, any order kept sorted)."""
    Encoder.of(model).drop_layers(keep)


def inherit_layer_layout(config, teacher: nn.Module, layers: list[int]) -> None:
    """Give a student config the position-dependent settings of teacher layers ``layers`` (0-based)."""
    Encoder.of(teacher).inherit_layer_layout(config, layers)


def place_layers(model: nn.Module, origins: list[int] | None = None) -> None:
    """Give each layer the layout of the original layer it was (ModernBERT's norm and attention kind)."""
    Encoder.of(model).place_layers(origins)


def apply_structure(model: nn.Module, structure: dict[str, Any]) -> None:
    """Give a freshly built model (from its config.json) the stored per-layer shapes."""
    Encoder.of(model).apply_structure(structure)


# ---------------------------------------------------------------------------- shapes


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
