"""Teacher stage: model presets, WordPiece training, MLM+NSP pretraining (``pretrain.pretrain``) and task fine-tuning
(``finetune.finetune``)."""

from compress.core.lazy import exports

__getattr__, __all__ = exports(__name__, {
    "PretrainConfig": "pretrain",
    "FinetuneConfig": "finetune",
    "finetune_grid": "finetune",
})
