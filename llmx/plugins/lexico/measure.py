"""Quality and memory of a compressed KV cache against the full cache, on held-out text.

For each window: prefill ``context_len`` tokens, then decode ``continuation_len`` tokens one at a time (teacher
forcing) through the cache under test and through a full ``DynamicCache``; compare the next-token distributions
(KL(full || compressed)), the continuation's NLL, and greedy generations of ``generate_tokens`` tokens.
Memory: bytes the cache stores after the prefill and decode, over the fp16 bytes of a full cache of that length.
"""

from __future__ import annotations

import math

import torch
from transformers import DynamicCache

from llmx.core.context import RunContext
from llmx.core.data import token_stream


@torch.no_grad()
def measure(ctx: RunContext, p, make_cache) -> dict:
    model, tok = ctx.model, ctx.tokenizer
    n = p.context_len + p.continuation_len
    stream = token_stream(tok, ctx.config.data.source, "validation", p.windows * n)
    windows = stream[: (len(stream) // n) * n].reshape(-1, n)[: p.windows]
    kl = nll = nll_full = 0.0
    agree = gen_agree = gen_total = 0
    stored = full_fp16 = 0
    cfg = model.config
    kv_heads = getattr(cfg, "num_key_value_heads", cfg.num_attention_heads)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    for w in ctx.progress(list(windows), description="kv cache"):
        ids = w[None]
        caches = {"full": DynamicCache(), "test": make_cache()}
        logps = {}
        for name, cache in caches.items():
            out = model(input_ids=ids[:, : p.context_len], past_key_values=cache, use_cache=True)
            steps = [out.logits[:, -1]]
            for t in range(p.context_len, n - 1):
                steps.append(model(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits[:, -1])
            logps[name] = torch.log_softmax(torch.cat(steps).float(), -1)
        target = ids[0, p.context_len:]
        kl += float((logps["full"].exp() * (logps["full"] - logps["test"])).sum(-1).sum())
        nll += float(-logps["test"].gather(1, target[:, None]).sum())
        nll_full += float(-logps["full"].gather(1, target[:, None]).sum())
        agree += int((logps["full"].argmax(-1) == logps["test"].argmax(-1)).sum())
        stored += caches["test"].stored_bytes()
        full_fp16 += 2 * 2 * cfg.num_hidden_layers * kv_heads * head_dim * (n - 1)
        if p.generate_tokens:
            prompt = ids[:, : p.context_len]
            gens = [model.generate(prompt, max_new_tokens=p.generate_tokens, min_new_tokens=p.generate_tokens,
                                   do_sample=False, past_key_values=c, pad_token_id=tok.pad_token_id)[0, p.context_len:]
                    for c in (DynamicCache(), make_cache())]
            gen_agree += int((gens[0] == gens[1]).sum())
            gen_total += p.generate_tokens
    tokens = len(windows) * p.continuation_len
    return {"kv_memory_fraction": stored / max(full_fp16, 1), "kl_to_full": kl / tokens,
            "perplexity": math.exp(nll / tokens), "perplexity_full_cache": math.exp(nll_full / tokens),
            "top1_agreement": agree / tokens, "greedy_agreement": gen_agree / max(gen_total, 1),
            "stored_bytes": stored, "windows": len(windows)}
