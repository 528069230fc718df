"""How the assistant reads the draft. ``Shared``: one tokenizer, the same ids. ``Retokenized``: different tokenizers;
the text so far plus the detokenised draft is re-encoded for the assistant (the paper's §3.3), and each assistant
token's P_p is the draft's probability of the draft token holding its first character (a choice of ours: the paper
does not say how probabilities align)."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any


def encode(tok: Any, text: str) -> list[int]:
    return list(tok(text)["input_ids"])


@dataclass
class View:
    """The assistant's ids of the text so far plus the draft; the draft starts at ``start``; ``xs[i]`` and ``pxs[i]``
    are the token at ``start + i`` and its P_p."""

    ids: list[int]
    start: int
    xs: list[int]
    pxs: list[float]


class Shared:
    """The models share a vocabulary: the state is token ids."""

    shared = True

    def __init__(self, tok: Any, prompt: str):
        self.tok, self.ids = tok, encode(tok, prompt)
        self.prompt_len = len(self.ids)

    def draft_ids(self) -> list[int]:
        return self.ids

    def view(self, xs: list[int], pxs: list[float]) -> View:
        return View(self.ids + xs, len(self.ids), list(xs), list(pxs))

    def commit(self, view: View, keep: int, token: int | None) -> None:
        """Keep the first ``keep`` draft tokens of ``view``, then ``token`` if one replaces the next."""
        self.ids = view.ids[:view.start + keep] + ([token] if token is not None else [])

    def text(self) -> str:
        return self.tok.decode(self.ids[self.prompt_len:], skip_special_tokens=True)


class Retokenized:
    """Different tokenizers: the state is text; the draft and the assistant each encode it their own way."""

    shared = False

    def __init__(self, draft_tok: Any, assistant_tok: Any, prompt: str):
        if not getattr(assistant_tok, "is_fast", False):
            raise ValueError("a different-tokenizer pair needs a fast assistant tokenizer (character offsets)")
        self.draft_tok, self.assistant_tok = draft_tok, assistant_tok
        self.prompt, self.full = prompt, prompt
        self.draft: str = ""

    def draft_ids(self) -> list[int]:
        return encode(self.draft_tok, self.full)

    def view(self, xs: list[int], pxs: list[float]) -> View:
        pieces = [self.draft_tok.decode([x], skip_special_tokens=True) for x in xs]
        ends = []
        for piece in pieces:
            ends.append((ends[-1] if ends else 0) + len(piece))
        self.draft = "".join(pieces)
        enc = self.assistant_tok(self.full + self.draft, return_offsets_mapping=True)
        ids, offsets, base = list(enc["input_ids"]), enc["offset_mapping"], len(self.full)
        start = next((i for i, (a, b) in enumerate(offsets) if a >= base and b > a), len(ids))
        out_x, out_p = [], []
        for i in range(start, len(ids)):
            a, b = offsets[i]
            if b <= a:
                break
            out_x.append(ids[i])
            out_p.append(pxs[min(bisect.bisect_right(ends, a - base), len(pxs) - 1)])
        self._offsets = offsets
        return View(ids[:start + len(out_x)], start, out_x, out_p)

    def commit(self, view: View, keep: int, token: int | None) -> None:
        if token is None and keep == len(view.xs):
            self.full += self.draft
            return
        cut = self._offsets[view.start + keep][0]
        head = (self.full + self.draft)[:cut]
        self.full = head + (self.assistant_tok.decode([token], skip_special_tokens=True) if token is not None else "")

    def text(self) -> str:
        return self.full[len(self.prompt):]
