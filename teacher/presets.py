"""Hub aliases of released BERTs, and where a model named on the command line lives (a folder, an alias, a hub id).

The teacher shapes a pretraining run can build are presets in :mod:`compress.core.model.shapes`.
"""

from __future__ import annotations

from pathlib import Path

from compress.core.formats.artifacts import require_model_dir
from compress.core.hub import download_model
# The hub aliases (HUB_ALIASES, which compress.pipeline imports from here) live beside the command line's early checks.
from compress.core.preflight import HUB_ALIASES, model_repo  # noqa: F401


def resolve_model(name: str | Path) -> Path:
    """A local model directory for ``name``: a directory, an alias (``bert-base``) or a hub id.

    Hub models are downloaded into the Hugging Face cache (safetensors only); offline,
    this fails at once with a one-line message.
    """
    path = Path(name).expanduser()
    if path.exists():
        return require_model_dir(path)
    return require_model_dir(download_model(model_repo(name)))
