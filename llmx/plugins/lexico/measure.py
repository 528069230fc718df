"""Quality, memory and speed of a compressed KV cache against the full cache, on held-out text.

Per window (the full cache and the cache under test interleaved, so both see the same machine state):
- teacher forcing: prefill ``context_len`` tokens, decode ``continuation_len`` tokens one at a time; KL(full ||
  compressed) of the next-token distributions, top-1 agreement with the full cache, next-token accuracy against the
  text itself, perplexity, and wall milliseconds per decode step beside the full cache's on the same window (each
  window's, and the run's ratio ``ms_per_step_vs_full_cache``: every arm against its own full-cache time);
- recall: the context's tail replaced by a copy of its first ``recall_cue`` tokens, so the right continuation is the
  text that followed them at the start (now in the compressed part): greedy accuracy of ``recall_tokens`` tokens;
- greedy agreement of ``generate_tokens`` tokens with the full cache's generation.
Memory: the bytes the cache stores after the last step, what its codecs keep between calls (dictionaries, counted
once per sequence and amortised over ``amortize_batch`` sequences: ``*_with_dictionaries``, ``*_amortised``), and
the measured peak during decoding (stored bytes after the prefill plus the most allocated above them over the decode
steps, transient rebuilds, gathers, dequantized blocks and encoding workspaces included), each over the bytes of a
full fp16 cache of the same length; and the most allocated during the prefill, with this cache and with the full
one (activations included: their difference is what compressing the prompt costs or saves, Lexico's per-call Gram
on CUDA included).
Each window's figures go to ``windows.jsonl`` (the items ``llmx compare`` pairs across arms; ``item``: the digest of
the window's start, ``context_len`` and token ids): their mean over the windows is the run's ``kl_to_full``,
``top1_agreement`` and ``next_token_accuracy`` (every window has ``continuation_len`` tokens).
"""

from __future__ import annotations

import math
import time

import torch
from transformers import DynamicCache

from llmx.core import atomic
from llmx.core.context import RunContext
from llmx.core.data import token_stream
from llmx.core.eval.items import FIELD, item_id
from llmx.core.memory import PeakMemory


def _teacher_forced(model, ids, context_len: int, cache) -> tuple[torch.Tensor, float]:
    out = model(input_ids=ids[:, :context_len], past_key_values=cache, use_cache=True)
    steps = [out.logits[:, -1]]
    t0 = time.perf_counter()
    for t in range(context_len, ids.shape[1] - 1):
        steps.append(model(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits[:, -1])
    if ids.device.type == "cuda":
        torch.cuda.synchronize(ids.device)
    ms = (time.perf_counter() - t0) * 1e3 / max(ids.shape[1] - 1 - context_len, 1)
    return torch.log_softmax(torch.cat(steps).float(), -1), ms


def decode_peak(model, ids, context_len: int, cache) -> tuple[int, int]:
    """(bytes the cache stores after prefilling ``context_len`` tokens, the most allocated above that while the rest
    of ``ids`` but its last token is decoded one token at a time)."""
    with PeakMemory(ids.device) as pm:
        model(input_ids=ids[:, :context_len], past_key_values=cache, use_cache=True)
        stored = cache_bytes(cache)
        with pm.section():
            for t in range(context_len, ids.shape[1] - 1):
                model(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True)
    return stored, pm.peak_bytes


def prefill_peak(model, ids, context_len: int, cache) -> int:
    """The most allocated above the level before it while ``context_len`` tokens of ``ids`` are prefilled into
    ``cache``."""
    with PeakMemory(ids.device) as pm, pm.section():
        model(input_ids=ids[:, :context_len], past_key_values=cache, use_cache=True)
    return pm.peak_bytes


def cache_bytes(cache) -> int:
    """Bytes a cache stores: its own account, or every key and value tensor of a dense cache."""
    if hasattr(cache, "stored_bytes"):
        return cache.stored_bytes()
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))


def _greedy(model, prompt, tokens: int, cache, pad: int) -> torch.Tensor:
    return model.generate(prompt, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                          past_key_values=cache, pad_token_id=pad)[0, prompt.shape[1]:]


