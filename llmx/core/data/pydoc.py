"""The English reference prose that ships with every Python (``pydoc_data.topics``): the language reference's
sections that ``help()`` shows. Topics nest (``with`` is a section of ``compound``, ``sequence-types`` of
``specialnames``) and some share a text, so a topic mostly contained in a longer one is dropped: the rest are
distinct documents. They are few (about 60) and uneven in length, so the split is by topic but sized by text: topics
in the order of a hash of their name, validation the first ones that hold ``VALIDATION_PERCENT`` of the characters.
Next to ``stdlib`` (code) it gives every machine a second domain."""

from __future__ import annotations

import hashlib

from llmx.core.data import VALIDATION_PERCENT
from llmx.errors import MissingRequirement

SHINGLE = 12  # words: a passage this long shared by two topics is the same text
CONTAINED = 0.5  # a topic with at least this share of its passages inside a longer topic is a section of it


def topics() -> dict[str, str]:
    try:
        from pydoc_data.topics import topics as found
    except ImportError as exc:
        raise MissingRequirement("data source 'pydoc' needs pydoc_data, which this Python was built without",
                                 hint="Debian/Ubuntu: apt install python3-doc, or use another Python build") from exc
    return found


def shingles(text: str, n: int = SHINGLE) -> set[str]:
    words = text.split()
    return {" ".join(words[i:i + n]) for i in range(max(len(words) - n + 1, 0))}


def distinct() -> dict[str, str]:
    """Topics none of which is mostly inside another (of two equal texts, the first name in sorted order stays)."""
    found = topics()
    order = sorted(found, key=lambda name: (-len(found[name]), name))
    passages = {name: shingles(found[name]) for name in order}
    kept: dict[str, str] = {}
    for name in order:
        own = passages[name]
        if not any(len(own & passages[k]) >= CONTAINED * max(len(own), 1) for k in kept):
            kept[name] = found[name]
    return dict(sorted(kept.items()))


def documents(split: str) -> list[str]:
    found = distinct()
    order = sorted(found, key=lambda name: hashlib.sha256(f"pydoc:{name}".encode()).hexdigest())
    total, held, held_chars = sum(map(len, found.values())), set(), 0
    for name in order:
        if held_chars * 100 >= total * VALIDATION_PERCENT:
            break
        held.add(name)
        held_chars += len(found[name])
    return [found[name] for name in sorted(found) if (name in held) == (split == "validation")]
