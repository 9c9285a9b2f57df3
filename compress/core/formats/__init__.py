"""Model directories and the formats they hold: their file names (``layout``), saving and loading (``artifacts``), their
records (``records``), the atomic writer (``writes``), weight checks,
the model card, loading any format for a run (``runtime``), ONNX, OpenVINO and CTranslate2 exports, sentence-transformers folders
(``sentence``) and model2vec static folders (``static``)."""

from compress.core.lazy import exports

__getattr__, __all__ = exports(__name__, {
    "load_model": "runtime",
    "load_model_for_task": "runtime",
    "save_model_dir": "artifacts",
    "compression_record": "records",
    "read_compression": "records",
    "append_metrics": "records",
    "export_onnx": "onnx",
    "export_openvino": "openvino",
    "export_ctranslate2": "ctranslate2",
    "encode": "sentence",
    "model_card": "card",
})
