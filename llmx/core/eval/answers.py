"""Answer extraction and exact match for generate-and-judge tasks with a known answer."""

from __future__ import annotations

import re


def extract(text: str, pattern: str | None = None) -> str:
    """The answer in a completion: the first group (or whole match) of the last match of ``pattern``; by default the
    completion's first non-empty line. No match: an empty string."""
    if pattern is None:
        return next((line.strip() for line in text.splitlines() if line.strip()), "")
    hits = list(re.finditer(pattern, text))
    if not hits:
        return ""
    last = hits[-1]
    return (last.group(1) if last.groups() else last.group(0)).strip()


def normalize(answer: str) -> str:
    """Case-folded, whitespace collapsed, a trailing full stop dropped."""
    return " ".join(answer.casefold().split()).removesuffix(".")


def exact_match(prediction: str, gold: str) -> bool:
    """Equal after :func:`normalize`; two numbers are equal by value (``3.0`` matches ``3``)."""
    p, g = normalize(prediction), normalize(gold)
    if p == g:
        return True
    try:
        return float(p.replace(",", "")) == float(g.replace(",", ""))
    except ValueError:
        return False
