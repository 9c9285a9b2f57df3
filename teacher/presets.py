"""Teacher shapes, from a laptop-sized BERT to BERT-large, and hub aliases of released BERTs."""

from __future__ import annotations

from compress.core.registry import Registry
from compress.core.structure import Shape

TEACHER_SHAPES: Registry[Shape] = Registry("teacher shape")
for _name, _shape in {
    # Small BERTs from Turc et al. 2019 ("Well-Read Students Learn Better"), BERT-base/large from Devlin et al.
    "2L-128": Shape(2, 128, 2, 512, "Turc et al. 2019 (BERT-tiny)"),
    "4L-256": Shape(4, 256, 4, 1024, "Turc et al. 2019 (BERT-mini)"),
    "4L-512": Shape(4, 512, 8, 2048, "Turc et al. 2019 (BERT-small)"),
    "8L-512": Shape(8, 512, 8, 2048, "Turc et al. 2019 (BERT-medium)"),
    "base": Shape(12, 768, 12, 3072, "Devlin et al. 2019 (BERT-base)"),
    "large": Shape(24, 1024, 16, 4096, "Devlin et al. 2019 (BERT-large)"),
}.items():
    TEACHER_SHAPES.register(_name, _shape)

# Short names for released checkpoints on the Hugging Face hub.
HUB_ALIASES = {
    "bert-base": "google-bert/bert-base-uncased",
    "bert-base-uncased": "google-bert/bert-base-uncased",
    "bert-base-cased": "google-bert/bert-base-cased",
    "bert-large": "google-bert/bert-large-uncased",
    "bert-large-uncased": "google-bert/bert-large-uncased",
    "bert-large-cased": "google-bert/bert-large-cased",
}
