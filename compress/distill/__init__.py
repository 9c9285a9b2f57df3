"""Distillation: into a task student (``task``: logits, hidden states, attention), task-agnostic on raw text
(``general``), of sentence embeddings (``embedding``) and into a static model2vec student (``static``); the shared
steps (``steps``), augmentation (``augment``), the teacher-output cache (``teacher_cache``), the loss functions
(``losses``) and the table of loss terms (``terms``)."""

from compress.core.lazy import exports

__getattr__, __all__ = exports(__name__, {
    "distill": "task",
    "DistillConfig": "task",
    "distill_general": "general",
    "GeneralDistillConfig": "general",
    "distill_embedding": "embedding",
    "EmbeddingDistillConfig": "embedding",
    "distill_static": "static",
    "StaticDistillConfig": "static",
})
