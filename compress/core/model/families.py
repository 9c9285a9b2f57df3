"""Encoder families: what differs between BERT, RoBERTa, XLM-R, DistilBERT, ELECTRA, MPNet and ModernBERT.

Everything the toolkit knows about one family sits in its :class:`Family` entry, looked up
from ``config.model_type``: where the base model, the layer list, the attention
projections, the FFN and the embeddings are; which transformers class builds each head;
which config attributes hold the sizes; which inputs the forward takes; how heads are
recorded for the stock loader; and the few layer details that depend on a layer's
position (ModernBERT) or on which heads it kept (MPNet). ``compress.core.model.structure`` does all the surgery and measuring
through these entries, so adding a family is one ``register`` call here.

Paths are dotted attribute paths: the layer list from the base model, everything else
from one layer. Shapes use PyTorch's Linear convention ``(out, in)``.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import Tensor, nn

from compress.core.compat import MODERNBERT_TYPES_FROM_CONFIG, no_init_weights
from compress.core.errors import CompressError
from compress.core.model.heads import HEADS
from compress.core.registry import Registry

WITH_SEGMENTS = ("input_ids", "attention_mask", "token_type_ids")
WITHOUT_SEGMENTS = ("input_ids", "attention_mask")


@dataclass(frozen=True)
class Sizes:
    """The config attributes holding each size (DistilBERT names them differently)."""

    layers: str = "num_hidden_layers"
    hidden: str = "hidden_size"
    heads: str = "num_attention_heads"
    ffn: str = "intermediate_size"


@dataclass(frozen=True)
class Attention:
    """Where one layer's self-attention keeps its projections, and what its forward reshapes with."""

    module: str  # the attention module, from the layer: it holds the projections and the attributes below
    projections: tuple[str, ...]  # Q, K, V Linear(hidden, heads*d) in `module`; or one fused Linear (rows: Q of every head, then K, then V)
    output: str  # output projection Linear(heads*d, hidden), from the layer
    head_size: str  # attribute of `module` holding d
    count: tuple[str, ...]  # attributes of `module` holding the head count (set after surgery)
    width: tuple[str, ...]  # attributes of `module` holding heads*d (set after surgery)

    @property
    def fused(self) -> bool:
        return len(self.projections) == 1


@dataclass(frozen=True)
class HeadLayers:
    """A task head as plain layers on the base model's outputs, as its transformers forward runs them in eval mode
    (dropout off): for runtimes that run the encoder alone (CTranslate2's Encoder) and the head beside it."""

    reads: str  # "pooler_output" (batch, hidden), "first_token" (last_hidden_state[:, 0]) or "tokens" (every position)
    linears: tuple[tuple[str, str | None], ...]  # (a Linear's path in the task model, the activation after it or None)


def _linear_heads(classifier: HeadLayers) -> dict[str, HeadLayers]:
    """The task heads of a BERT-like family given its sequence classifier: a token classifier and a span head are one
    Linear on every position (``classifier``; ``qa_outputs`` with its two columns, start then end)."""
    return {"sequence-classification": classifier,
            "token-classification": HeadLayers("tokens", (("classifier", None),)),
            "question-answering": HeadLayers("tokens", (("qa_outputs", None),))}


