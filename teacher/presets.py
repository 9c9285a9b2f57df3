"""Hub aliases of released BERTs, and where a model named on the command line lives (a folder, an alias, a hub id).

The teacher shapes a pretraining run can build are presets in :mod:`compress.core.shapes`.
"""

from __future__ import annotations

from pathlib import Path

from compress.core.artifacts import require_model_dir
from compress.core.errors import CompressError
from compress.core.hub import download_model

# Short names for released checkpoints on the Hugging Face hub.
HUB_ALIASES = {
    "bert-base": "google-bert/bert-base-uncased",
    "bert-base-uncased": "google-bert/bert-base-uncased",
    "bert-base-cased": "google-bert/bert-base-cased",
    "bert-large": "google-bert/bert-large-uncased",
    "bert-large-uncased": "google-bert/bert-large-uncased",
    "bert-large-cased": "google-bert/bert-large-cased",
}


def resolve_model(name: str | Path) -> Path:
    """A local model directory for ``name``: a directory, an alias (``bert-base``) or a hub id.

    Hub models are downloaded into the Hugging Face cache (safetensors only); offline,
    this fails at once with a one-line message.
    """
    text = str(name)
    path = Path(text).expanduser()
    if path.exists():
        return require_model_dir(path)
    repo = HUB_ALIASES.get(text.lower())
    if repo is None and text.count("/") == 1 and not text.startswith((".", "/", "~")):
        repo = text  # looks like "org/name"
    if repo is None:
        raise CompressError(
            f"model {text!r} is neither a directory nor a known hub model; pass a model directory, "
            f"one of {', '.join(sorted(HUB_ALIASES))}, or a hub id such as google-bert/bert-base-uncased"
        )
    return require_model_dir(download_model(repo))
