"""An annotated row as the interpreter runs it (notes §2): which stream each token belongs to, its position, what it
predicts and what it sees. Pasta-SFT trains on exactly this, so training and decoding agree token for token.

- A chunk (``<async>`` … ``</async>``) is its own stream; it sees the main stream through its promise and itself.
- Main-stream tokens after a promise see no chunk until ``<sync/>``; from ``<sync/>`` on they see every chunk.
- Positions: the main stream counts on; after a promise ending at position p with ``tokens="N"`` the chunk takes
  p+1 … and the main stream resumes at p+1+N (the prediction, not the chunk's true length).
- Each token predicts the next token of its own stream: a promise's last token predicts the main stream's next
  token (the chunk's ``<async>`` is the thread's forced first input), and ``</async>`` predicts nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from llmx.core.tokenizer import leading_specials
from llmx.core.train.sft.batch import IGNORE
from llmx.plugins.pasta import lang

MAIN = 0


def encode(tok, text: str, prompt: bool = False) -> list[int]:
    """Ids of a prompt (after the tokenizer's leading specials) or of a response, each tokenized on its own: the
    interpreter starts from the prompt's ids, so training reads the same boundary."""
    return (leading_specials(tok) if prompt else []) + tok(text, add_special_tokens=False)["input_ids"]


def mask_kind(model) -> str:
    """How the model's attention reads a custom 4-D mask: ``bool`` (SDPA) or ``additive`` (eager); flash attention
    takes none (refused)."""
    impl = getattr(model.config, "_attn_implementation", "sdpa")
    if impl.startswith("flash"):
        raise lang.PastaSyntaxError(f"{impl} takes no custom 4-D mask: load the model with sdpa or eager attention, "
                                    "or decode with attention: segments", "flash-attention")
    return "bool" if impl == "sdpa" else "additive"


def attention_mask(seen: torch.Tensor, model) -> torch.Tensor:
    """[B, Q, K] visibility as a 4-D mask in the model's ``mask_kind``: as is, or 0 / the dtype's minimum."""
    if mask_kind(model) == "bool":
        return seen[:, None]
    dtype = next(model.parameters()).dtype
    return torch.zeros(seen.shape, dtype=dtype, device=seen.device).masked_fill(~seen, torch.finfo(dtype).min)[:, None]


@dataclass
class Layout:
    ids: list[int]  # text order: prompt, then the response with its chunks inline
    stream: list[int]  # MAIN, or k >= 1 for the k-th chunk
    positions: list[int]
    targets: list[int]  # the next token of the same stream (IGNORE: none, or an untrained prompt token)
    prompt_len: int
    sync: int | None  # index of ``<sync/>``: main tokens from here on see every chunk
    promised: list[int]  # each chunk's ``tokens`` attribute
    actual: list[int]  # each chunk's true length, ``<async>`` through ``</async>``

    def visible(self, device=None) -> torch.Tensor:
        """[L, L] bool: token i attends to token j."""
        n = len(self.ids)
        s = torch.tensor(self.stream, device=device)
        causal = torch.ones(n, n, dtype=torch.bool, device=device).tril()
        same = s[:, None] == s[None, :]
        to_main = (s == MAIN)[None, :].expand(n, n)
        joined = torch.zeros(n, dtype=torch.bool, device=device)
        if self.sync is not None:
            joined[self.sync:] = True
        seen_by_main = (s == MAIN)[:, None] & joined[:, None]
        return causal & (same | to_main | seen_by_main)

    def script(self) -> tuple[list[int], list[list[int]]]:
        """The main stream's response tokens and each chunk's tokens: a forced script for the interpreter."""
        main = [t for i, t in enumerate(self.ids[self.prompt_len:], self.prompt_len) if self.stream[i] == MAIN]
        chunks = [[t for t, s in zip(self.ids, self.stream, strict=True) if s == k] for k in range(1, len(self.actual) + 1)]
        return main, chunks


def build(prompt: list[int], response: list[int], tag_ids: dict[str, int], decode: Callable[[list[int]], str],
          eos: int | None = None) -> Layout:
    """The layout of ``prompt`` + ``response`` (+ ``eos``, a main-stream token); raises ``PastaSyntaxError`` on a
    chunk not right after a promise, a promise without its chunk, or tags out of order (``lang.StreamParser``)."""
    opening, closing = tag_ids[lang.ASYNC_OPEN], tag_ids[lang.ASYNC_CLOSE]
    ids = list(prompt) + list(response) + ([eos] if eos is not None else [])
    stream, positions = [MAIN] * len(prompt), list(range(len(prompt)))
    parser = lang.StreamParser(tag_ids, decode)
    promised: list[int] = []
    actual: list[int] = []
    pending: tuple[int, int] | None = None  # (position of the promise's last token, N) awaiting its chunk
    pos, chunk, sync = len(prompt), 0, None
    for i in range(len(prompt), len(ids)):
        t = ids[i]
        if chunk:
            stream.append(chunk)
            positions.append(positions[i - 1] + 1)
            actual[-1] += 1
            if t == closing:
                chunk = 0
            continue
        if t == opening:
            if pending is None or ids[i - 1] != tag_ids[lang.PROMISE_CLOSE]:
                raise lang.PastaSyntaxError(f"token {i - len(prompt)}: <async> not right after a promise", "stray-async")
            chunk = len(actual) + 1
            stream.append(chunk)
            positions.append(pending[0] + 1)
            actual.append(1)
            pending = None
            continue
        if pending is not None:
            raise lang.PastaSyntaxError(f"token {i - len(prompt)}: a promise without its <async> chunk", "no-chunk")
        stream.append(MAIN)
        positions.append(pos)
        event = parser.feed(t) if t != eos else None
        if isinstance(event, lang.PromiseDone):
            promised.append(event.tokens)
            pending, pos = (pos, event.tokens), pos + 1 + event.tokens
            continue
        if isinstance(event, lang.Sync):
            sync = i
        pos += 1
    if chunk or pending is not None:
        raise lang.PastaSyntaxError("the response ends inside a promise's chunk", "unclosed-async")
    return Layout(ids, stream, positions, _targets(ids, stream, len(prompt), closing), len(prompt), sync, promised,
                  actual)


def _targets(ids: list[int], stream: list[int], prompt_len: int, closing: int) -> list[int]:
    targets = [IGNORE] * len(ids)
    last: dict[int, int] = {}
    for i, s in enumerate(stream):
        if s in last and i >= prompt_len and ids[last[s]] != closing:
            targets[last[s]] = ids[i]
        last[s] = i
    return targets
