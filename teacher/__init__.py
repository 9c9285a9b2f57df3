"""Teacher stage: model presets, WordPiece training, MLM+NSP pretraining and task fine-tuning."""
