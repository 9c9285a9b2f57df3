"""Teacher stage: model presets, WordPiece training, MLM+NSP pretraining (``pretrain.pretrain``) and task fine-tuning
(``finetune.finetune``), and their options (``config``)."""

from compress.core.lazy import exports

__getattr__, __all__ = exports(__name__, {
    "PretrainConfig": "config",
    "FinetuneConfig": "config",
    "finetune_grid": "finetune",
})
