"""Tokenised preference batches and the log-probabilities every align loss is computed from.

Sequences are ``prompt + response``. One truncation policy, the same for every side of a pair: the prompt keeps its
last ``max_prompt_len`` tokens, then the response (with its EOS) is cut from the right to fit ``max_len``, so
chosen and rejected are always scored under the same prompt tokens. The response mask covers response tokens only
(prompt and padding excluded), aligned with ``token_logps`` (position t predicts token t+1).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from llmx.core.preference import token_logps
from llmx.core.tokenizer import leading_specials
from llmx.core.train.align.data import Example


@dataclass
class Encoded:
    ids: list[int]
    start: int  # index of the first response token
    step_bounds: list[tuple[int, int]] = field(default_factory=list)  # [start, end) token spans of the steps
    prompt_cut: bool = False
    response_cut: bool = False


def turn_end(tok, response: str) -> tuple[str, bool]:
    """A response a chat template rendered and whether the template ended it: ``(text, True)`` when it ends at a
    special token (the end-of-turn), whitespace the template writes after it (ChatML's newline) dropped, as
    generation stops at that token; it is then encoded with ``eos=False``, the template's end-of-turn ending it once
    (TRL adds an EOS to non-conversational rows only). A template that writes no special token after the response
    gives ``(response, False)``: it keeps its EOS, the only stop the model can learn."""
    body = response.rstrip()
    specials = set(tok.all_special_tokens) | {t.content for t in tok.added_tokens_decoder.values() if t.special}
    ended = any(body.endswith(t) for t in specials if t)
    return (body if ended else response), ended


def encode(tok, prompt: str, response: str | list[str], max_len: int, max_prompt_len: int | None = None,
           eos: bool = True, bos: bool = True) -> Encoded:
    """``max_prompt_len`` defaults to half of ``max_len``; ``eos=False`` scores the response as sampled, without an
    EOS it never had, or as a chat template ended it (``turn_end``); ``bos=False`` for a prompt a chat template
    rendered (it writes its own)."""
    keep = max_prompt_len if max_prompt_len is not None else max_len // 2
    lead = leading_specials(tok) if bos else []  # BOS for tokenizers that put one first, kept through truncation
    p = tok(prompt, add_special_tokens=False)["input_ids"]
    prompt_cut = len(lead) + len(p) > keep
    p = lead + (p[len(p) - max(keep - len(lead), 0):] if prompt_cut else p)
    p = p or [tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id]
    steps = response if isinstance(response, list) else [response]
    r, bounds = [], []
    for s in steps:
        piece = tok(s, add_special_tokens=False)["input_ids"]
        bounds.append((len(r), len(r) + len(piece)))
        r += piece
    r = r + [tok.eos_token_id] if eos else r
    response_cut = len(r) > max_len - len(p)
    r = r[:max_len - len(p)]
    offset = len(p)
    spans = [(offset + a, offset + min(b, len(r))) for a, b in bounds if a < len(r)]
    return Encoded(p + r, offset, spans, prompt_cut, response_cut)


@dataclass
class Tensors:
    input_ids: torch.Tensor  # [B, T]
    attention_mask: torch.Tensor
    response_mask: torch.Tensor  # [B, T-1], over token_logps positions
    prompt_end: torch.Tensor  # [B] index of the last prompt token (where g reads the hidden state)


def collate(items: list[Encoded], pad_id: int, device: torch.device | str = "cpu") -> Tensors:
    width = max(len(e.ids) for e in items)
    ids = torch.full((len(items), width), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    resp = torch.zeros(len(items), width - 1)
    for i, e in enumerate(items):
        ids[i, :len(e.ids)] = torch.tensor(e.ids)
        attn[i, :len(e.ids)] = 1
        resp[i, e.start - 1:len(e.ids) - 1] = 1
    prompt_end = torch.tensor([e.start - 1 for e in items])
    return Tensors(ids.to(device), attn.to(device), resp.to(device), prompt_end.to(device))


def step_matrix(items: list[Encoded], width: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, S, T-1]`` token-to-step membership over token_logps positions, and the ``[B, S]`` step mask."""
    n = max(len(e.step_bounds) for e in items)
    member = torch.zeros(len(items), n, width - 1)
    mask = torch.zeros(len(items), n)
    for i, e in enumerate(items):
        for k, (a, b) in enumerate(e.step_bounds):
            member[i, k, a - 1:b - 1] = 1
            mask[i, k] = 1
    return member.to(device), mask.to(device)


def forward(model, t: Tensors, hidden: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs ``[B, T-1]`` (zero outside the response mask is the caller's job) and, when asked, the
    last layer's hidden states ``[B, T, H]``."""
    out = model(input_ids=t.input_ids, attention_mask=t.attention_mask, output_hidden_states=hidden)
    return token_logps(out.logits, t.input_ids), (out.hidden_states[-1] if hidden else None)


def examples_for(kind: str, ex: Example) -> list[tuple[str, str | list[str]]]:
    """The (prompt, response) sequences an example contributes, in a fixed order."""
    if kind == "paired":
        return [(ex.prompt, ex.chosen), (ex.prompt, ex.rejected)]
    if kind == "unpaired":
        return [(ex.prompt, ex.completion)]
    return [(ex.prompt, ex.steps)]
