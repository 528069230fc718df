"""The identity of a scored item (a window, a prompt, a question, a problem): ``item_id`` digests what was scored, so
that ``llmx compare`` pairs two arms' rows only where they scored the same thing, and refuses rows whose items
differ (a per-arm change of context length, data, or problem instance) instead of pairing them by position."""

from __future__ import annotations

import hashlib
import json
from typing import Any

FIELD = "item"


def item_id(*parts: Any) -> str:
    """A short, stable digest of ``parts`` (token ids, prompt text, a problem's name and seed: plain values)."""
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]