@dataclass(frozen=True)
class Family:
    """One encoder family: module paths, head classes, config names, inputs and layer details."""

    model_type: str  # config.model_type
    config_class: str  # transformers class reading its config.json
    base: str  # attribute of the base model inside a task model (its base_model_prefix)
    layers: str  # the layer ModuleList, from the base model
    attention: Attention
    ffn_in: str  # first FFN Linear(hidden, ffn) (GLU: (2*ffn, hidden), input half then gate half), from the layer
    ffn_out: str  # second FFN Linear(ffn, hidden), from the layer
    classes: dict[str, str]  # head name -> transformers class
    sizes: Sizes = Sizes()
    inputs: tuple[str, ...] = WITH_SEGMENTS  # what the forward takes, in the order exported graphs take them
    glu: bool = False  # gated FFN: ffn_in has an input and a gate row per neuron
    embeddings: str = "embeddings"  # from the base model
    # Config attribute recording the removed heads. transformers 4.x rebuilds narrower heads
    # from "pruned_heads" at construction; a family without that support must not see it there.
    pruned_heads_key: str = "pruned_heads"
    mlm_head: Callable[[nn.Module], nn.Module] | None = None  # hidden states -> vocabulary logits
    # Position-dependent layers: (model) -> per-layer config lists read from the modules, and
    # (model, original layer ids) -> give each layer the layout of the original layer it was.
    layer_config: Callable[[nn.Module], dict[str, list]] | None = None
    default_layer_config: Callable[[Any, int], dict[str, list]] | None = None
    place_layers: Callable[[nn.Module, list[int]], None] | None = None
    # One layer after its attention: (layer, context (batch, t, heads*d) before the output projection, the layer's
    # input at those t tokens) -> the layer's output there. Lets a last layer compute its first token only; None:
    # the family's layer does not split there (ModernBERT: rotary attention on fused projections).
    finish_layer: Callable[[nn.Module, Tensor, Tensor], Tensor] | None = None
    # After heads were removed or a pruned folder was rebuilt: (model, original head ids removed per layer) -> give
    # each layer what its kept heads need from outside the layer (MPNet: their columns of the shared position table).
    heads_changed: Callable[[nn.Module, dict[int, list[int]]], None] | None = None
    # (config) -> position embeddings no token uses: families that count positions from the padding id (RoBERTa,
    # XLM-R, MPNet) give the first token padding id + 1, so P position embeddings take P - (padding id + 1) tokens.
    unused_positions: Callable[[Any], int] = lambda config: 0
    # From the base model: an Embedding (buckets, heads), one column per head, that every layer reads (MPNet's relative
    # position bias). A student cut from the teacher then keeps the same teacher heads in every layer.
    head_table: str | None = None
    # Head name -> the head as plain layers on the base model's outputs (HeadLayers); a head missing here is not
    # stated, and a runtime that runs the encoder alone refuses it.
    head_layers: dict[str, HeadLayers] = field(default_factory=dict)

    def max_tokens(self, config) -> int:
        """The longest sequence a model of ``config`` takes: its position embeddings less those no token uses."""
        return int(getattr(config, "max_position_embeddings", 512)) - self.unused_positions(config)

    def head_class(self, head: str) -> str:
        """The transformers class of ``head``; a head this family has none of is refused by name."""
        if head not in self.classes:
            raise CompressError(
                f"{self.model_type} models have no {head} head in this toolkit; valid: {', '.join(self.classes)}"
            )
        return self.classes[head]

    @property
    def stock_pruned_heads(self) -> bool:
        """True when transformers 4.x's own loader rebuilds this family's pruned heads from the config."""
        return self.pruned_heads_key == "pruned_heads"

    @property
    def positional(self) -> bool:
        """True when a layer's layout depends on its position (so layer origins must be recorded)."""
        return self.place_layers is not None


FAMILIES: Registry[Family] = Registry("encoder family")


def get_family(model_type: str | None) -> Family:
    """The family of ``model_type``; an unknown one fails with one line naming the known families."""
    if model_type not in FAMILIES:
        raise CompressError(
            f"model_type {model_type!r} is not supported; known encoder families: {', '.join(FAMILIES.names())}"
        )
    return FAMILIES.get(model_type)


def family_of(obj) -> Family:
    """The family of a model, a runner or a config (anything with ``config.model_type`` or ``model_type``)."""
    config = getattr(obj, "config", obj)
    return get_family(getattr(config, "model_type", None))


def class_names() -> dict[str, str]:
    """Every registered transformers class name -> its head name (``BertForQuestionAnswering`` -> ``question-answering``)."""
    return {arch: head for _, family in FAMILIES.items() for head, arch in family.classes.items()}


def head_of_class(arch: str) -> str | None:
    """The head a registered transformers class builds (``RobertaForMaskedLM`` -> ``masked-lm``); None: no family's."""
    return class_names().get(arch)


# ---------------------------------------------------------------------------- BERT and its copies

BERT_ATTENTION = Attention(
    module="attention.self",
    projections=("query", "key", "value"),
    output="attention.output.dense",
    head_size="attention_head_size",
    # transformers 4.x reshapes with num_attention_heads and all_head_size; 5.x with the head size only.
    count=("num_attention_heads",),
    width=("all_head_size",),
)