@torch.no_grad()
def measure(ctx: RunContext, p, make_cache) -> dict:
    model, tok = ctx.model, ctx.tokenizer
    device = next(model.parameters()).device
    n = p.context_len + p.continuation_len
    stream = token_stream(tok, ctx.config.data.source, "validation", p.windows * n, ctx.config.data.splitting)
    windows = stream[: (len(stream) // n) * n].reshape(-1, n)[: p.windows].to(device)
    cfg = model.config
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    fp16_per_token = 2 * 2 * cfg.num_hidden_layers * kv_heads * head_dim
    sums = dict.fromkeys(("kl", "nll", "nll_full", "agree", "hit", "hit_full", "gen", "recall", "recall_full", "ms",
                          "ms_full"), 0.0)
    stored = dictionary = 0
    items: list[dict] = []
    for w in ctx.progress(list(windows), description="kv cache"):
        ids = w[None]
        logp_full, ms_full = _teacher_forced(model, ids, p.context_len, DynamicCache())
        cache = make_cache()
        logp, ms = _teacher_forced(model, ids, p.context_len, cache)
        target = ids[0, p.context_len:]
        row = {"kl": float((logp_full.exp() * (logp_full - logp)).sum(-1).sum()),
               "nll": float(-logp.gather(1, target[:, None]).sum()),
               "nll_full": float(-logp_full.gather(1, target[:, None]).sum()),
               "agree": int((logp_full.argmax(-1) == logp.argmax(-1)).sum()),
               "hit": int((logp.argmax(-1) == target).sum()), "hit_full": int((logp_full.argmax(-1) == target).sum())}
        for key, value in row.items():
            sums[key] += value
        steps = len(target)
        items.append({FIELD: item_id(len(items) * n, p.context_len, w.tolist()), "window": len(items),
                      "kl_to_full": row["kl"] / steps, "nll": row["nll"] / steps,
                      "nll_full_cache": row["nll_full"] / steps, "top1_agreement": row["agree"] / steps,
                      "next_token_accuracy": row["hit"] / steps, "tokens": steps, "ms_per_step": ms,
                      "ms_per_step_full_cache": ms_full})
        sums["ms"] += ms
        sums["ms_full"] += ms_full
        stored += cache.stored_bytes()
        dictionary = cache.dictionary_bytes()
        if p.generate_tokens:
            prompt = ids[:, : p.context_len]
            full, test = (_greedy(model, prompt, p.generate_tokens, c, tok.pad_token_id)
                          for c in (DynamicCache(), make_cache()))
            same = int((full == test).sum())
            sums["gen"] += same
            items[-1]["greedy_agreement"] = same / p.generate_tokens
        if p.recall_tokens:
            cue = p.recall_cue
            prompt = torch.cat([ids[:, : p.context_len - cue], ids[:, :cue]], 1)
            expected = ids[0, cue:cue + p.recall_tokens]
            for key, item, c in (("recall_full", "recall_accuracy_full_cache", DynamicCache()),
                                 ("recall", "recall_accuracy", make_cache())):
                hits = int((_greedy(model, prompt, p.recall_tokens, c, tok.pad_token_id) == expected).sum())
                sums[key] += hits
                items[-1][item] = hits / p.recall_tokens
    atomic.write_jsonl(ctx.artifact("windows.jsonl"), items)
    first = windows[:1]
    peak, peak_full = (sum(decode_peak(model, first, p.context_len, c)) for c in (make_cache(), DynamicCache()))
    prefill, prefill_full = (prefill_peak(model, first, p.context_len, c) for c in (make_cache(), DynamicCache()))
    count, tokens = len(windows), len(windows) * p.continuation_len
    full_fp16 = fp16_per_token * (n - 1)
    per_seq = stored / count
    return {"split": "validation", "kv_memory_fraction": per_seq / full_fp16,
            "kv_memory_fraction_with_dictionaries": (per_seq + dictionary) / full_fp16,
            "kv_memory_fraction_amortised": (per_seq + dictionary / p.amortize_batch) / full_fp16,
            "kv_peak_fraction": peak / full_fp16,
            "kv_peak_fraction_with_dictionaries": (peak + dictionary) / full_fp16,
            "kv_peak_fraction_amortised": (peak + dictionary / p.amortize_batch) / full_fp16,
            "kv_peak_fraction_full_cache": peak_full / full_fp16,
            "stored_bytes": per_seq, "dictionary_bytes": dictionary, "peak_bytes": peak,
            "peak_bytes_full_cache": peak_full, "prefill_peak_bytes": prefill, "prefill_peak_bytes_full_cache":
            prefill_full, "full_fp16_bytes": full_fp16,
            "kl_to_full": sums["kl"] / tokens, "perplexity": math.exp(sums["nll"] / tokens),
            "perplexity_full_cache": math.exp(sums["nll_full"] / tokens), "top1_agreement": sums["agree"] / tokens,
            "next_token_accuracy": sums["hit"] / tokens, "next_token_accuracy_full_cache": sums["hit_full"] / tokens,
            "greedy_agreement": sums["gen"] / max(count * p.generate_tokens, 1),
            "recall_accuracy": sums["recall"] / max(count * p.recall_tokens, 1),
            "recall_accuracy_full_cache": sums["recall_full"] / max(count * p.recall_tokens, 1),
            "ms_per_step": sums["ms"] / count, "ms_per_step_full_cache": sums["ms_full"] / count,
            "ms_per_step_vs_full_cache": sums["ms"] / sums["ms_full"], "amortize_batch": p.amortize_batch,
            "windows": count, "context_len": p.context_len}
