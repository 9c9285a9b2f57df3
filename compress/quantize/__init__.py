"""Post-training int8 quantization with checked outputs and an accuracy guard (``run``)."""

from compress.core.lazy import exports

__getattr__, __all__ = exports(__name__, {
    "quantize": "run",
    "QuantizeConfig": "run",
})