def _classes(prefix: str, heads: tuple[str, ...]) -> dict[str, str]:
    """Head name -> the family's class for it: ``prefix`` + the head's class suffix (``Bert`` + ``ForMaskedLM``)."""
    return {head: prefix + HEADS[head].class_suffix for head in heads}


# The heads every family has a class for (a family's own entry adds masked-lm, pretraining where transformers has them).
ENCODER_HEADS = ("base", "sequence-classification", "token-classification", "question-answering")


def _bert_finish(layer: nn.Module, context: Tensor, hidden: Tensor) -> Tensor:
    # Output projection, residual and LayerNorm; then the FFN with its own residual and LayerNorm.
    attended = layer.attention.output(context, hidden)
    return layer.output(layer.intermediate(attended), attended)


FAMILIES.register("bert", Family(
    model_type="bert", config_class="BertConfig", base="bert", layers="encoder.layer", attention=BERT_ATTENTION,
    ffn_in="intermediate.dense", ffn_out="output.dense",
    classes=_classes("Bert", (*ENCODER_HEADS, "masked-lm", "pretraining")),
    mlm_head=lambda model: model.cls.predictions,  # transform + decoder tied to the word embeddings
    finish_layer=_bert_finish,
    head_layers=_linear_heads(HeadLayers("pooler_output", (("classifier", None),))),  # dense + tanh pooler, then Linear
))


def _after_padding_id(config) -> int:
    # RoBERTa's embeddings number real tokens from config.pad_token_id + 1 (create_position_ids_from_input_ids).
    pad = getattr(config, "pad_token_id", None)
    return (1 if pad is None else int(pad)) + 1  # RobertaConfig's default padding id is 1


for _type, _config, _prefix in (("roberta", "RobertaConfig", "Roberta"), ("xlm-roberta", "XLMRobertaConfig", "XLMRoberta")):
    FAMILIES.register(_type, Family(
        model_type=_type, config_class=_config, base="roberta", layers="encoder.layer", attention=BERT_ATTENTION,
        ffn_in="intermediate.dense", ffn_out="output.dense", classes=_classes(_prefix, (*ENCODER_HEADS, "masked-lm")),
        mlm_head=lambda model: model.lm_head, finish_layer=_bert_finish, unused_positions=_after_padding_id,
        # RobertaClassificationHead: dense + tanh on the first token (<s>), then out_proj; no pooler.
        head_layers=_linear_heads(HeadLayers("first_token", (("classifier.dense", "tanh"), ("classifier.out_proj", None)))),
    ))
# ELECTRA's discriminator (its MLM model is the small generator, not a compression target).
FAMILIES.register("electra", Family(
    model_type="electra", config_class="ElectraConfig", base="electra", layers="encoder.layer", attention=BERT_ATTENTION,
    ffn_in="intermediate.dense", ffn_out="output.dense", classes=_classes("Electra", ENCODER_HEADS),
    finish_layer=_bert_finish,
))


# ---------------------------------------------------------------------------- DistilBERT


def _distilbert_mlm(model: nn.Module) -> nn.Module:
    # The forward's own order: transform, activation, LayerNorm, projection tied to the word embeddings.
    return nn.Sequential(model.vocab_transform, model.activation, model.vocab_layer_norm, model.vocab_projector)


def _distilbert_finish(layer: nn.Module, context: Tensor, hidden: Tensor) -> Tensor:
    attended = layer.sa_layer_norm(layer.attention.out_lin(context) + hidden)
    return layer.output_layer_norm(layer.ffn(attended) + attended)


FAMILIES.register("distilbert", Family(
    model_type="distilbert", config_class="DistilBertConfig", base="distilbert", layers="transformer.layer",
    attention=Attention(
        module="attention", projections=("q_lin", "k_lin", "v_lin"), output="attention.out_lin",
        # 4.x reshapes with n_heads and dim (dim // n_heads per head); 5.x with attention_head_size only.
        head_size="attention_head_size", count=("n_heads",), width=("dim",),
    ),
    ffn_in="ffn.lin1", ffn_out="ffn.lin2", classes=_classes("DistilBert", (*ENCODER_HEADS, "masked-lm")),
    sizes=Sizes(layers="n_layers", hidden="dim", heads="n_heads", ffn="hidden_dim"),
    inputs=WITHOUT_SEGMENTS, mlm_head=_distilbert_mlm, finish_layer=_distilbert_finish,
    head_layers=_linear_heads(HeadLayers("first_token", (("pre_classifier", "relu"), ("classifier", None)))),
))


