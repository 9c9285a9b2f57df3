"""Reaching the Hugging Face hub: fail in seconds, with one clear message, when it is not there.

``datasets`` and ``transformers`` retry an unreachable hub for about 23 seconds and then
raise a chain of exceptions. We ask once, with a short timeout, before handing over.
"""

from __future__ import annotations

import contextlib
import functools
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

import huggingface_hub.constants
from huggingface_hub import snapshot_download

from compress.core.errors import CompressError, reason

PROBE_TIMEOUT_S = 4.0


def hub_offline_mode() -> bool:
    """True when the user asked for offline mode (then only the local cache is used)."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in {"1", "true", "yes", "on"}:
            return True
    return False


@contextlib.contextmanager
def offline_as_set_now() -> Iterator[None]:
    """Make datasets and huggingface_hub honour offline mode as the environment says *now*.

    Both read HF_HUB_OFFLINE once, at import: set later (a test, a notebook), it was
    ignored and an offline ``load_dataset`` spent ~23 s retrying before failing.
    """
    # deferred: a heavy import, paid only where it is used
    import datasets.config

    if not hub_offline_mode():
        yield
        return
    saved = datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = huggingface_hub.constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE = saved


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


@functools.lru_cache(maxsize=1)
def hub_reachable(timeout: float = PROBE_TIMEOUT_S) -> bool:
    """One HEAD request to the hub endpoint (proxies from the environment are honoured)."""
    if hub_offline_mode():
        return False
    request = urllib.request.Request(hub_endpoint(), method="HEAD")
    try:
        urllib.request.urlopen(request, timeout=timeout).close()
        return True
    except urllib.error.HTTPError:
        return True  # the server answered, even if with an error status
    except (OSError, ValueError):
        return False


# Files a BERT model directory needs; weights in safetensors only (never pickles from the hub).
MODEL_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json", "model-*.safetensors",
               "vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def download_model(repo_id: str, revision: str | None = None) -> Path:
    """Fetch a model repository's config, safetensors weights and tokenizer into the HF cache.

    Fails within seconds, with one line, when the hub cannot be reached and the files are
    not cached. Only safetensors weights are downloaded: a repository that has only
    pickled ``pytorch_model.bin`` weights is refused rather than unpickled.
    """
    offline = hub_offline_mode() or not hub_reachable()
    try:
        path = Path(
            snapshot_download(repo_id, revision=revision, allow_patterns=list(MODEL_FILES), local_files_only=offline)
        )
    except Exception as err:
        if offline:
            raise CompressError(
                f"cannot download model {repo_id!r}: the Hugging Face hub is unreachable (or HF_HUB_OFFLINE is set) "
                "and it is not in the local cache; pass a local model directory instead"
            ) from None
        why = reason(err)
        raise CompressError(f"cannot download model {repo_id!r} from the Hugging Face hub: {why}") from None
    if not (path / "config.json").is_file():
        raise CompressError(f"hub repository {repo_id!r} has no config.json; is it a model repository?")
    if not any(path.glob("*.safetensors")):
        raise CompressError(
            f"hub repository {repo_id!r} has no safetensors weights; compress does not unpickle downloaded "
            "pytorch_model.bin files — convert it to safetensors locally and pass the directory"
        )
    return path
