"""Reaching the Hugging Face hub: fail in seconds, with one clear message, when it is not there.

``datasets`` and ``transformers`` retry an unreachable hub for about 23 seconds and then
raise a chain of exceptions. We ask once, with a short timeout, before handing over.
"""

from __future__ import annotations

import functools
import os
import urllib.error
import urllib.request

PROBE_TIMEOUT_S = 4.0


def hub_offline_mode() -> bool:
    """True when the user asked for offline mode (then only the local cache is used)."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in {"1", "true", "yes", "on"}:
            return True
    return False


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
