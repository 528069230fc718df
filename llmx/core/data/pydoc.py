"""The English reference prose that ships with every Python (``pydoc_data.topics``): the language reference's
sections that ``help()`` shows, one document per distinct topic text. Topics are few (about 80) and uneven in length, so the split
is by topic but sized by text: topics in the order of a hash of their name, validation the first ones that hold
``VALIDATION_PERCENT`` of the characters. Next to ``stdlib`` (code) it gives every machine a second domain."""

from __future__ import annotations

import hashlib

from llmx.core.data import VALIDATION_PERCENT
from llmx.errors import MissingRequirement


def topics() -> dict[str, str]:
    try:
        from pydoc_data.topics import topics as found
    except ImportError as exc:
        raise MissingRequirement("data source 'pydoc' needs pydoc_data, which this Python was built without",
                                 hint="Debian/Ubuntu: apt install python3-doc, or use another Python build") from exc
    return found


def documents(split: str) -> list[str]:
    found = {}
    for name, text in sorted(topics().items()):  # some topics share a text: keep one, or it leaks across the split
        if text not in found.values():
            found[name] = text
    order = sorted(found, key=lambda name: hashlib.sha256(f"pydoc:{name}".encode()).hexdigest())
    total, held, held_chars = sum(map(len, found.values())), set(), 0
    for name in order:
        if held_chars * 100 >= total * VALIDATION_PERCENT:
            break
        held.add(name)
        held_chars += len(found[name])
    return [found[name] for name in sorted(found) if (name in held) == (split == "validation")]
