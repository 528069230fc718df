"""``line-rest:stdlib`` and ``line-rest:pydoc``: finish a line of held-out text. The prompt is the ``CONTEXT_CHARS``
characters before a cut inside a line (about 128 tokens of the zoo's BPE; characters keep the rows independent of
any tokenizer), the reference the rest of that line; greedy to the newline, exact match. Code and English prose
from every Python: the pair on which a fine-tune forgets one domain while learning the other."""

from __future__ import annotations

import random

CONTEXT_CHARS = 400
ROWS = 300
MIN_LINE, MAX_REST = 24, 40  # a line long enough to cut, and at most this much to finish


def _rows(source: str, seed: int) -> list[dict]:
    from llmx.core.data import documents

    candidates = []
    for d, doc in enumerate(documents(source, "validation")):
        at = 0
        for line in doc.splitlines(keepends=True):
            text = line.rstrip("\n")
            body = text.lstrip()
            indent = len(text) - len(body)
            if len(body) >= MIN_LINE and at + indent >= CONTEXT_CHARS:
                middle = indent + len(body) // 2
                space = text.rfind(" ", indent, middle)  # at a space before the middle: the rest starts with it, as
                cut = space if space > indent else middle  # a byte-level BPE writes words (never cut after a space)
                rest = text[cut:]
                if 0 < len(rest) <= MAX_REST and rest.strip():
                    candidates.append({"id": f"{source}:{d}:{at + cut}",
                                       "prompt": doc[at + cut - CONTEXT_CHARS:at + cut], "reference": rest})
            at += len(line)
    return random.Random(f"line-rest:{source}:{seed}").sample(candidates, min(ROWS, len(candidates)))


def stdlib_rows(split: str, seed: int) -> list[dict]:
    return _rows("stdlib", seed)


def pydoc_rows(split: str, seed: int) -> list[dict]:
    return _rows("pydoc", seed)


def judge(row: dict, completion: str) -> tuple[float, str]:
    """Exact match; the note gives the share of the reference's characters matched before the first difference."""
    got, want = completion.rstrip("\n").rstrip(), row["reference"].rstrip()
    return float(got == want), f"prefix={prefix_share(got, want):.3f}"


def prefix_share(got: str, want: str) -> float:
    same = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))
    return same / max(len(want), 1)
