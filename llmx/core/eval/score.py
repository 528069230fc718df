"""Log-likelihood of continuations given contexts: label-word scoring for classification and multiple choice, and the
NLL of a reference answer (a graded signal where a small model never passes).

Encoding follows lm-evaluation-harness, so the two agree on the same rows: trailing whitespace of the context moves
to the continuation, the pair is encoded whole, and the continuation is what follows the context's own tokens; an
empty context is the BOS (else EOS) token unless the continuation starts with it. The sequence keeps its last
``context + 1`` tokens, the context being the config's (as lm-eval resolves it: ``text_config`` first, then the
tokenizer's ``model_max_length``, then 2048); rows are right-padded in a batch (causal: padding after a row never
reaches it), and only the continuation's positions are turned into log-probabilities.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from llmx.core.eval.generate import context_limit

DEFAULT_CONTEXT = 2048
UNSET = 10**29  # tokenizers say "no limit" with a model_max_length of about 1e30


@dataclass(frozen=True)
class Scored:
    logprob: float  # summed log-probability (nats) of the continuation's tokens
    tokens: int
    greedy: bool  # every continuation token is the argmax


def move_whitespace(context: str, continuation: str) -> tuple[str, str]:
    """The context's trailing whitespace moved to the start of the continuation (lm-eval's ``_encode_pair``)."""
    spaces = len(context) - len(context.rstrip())
    return (context[:-spaces], context[-spaces:] + continuation) if spaces else (context, continuation)


def encode_pair(tok, context: str, continuation: str) -> tuple[list[int], list[int]]:
    if context:  # lm-eval tests for an empty context before it moves whitespace
        context, continuation = move_whitespace(context, continuation)
    if not context:
        first = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
        ids = tok(continuation, add_special_tokens=False)["input_ids"]
        return (ids[:1], ids[1:]) if ids and ids[0] == first else ([first], ids)
    whole = tok(context + continuation)["input_ids"]
    head = tok(context)["input_ids"]
    return head, whole[len(head):]


def continuation_logprobs(model, tok, pairs: Sequence[tuple[str, str]], batch_size: int = 8,
                          progress: Callable = lambda x, **_: x) -> list[Scored]:
    """One :class:`Scored` per ``(context, continuation)`` pair of texts, in order."""
    return token_logprobs(model, tok, [encode_pair(tok, c, x) for c, x in pairs], batch_size, progress)


@torch.inference_mode()
def token_logprobs(model, tok, pairs: Sequence[tuple[list[int], list[int]]], batch_size: int = 8,
                   progress: Callable = lambda x, **_: x) -> list[Scored]:
    """One :class:`Scored` per ``(context ids, continuation ids)`` pair: the continuation's tokens as given."""
    device = next(model.parameters()).device
    limit = scoring_limit(model, tok)
    seqs: list[tuple[list[int], int]] = []  # (whole sequence, continuation tokens scored)
    for head, tail in pairs:
        whole = (list(head) + list(tail))[-(limit + 1):]
        seqs.append((whole, min(len(tail), len(whole) - 1)))
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    order = sorted(range(len(seqs)), key=lambda r: -len(seqs[r][0]))
    out: list[Scored | None] = [None] * len(seqs)
    for start in progress(range(0, len(order), batch_size), description="scoring"):
        batch = order[start:start + batch_size]
        width = max(len(seqs[r][0]) - 1 for r in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long, device=device)
        mask = torch.zeros_like(ids)
        for b, r in enumerate(batch):
            inputs = seqs[r][0][:-1]
            ids[b, :len(inputs)] = torch.tensor(inputs, dtype=torch.long, device=device)
            mask[b, :len(inputs)] = 1
        logits = model(input_ids=ids, attention_mask=mask).logits
        for b, r in enumerate(batch):
            whole, n = seqs[r]
            want = torch.tensor(whole[len(whole) - n:], dtype=torch.long, device=device)
            rows = torch.log_softmax(logits[b, len(whole) - 1 - n:len(whole) - 1].float(), dim=-1)
            picked = rows.gather(-1, want[:, None]).squeeze(-1)
            out[r] = Scored(float(picked.sum()), n, bool((rows.argmax(-1) == want).all()))
    return out  # type: ignore[return-value]


@torch.inference_mode()
def next_logprobs(model, tok, contexts: Sequence[list[int]], ids: Sequence[Sequence[int]], batch_size: int = 8,
                  progress: Callable = lambda x, **_: x) -> torch.Tensor:
    """``[contexts, len(ids[r])]``: the log-probability of each of ``ids[r]`` as the token after context ``r`` (one
    forward per context serves every candidate; contexts are right-padded in a batch)."""
    device = next(model.parameters()).device
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    order = sorted(range(len(contexts)), key=lambda r: -len(contexts[r]))
    out = torch.empty(len(contexts), len(ids[0]) if ids else 0, dtype=torch.float64)
    for start in progress(range(0, len(order), batch_size), description="scoring"):
        batch = order[start:start + batch_size]
        width = max(len(contexts[r]) for r in batch)
        x = torch.full((len(batch), width), pad, dtype=torch.long, device=device)
        mask = torch.zeros_like(x)
        for b, r in enumerate(batch):
            x[b, :len(contexts[r])] = torch.tensor(contexts[r], dtype=torch.long, device=device)
            mask[b, :len(contexts[r])] = 1
        logits = model(input_ids=x, attention_mask=mask).logits
        last = torch.tensor([len(contexts[r]) - 1 for r in batch], device=device)
        rows = torch.log_softmax(logits[torch.arange(len(batch), device=device), last].float(), dim=-1)
        want = torch.tensor([list(ids[r]) for r in batch], dtype=torch.long, device=device)
        out[batch] = rows.gather(-1, want).double().cpu()
    return out


def scoring_limit(model, tok) -> int:
    """The context a scored sequence must fit, as lm-evaluation-harness resolves it."""
    from_tokenizer = getattr(tok, "model_max_length", None)
    usable = isinstance(from_tokenizer, int) and 0 < from_tokenizer < UNSET
    return context_limit(model) or (from_tokenizer if usable else DEFAULT_CONTEXT)


def choose(scores: Sequence[Scored], choices: Sequence[str]) -> tuple[int, int]:
    """The chosen index by summed log-probability, and by log-probability per character of the choice (as
    lm-evaluation-harness's ``acc`` and ``acc_norm``)."""
    raw = max(range(len(scores)), key=lambda c: scores[c].logprob)
    norm = max(range(len(scores)), key=lambda c: scores[c].logprob / max(len(choices[c]), 1))
    return raw, norm
