"""Hugging Face hub ids: found in the local cache, or the hub reachable within seconds, else a usage error now rather
than a minute of retries (``huggingface_hub`` retries an unreachable host five times with backoff)."""

from __future__ import annotations

import os
import socket
from urllib.parse import urlparse

from llmx.errors import UsageError

PROXIES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "HTTP_PROXY", "http_proxy")


def cached(name: str) -> bool:
    """Whether ``name`` is a valid hub id with a config in the local cache (an invalid id is a usage error)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    try:
        found = try_to_load_from_cache(name, "config.json")
    except ValueError as exc:  # HFValidationError: not a hub id at all
        raise UsageError(f"model '{name}' is not a local folder, a known name or a valid hub id ({exc})") from None
    return isinstance(found, str)


def reachable(timeout: float = 3.0) -> bool:
    """Whether the hub answers a TCP connection within ``timeout`` (the endpoint's own host and port). Behind a
    proxy the direct probe says nothing, so it is assumed reachable and the hub client decides."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return False
    if any(os.environ.get(p) for p in PROXIES):
        return True
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    port = url.port or (80 if url.scheme == "http" else 443)
    try:
        socket.create_connection((url.hostname or "huggingface.co", port), timeout=timeout).close()
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
