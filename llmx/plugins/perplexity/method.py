"""Sliding-window perplexity: each token is scored once, with up to ``seq_len - stride`` tokens of context."""

from __future__ import annotations

import math

import torch

from llmx.core.context import RunContext
from llmx.core.data import token_stream
from llmx.plugins.perplexity.config import PerplexityParams


def windows(n: int, seq_len: int, stride: int) -> list[tuple[int, int, int]]:
    """``(begin, end, first_scored)`` per window; scored target positions tile ``[1, n)`` exactly once.
    Consecutive windows overlap by at least one token, so no target lacks context."""
    out, begin, first = [], 0, 1
    while True:
        end = min(begin + seq_len, n)
        out.append((begin, end, first))
        if end >= n:
            return out
        first = end
        begin = min(begin + stride, end - 1)


@torch.inference_mode()
def sequence_nll(model: torch.nn.Module, tokens: torch.Tensor, seq_len: int, stride: int, batch_size: int,
                 progress=lambda x, **_: x) -> tuple[float, int]:
    """Summed NLL (nats) of ``tokens[1:]`` and the number of tokens scored."""
    device = next(model.parameters()).device
    total, count = 0.0, 0
    spans = windows(len(tokens), seq_len, stride)
    batches = [spans[i:i + batch_size] for i in range(0, len(spans), batch_size)]
    for batch in progress(batches, description="perplexity"):
        by_len: dict[int, list] = {}
        for span in batch:
            by_len.setdefault(span[1] - span[0], []).append(span)
        for length, group in by_len.items():
            x = torch.stack([tokens[b:e] for b, e, _ in group]).to(device)
            logp = torch.log_softmax(model(input_ids=x).logits.float(), dim=-1)
            nll = -logp[:, :-1].gather(-1, x[:, 1:, None]).squeeze(-1)
            for row, (b, _, first) in enumerate(group):
                total += float(nll[row, first - b - 1:].sum())
                count += length - (first - b)
    return total, count


def run(ctx: RunContext, p: PerplexityParams) -> dict:
    seq_len = p.seq_len or ctx.config.data.seq_len
    stride = p.stride or max(seq_len // 2, 1)
    tok = ctx.tokenizer
    tokens = token_stream(tok, p.source or ctx.config.data.source, p.split, p.max_tokens)
    total, count = sequence_nll(ctx.model, tokens, seq_len, stride, p.batch_size, ctx.progress)
    n_bytes = len(tok.decode(tokens[1:].tolist(), skip_special_tokens=True).encode("utf-8"))
    nll = total / max(count, 1)
    return {"perplexity": math.exp(nll), "nll": nll, "bits_per_byte": total / math.log(2) / max(n_bytes, 1),
            "tokens": count, "seq_len": seq_len, "stride": stride}
