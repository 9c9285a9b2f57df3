"""The model itself, whatever its family: the family table (``families``), one record per task head (``heads``), the
one adapter that knows a family's internals (``encoder``), structure questions and surgery (``structure``), student
shapes (``shapes``), the importance of heads, FFN neurons and layers (``importance``) and FFN removal through
torch-pruning (``graph_pruning``)."""

from compress.core.lazy import exports

__getattr__, __all__ = exports(__name__, {
    "Encoder": "encoder",
    "get_family": "families",
    "Head": "heads",
    "get_head": "heads",
    "Shape": "shapes",
    "StudentShape": "shapes",
    "parse_shape": "shapes",
    "describe": "structure",
    "heads_per_layer": "structure",
    "flops_per_sequence": "structure",
    "prune_heads": "structure",
    "drop_layers": "structure",
    "head_importance_gradient": "importance",
    "ffn_importance_taylor": "importance",
})
