"""Hugging Face hub ids: found in the local cache, or the hub reachable within seconds, else a usage error now rather
than a minute of retries (``huggingface_hub`` retries an unreachable host five times with backoff)."""

from __future__ import annotations

import os
import socket
from urllib.parse import urlparse

from llmx.errors import UsageError


def cached(name: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    found = try_to_load_from_cache(name, "config.json")
    return isinstance(found, str)


def reachable(timeout: float = 3.0) -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return False
    host = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co").hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
    except OSError:
        return False
    return True


def check(name: str, known: list[str]) -> None:
    """Raise when the hub id ``name`` can be neither read from the cache nor fetched."""
    from llmx.core.names import suggest

    if cached(name) or reachable():
        return
    bare = {k.partition(":")[2]: k for k in known if ":" in k}  # 'lamma' is most likely tiny:llama or ref:llama
    hits = suggest(name, known) or [bare[h] for h in suggest(name, bare)]
    hint = f" Did you mean '{hits[0]}'?" if hits else ""
    raise UsageError(f"model '{name}' is not a local folder or a known name, and the Hugging Face hub is not "
                     f"reachable (nor the id in its cache).{hint}")
