"""Sliding-window perplexity: each token is scored once, with up to ``seq_len - stride`` tokens of context. Each
window's mean NLL goes to ``windows.jsonl`` (the items ``llmx compare`` pairs across arms), its ``item`` the digest of
its start, its first scored position and its token ids."""

from __future__ import annotations

import math

from llmx.core import atomic
from llmx.core.context import RunContext
from llmx.core.data import token_stream
from llmx.core.eval.items import FIELD, item_id
from llmx.core.eval.lm import bits_per_byte, sequence_nll
from llmx.plugins.evals.config import PerplexityParams


def run(ctx: RunContext, p: PerplexityParams) -> dict:
    seq_len = p.seq_len or ctx.config.data.seq_len
    stride = p.stride or max(seq_len // 2, 1)
    tok = ctx.tokenizer
    tokens = token_stream(tok, p.source or ctx.config.data.source, p.split, p.max_tokens, ctx.config.data.splitting)
    windows: list = []
    total, count = sequence_nll(ctx.model, tokens, seq_len, stride, p.batch_size, ctx.progress, windows)
    atomic.write_jsonl(ctx.artifact("windows.jsonl"), [
        {FIELD: item_id(b, first, tokens[b:e].tolist()), "nll": s / n, "tokens": n}
        for (b, e, first), s, n in windows if n])
    nll = total / max(count, 1)
    return {"perplexity": math.exp(nll), "nll": nll, "bits_per_byte": bits_per_byte(total, tok, tokens),
            "tokens": count, "seq_len": seq_len, "stride": stride, "split": p.split}
