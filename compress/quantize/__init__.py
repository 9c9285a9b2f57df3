"""Post-training int8 quantization with checked outputs and an accuracy guard (``run``; its options in ``config``; a module per backend)."""

from compress.core.lazy import exports

__getattr__, __all__ = exports(__name__, {
    "quantize": "run",
    "QuantizeConfig": "config",
})
