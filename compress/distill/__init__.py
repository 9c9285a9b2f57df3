"""Distillation: into a task student (``task``: logits, hidden states, attention), task-agnostic on raw text
(``general``), of sentence embeddings (``embedding``) and into a static model2vec student (``static``); the shared
steps (``steps``), augmentation (``augment``), the teacher-output cache (``teacher_cache``), the loss functions
(``losses``), the table of loss terms (``terms``) and every distillation's options (``config``)."""

from compress.core.lazy import exports

__getattr__, __all__ = exports(__name__, {
    "distill": "task",
    "DistillConfig": "config",
    "distill_general": "general",
    "GeneralDistillConfig": "config",
    "distill_embedding": "embedding",
    "EmbeddingDistillConfig": "config",
    "distill_static": "static",
    "StaticDistillConfig": "config",
})
