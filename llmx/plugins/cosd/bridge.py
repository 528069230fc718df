"""How the assistant reads the draft. ``Shared``: one tokenizer, the same ids. ``Retokenized``: different tokenizers
(the paper's §3.3); the draft's tokens are detokenised and the draft text encoded on its own after the committed
text's ids, so every drafted character is checked and the committed text is never re-split. Each assistant token's
P_p is the draft's probability of the draft token holding its first character (a choice of ours: the paper does not
say how probabilities align). Text is decoded by prefix difference over a few tokens of context, so a tokenizer
that drops a word's leading space when decoding it alone (SentencePiece) or a token holding part of a UTF-8
character keeps the text exact; an incomplete character at the end of a draft is held back for the next block."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

LOOKBEHIND = 8  # tokens of context decoded before a piece


def encode(tok: Any, text: str) -> list[int]:
    return list(tok(text)["input_ids"])


def decode(tok: Any, ids: list[int]) -> str:
    return tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def pieces(tok: Any, context: list[int], new: list[int]) -> list[str]:
    """The text each token of ``new`` adds after ``context``: a token that leaves a character incomplete adds
    nothing, the one completing it adds the character (so a trailing incomplete one is left out)."""
    look = context[-LOOKBEHIND:]
    before = decode(tok, look).rstrip("\ufffd")  # a context ending inside a character: the new tokens complete it
    out = []
    for i in range(len(new)):
        text = decode(tok, look + new[:i + 1])
        if text.endswith("\ufffd"):
            out.append("")
            continue
        out.append(text[len(before):])
        before = text
    return out


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

    def __init__(self, tok: Any, prompt: str):
        self.tok, self.ids = tok, encode(tok, prompt)
        self.prompt_len = len(self.ids)

    def draft_ids(self) -> list[int]:
        return self.ids

    def incomplete(self, ids: list[int], xs: list[int]) -> bool:
        return False

    def view(self, xs: list[int], pxs: list[float]) -> View:
        return View(self.ids + xs, len(self.ids), list(xs), list(pxs))

    def open_character(self, view: View, keep: int, tokens: list[int]) -> bool:
        return False

    def commit(self, view: View, keep: int, tokens: list[int]) -> None:
        """Keep the first ``keep`` draft tokens of ``view``, then ``tokens`` (a replacement) in place of the next."""
        self.ids = view.ids[:view.start + keep] + tokens

    def generated(self) -> list[int]:
        return self.ids[self.prompt_len:]

    def text(self) -> str:
        return decode(self.tok, self.generated())


class Retokenized:
    """Different tokenizers: the state is text; the draft and the assistant each encode it their own way. A draft
    that ends with EOS shows the assistant its own EOS after the text, so the assistant may refuse it."""

    def __init__(self, draft_tok: Any, assistant_tok: Any, prompt: str):
        if not getattr(assistant_tok, "is_fast", False):
            raise ValueError("a different-tokenizer pair needs a fast assistant tokenizer (character offsets)")
        self.draft_tok, self.assistant_tok = draft_tok, assistant_tok
        self.prompt, self.full = prompt, prompt
        self.committed = encode(assistant_tok, prompt)
        self.draft, self.starts, self.context = "", [], []

    def draft_ids(self) -> list[int]:
        """The draft's ids of the text so far (kept: the draft block's text is read after them)."""
        self.context = encode(self.draft_tok, self.full)
        return self.context

    def incomplete(self, ids: list[int], xs: list[int]) -> bool:
        """The draft so far ends inside a character."""
        return bool(xs) and decode(self.draft_tok, ids[-LOOKBEHIND:] + xs).endswith("\ufffd")

    def view(self, xs: list[int], pxs: list[float], eos_px: float | None = None) -> View:
        parts = pieces(self.draft_tok, self.context, xs)
        ends = []
        for part in parts:
            ends.append((ends[-1] if ends else 0) + len(part))
        self.draft = "".join(parts)
        ids, self.starts = self._encode_after(self.draft)
        out_p = [pxs[min(bisect.bisect_right(ends, a), len(pxs) - 1)] for a in self.starts]
        if eos_px is not None and self.assistant_tok.eos_token_id is not None:
            ids.append(self.assistant_tok.eos_token_id)
            out_p.append(eos_px)
            self.starts.append(len(self.draft))
        return View(self.committed + ids, len(self.committed), ids, out_p)

    def _encode_after(self, text: str) -> tuple[list[int], list[int]]:
        """``text``'s assistant ids and each one's first character, read after the committed text. A tokenizer that
        prefixes a space to what it encodes (SentencePiece's dummy prefix) gets a newline before ``text``, whose
        tokens are then dropped, unless the newline merges into ``text``'s first token."""
        look = self.committed[-LOOKBEHIND:]
        want = decode(self.assistant_tok, look) + text
        for sentinel in ("", "\n"):
            enc = self.assistant_tok(sentinel + text, add_special_tokens=False, return_offsets_mapping=True)
            pairs = [(i, a - len(sentinel)) for i, (a, b) in zip(enc["input_ids"], enc["offset_mapping"], strict=True)
                     if b > len(sentinel) or not sentinel]
            if pairs and pairs[0][1] < 0:
                continue
            ids = [i for i, _ in pairs]
            if not sentinel and decode(self.assistant_tok, look + ids) != want:
                continue
            return ids, [max(a, 0) for _, a in pairs]
        enc = self.assistant_tok(text, add_special_tokens=False, return_offsets_mapping=True)
        return list(enc["input_ids"]), [a for a, _ in enc["offset_mapping"]]

    def open_character(self, view: View, keep: int, tokens: list[int]) -> bool:
        """The replacement ends inside a character (a byte-level vocabulary splits it): the assistant's next
        tokens complete it."""
        context = view.ids[max(view.start + keep - LOOKBEHIND, 0):view.start + keep]
        return decode(self.assistant_tok, context + tokens).endswith("\ufffd")

    def commit(self, view: View, keep: int, tokens: list[int]) -> None:
        """Keep the draft's text up to its ``keep``-th assistant token, then ``tokens``' text. A replacement inside a
        character (byte-level tokens sharing its first offset) keeps that character's kept bytes as ids."""
        if keep == len(view.xs):
            self.full += self.draft
        else:
            first = keep
            while first > 0 and self.starts[first - 1] == self.starts[keep]:
                first -= 1
            context = view.ids[:view.start + first]
            self.full += self.draft[:self.starts[first]] + "".join(
                pieces(self.assistant_tok, context, view.xs[first:keep] + tokens))
        self.committed = encode(self.assistant_tok, self.full)

    def text(self) -> str:
        return self.full[len(self.prompt):]