# ---------------------------------------------------------------------------- MPNet

HEAD_IDS = "compress_head_ids"  # a pruned MPNet attention's buffer: the original ids of the heads it kept


def _own_head_columns(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """Forward pre-hook of a pruned MPNet attention: its position bias (batch, all heads, q, k) cut to its own heads.

    The encoder computes the bias once from one ``relative_attention_bias`` table (buckets, heads)
    shared by every layer and passes it to each: positionally, third in 5.x and fourth in 4.x (after
    head_mask), so its place is read from the forward's signature.
    """
    ids = getattr(module, HEAD_IDS)
    if kwargs.get("position_bias") is not None:
        return args, {**kwargs, "position_bias": kwargs["position_bias"].index_select(1, ids)}
    at = _bias_position(type(module))
    if len(args) <= at or args[at] is None:
        return None
    return (*args[:at], args[at].index_select(1, ids), *args[at + 1:]), kwargs


@functools.cache
def _bias_position(attention_class: type) -> int:
    """Where ``position_bias`` comes in the attention forward's positional arguments (self not counted)."""
    return list(inspect.signature(attention_class.forward).parameters).index("position_bias") - 1


def _mpnet_heads_changed(model: nn.Module, removed: dict[int, list[int]]) -> None:
    """Give each MPNet layer that lost heads the columns of the shared position table its kept heads read.

    ``removed``: original head ids removed per layer. The table keeps every original head's column
    (other layers may still read it); a layer with all its heads reads the full bias untouched.
    """
    base = getattr(model, "mpnet", model)
    every = base.encoder.relative_attention_bias.weight.shape[1]  # the original head count
    for index, layer in enumerate(base.encoder.layer):
        attention = layer.attention.attn
        gone = set(removed.get(index, []))  # int keys: Encoder.removed_heads' record
        kept = [h for h in range(every) if h not in gone]
        heads = attention.q.out_features // attention.attention_head_size
        if len(kept) != heads:
            raise CompressError(f"layer {index} has {heads} heads but the record of removed heads leaves {len(kept)}; "
                                "the folder is inconsistent")
        if not gone:
            continue
        ids = torch.tensor(kept, dtype=torch.long, device=attention.q.weight.device)
        if hasattr(attention, HEAD_IDS):
            setattr(attention, HEAD_IDS, ids)
        else:
            attention.register_buffer(HEAD_IDS, ids, persistent=False)  # not a weight: rebuilt from the record
            attention.register_forward_pre_hook(_own_head_columns, with_kwargs=True)


FAMILIES.register("mpnet", Family(
    model_type="mpnet", config_class="MPNetConfig", base="mpnet", layers="encoder.layer",
    attention=Attention(
        module="attention.attn", projections=("q", "k", "v"), output="attention.attn.o",
        # 4.x reshapes with num_attention_heads and all_head_size; 5.x with the head size and all_head_size.
        head_size="attention_head_size", count=("num_attention_heads",), width=("all_head_size",),
    ),
    ffn_in="intermediate.dense", ffn_out="output.dense", classes=_classes("MPNet", (*ENCODER_HEADS, "masked-lm")),
    inputs=WITHOUT_SEGMENTS,  # no segment embeddings; padding id 1, positions counted from it (the model's own)
    unused_positions=lambda config: 2,  # MPNetEmbeddings fixes the padding id at 1 whatever the config says
    head_table="encoder.relative_attention_bias",
    # transformers 4.x would rebuild narrower heads from config.pruned_heads but add the full position bias to
    # them and fail in the forward; under this key its loader refuses the narrower weights instead.
    pruned_heads_key="compress_pruned_heads",
    mlm_head=lambda model: model.lm_head,  # as RoBERTa's: dense + gelu + LayerNorm, the tied decoder
    heads_changed=_mpnet_heads_changed,
    # no finish_layer: the last layer's first-token shortcut would have to add the position bias too
))


# ---------------------------------------------------------------------------- ModernBERT

FULL, SLIDING = "full_attention", "sliding_attention"


def _modernbert_base(model: nn.Module) -> nn.Module:
    return getattr(model, "model", model)  # ModernBertFor* keep the encoder in .model


def _modernbert_layer_types(model: nn.Module) -> dict[str, list]:
    """Each layer's attention kind as the modules hold it: global (full) or a sliding window."""
    from_modules = []
    for layer in _modernbert_base(model).layers:
        if hasattr(layer, "attention_type"):  # transformers 5.x
            from_modules.append(layer.attention_type)
        else:  # 4.x: (-1, -1) is no window
            from_modules.append(FULL if tuple(layer.attn.local_attention) == (-1, -1) else SLIDING)
    return {"layer_types": from_modules}


def _modernbert_default_types(config, n: int) -> dict[str, list]:
    """ModernBERT's own pattern for ``n`` fresh layers: global attention every n-th layer (3 by default)."""
    every = getattr(config, "global_attn_every_n_layers", None) or 3
    return {"layer_types": [SLIDING if i % every else FULL for i in range(n)]}


def _modernbert_place(model: nn.Module, origins: list[int]) -> None:
    """Give layer i the layout of original layer ``origins[i]``: its pre-attention norm and attention kind.

    ModernBERT builds its layers by position: layer 0 has no pre-attention LayerNorm (the
    embeddings end in one) and, on transformers 4.x, the index alone decides global vs
    sliding-window attention (window and rotary base). A layer that moved keeps what it was.
    """
    config = model.config
    layers = _modernbert_base(model).layers
    types = getattr(config, "layer_types", None)
    for i, (layer, origin) in enumerate(zip(layers, origins)):
        if origin == 0 and not isinstance(layer.attn_norm, nn.Identity):
            layer.attn_norm = nn.Identity()
        elif origin != 0 and isinstance(layer.attn_norm, nn.Identity):
            ref = layer.mlp_norm  # same shape, eps and bias setting as the missing norm
            layer.attn_norm = nn.LayerNorm(
                config.hidden_size, eps=ref.eps, bias=ref.bias is not None, device=ref.weight.device, dtype=ref.weight.dtype
            )
        if MODERNBERT_TYPES_FROM_CONFIG:
            continue  # 5.x built each layer's kind from config.layer_types
        every = config.global_attn_every_n_layers
        wanted_global = types[i] == FULL if types and len(types) == len(layers) else origin % every == 0
        if (tuple(layer.attn.local_attention) == (-1, -1)) != wanted_global:
            # An attention module built at a position of the wanted kind lends its window and rotary embedding.
            with no_init_weights():
                donor = type(layer.attn)(config=config, layer_id=0 if wanted_global else 1)
            layer.attn.local_attention = donor.local_attention
            layer.attn.rotary_emb = donor.rotary_emb.to(layer.attn.Wo.weight.device)


def _modernbert_mlm(model: nn.Module) -> nn.Module:
    return nn.Sequential(model.head, model.decoder)  # dense + act + norm, then the tied decoder


FAMILIES.register("modernbert", Family(
    model_type="modernbert", config_class="ModernBertConfig", base="model", layers="layers",
    attention=Attention(
        module="attn", projections=("Wqkv",), output="attn.Wo",
        # 4.x reshapes with num_heads and all_head_size; 5.x with head_dim only.
        head_size="head_dim", count=("num_heads",), width=("all_head_size",),
    ),
    ffn_in="mlp.Wi", ffn_out="mlp.Wo", glu=True, classes=_classes("ModernBert", (*ENCODER_HEADS, "masked-lm")),
    inputs=WITHOUT_SEGMENTS,
    # transformers 4.x would call the (missing) ModernBERT head pruning for config.pruned_heads.
    pruned_heads_key="compress_pruned_heads",
    mlm_head=_modernbert_mlm,
    layer_config=_modernbert_layer_types, default_layer_config=_modernbert_default_types, place_layers=_modernbert_place,
))
