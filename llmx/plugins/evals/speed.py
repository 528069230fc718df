"""Prefill and decode throughput. Decode rate = (N - 1) / (t(generate N) - t(generate 1)): the prefill and the
first token cancel out, so the figure is the steady cached decode step, for any architecture ``generate`` runs."""

from __future__ import annotations

import statistics
import time

import torch

from llmx.core.context import RunContext
from llmx.core.data import token_stream
from llmx.plugins.evals.config import SpeedParams


def _timed(fn, repeats: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@torch.inference_mode()
def run(ctx: RunContext, p: SpeedParams) -> dict:
    model, tok = ctx.model, ctx.tokenizer
    device = next(model.parameters()).device
    need = p.prompt_len * p.batch_size
    stream = token_stream(tok, ctx.config.data.source, "validation", need, ctx.config.data.splitting)
    if len(stream) < need:
        stream = stream.repeat(need // max(len(stream), 1) + 1)
    prompt = stream[:need].reshape(p.batch_size, p.prompt_len).to(device)
    mask = torch.ones_like(prompt)

    def generate(n: int):
        return model.generate(input_ids=prompt, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                              do_sample=False, pad_token_id=tok.pad_token_id)

    prefill = _timed(lambda: model(input_ids=prompt, attention_mask=mask), p.repeats, p.warmup)
    one = _timed(lambda: generate(1), p.repeats, p.warmup)
    full = _timed(lambda: generate(p.new_tokens), p.repeats, p.warmup)
    decode_step = max(full - one, 1e-9) / (p.new_tokens - 1)
    return {"prefill_tokens_per_s": need / prefill, "decode_tokens_per_s": p.batch_size / decode_step,
            "decode_ms_per_token": 1000 * decode_step, "prompt_len": p.prompt_len, "new_tokens": p.new_tokens,
            "batch_size": p.batch_size, "threads": torch.get_num_threads(), "device": str(device)}
