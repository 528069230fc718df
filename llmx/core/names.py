"""Name normalisation and did-you-mean suggestions shared by registries and config errors."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def normalize(name: str) -> str:
    """``GPTQ``, ``pipa_m`` and ``Pipa M`` all become ``gptq`` / ``pipa-m``."""
    return "-".join(name.strip().lower().replace("_", " ").replace(".", " ").replace("-", " ").split())


def suggest(word: str, candidates: Iterable[str], n: int = 1) -> list[str]:
    """Closest candidates to ``word`` (case and separator insensitive)."""
    table = {normalize(c): c for c in candidates}
    hits = difflib.get_close_matches(normalize(word), list(table), n=n, cutoff=0.6)
    return [table[h] for h in hits]


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """``" Did you mean 'gptq'?"`` or an empty string."""
    hits = suggest(word, candidates)
    return f" Did you mean '{hits[0]}'?" if hits else ""
