"""What the installed Hugging Face stack offers, decided once: transformers 4.x or 5.x, Optimum or not.

The toolkit runs on the pinned transformers 4.57 set (with Optimum's ONNX Runtime
integration) and on transformers 5.x (which removed ``prune_heads``, ``config.pruned_heads``
and ``head_mask``, and which optimum-onnx does not support). Code that differs between the
two asks here instead of testing versions itself, so each difference has one switch.
"""

from __future__ import annotations

import importlib.util

import transformers
from transformers import BertTokenizerFast

TRANSFORMERS_MAJOR = int(transformers.__version__.split(".")[0])

# transformers 4.x builds narrower attention from config.pruned_heads and has prune_heads;
# 5.x has neither, so narrower heads exist only through compression.json's structure.
STOCK_PRUNED_HEADS = TRANSFORMERS_MAJOR < 5

# ModernBERT layers take their attention kind (global or sliding window) from
# config.layer_types on 5.x, and from their index alone on 4.x.
MODERNBERT_TYPES_FROM_CONFIG = TRANSFORMERS_MAJOR >= 5

if TRANSFORMERS_MAJOR >= 5:
    from transformers.initialization import no_init_weights  # noqa: F401  (re-exported)
else:
    from transformers.modeling_utils import no_init_weights  # noqa: F401  (re-exported)


def has_module(name: str) -> bool:
    """True when ``name`` can be imported (without importing it)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


# Optimum's ONNX Runtime integration (optimum-onnx) needs transformers < 4.58; without it,
# export and int8 use torch.onnx and onnxruntime.quantization directly (same artifacts).
HAS_OPTIMUM_ONNX = has_module("optimum.onnxruntime")


def wordpiece_tokenizer(vocab_file, **kwargs):
    """A BERT WordPiece fast tokenizer from a ``vocab.txt``.

    transformers 5.x takes the file as ``vocab`` and silently ignores ``vocab_file`` (a
    tokenizer of special tokens only would result); 4.x takes ``vocab_file``.
    """
    key = "vocab" if TRANSFORMERS_MAJOR >= 5 else "vocab_file"
    return BertTokenizerFast(**{key: str(vocab_file)}, **kwargs)
