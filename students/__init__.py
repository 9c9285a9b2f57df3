"""Student shapes and their initialisation from a teacher: its layers, a slice of it, at random, or pretrained."""

from compress.core.lazy import exports

__getattr__, __all__ = exports(__name__, {
    "init_student": "init",
    "init_from_teacher": "init",
    "init_from_teacher_slices": "init",
})
