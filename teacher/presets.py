"""Teacher shapes, from a laptop-sized BERT to BERT-large, and the model a directory, hub alias or hub id names."""

from __future__ import annotations

from pathlib import Path

from compress.core.artifacts import require_model_dir
from compress.core.hub import download_model
# The hub aliases (HUB_ALIASES, which compress.pipeline imports from here) live beside the command line's early checks.
from compress.core.preflight import HUB_ALIASES, model_repo  # noqa: F401
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


def resolve_model(name: str | Path) -> Path:
    """A local model directory for ``name``: a directory, an alias (``bert-base``) or a hub id.

    Hub models are downloaded into the Hugging Face cache (safetensors only); offline,
    this fails at once with a one-line message.
    """
    path = Path(name).expanduser()
    if path.exists():
        return require_model_dir(path)
    return require_model_dir(download_model(model_repo(name)))
