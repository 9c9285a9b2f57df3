"""Hub aliases of released BERTs, and where a model named on the command line lives (a folder, an alias, a hub id).

The teacher shapes a pretraining run can build are presets in :mod:`compress.core.model.shapes`.
"""

from __future__ import annotations

from pathlib import Path

from compress.core.formats.folder import ModelFolder, open_folder
from compress.core.hub import download_model
# The hub aliases (HUB_ALIASES, which compress.pipeline imports from here) live beside the command line's early checks.
from compress.core.preflight import HUB_ALIASES, model_repo, require_model_dir  # noqa: F401


def resolve_model(name: str | Path) -> Path:
    """A local model directory for ``name``: a directory, an alias (``bert-base``) or a hub id.

    Hub models are downloaded into the Hugging Face cache (safetensors only); offline,
    this fails at once with a one-line message.
    """
    return require_model_dir(local_model(name))


def open_model(name: str | Path) -> ModelFolder:
    """The opened folder of ``name`` (:func:`resolve_model`'s directory, checked once, as a record)."""
    return open_folder(local_model(name))


def local_model(name: str | Path) -> Path:
    """Where ``name`` lives on this machine, unchecked: the path itself when it exists, else the hub model's download."""
    path = Path(name).expanduser()
    return path if path.exists() else download_model(model_repo(name))
