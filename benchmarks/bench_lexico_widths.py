"""Lexico's memory and decode speed at real widths: a Llama with hidden 2048, 16 heads over 8 KV heads (head_dim
128), attention biases, in bfloat16, random weights (memory and time do not depend on them; quality is not
measured here, see bench_lexico.py), at a 2048-token context.

    python benchmarks/bench_lexico_widths.py [--layers 4] [--context 1984]

Lexico uses random unit-norm dictionaries of 4096 atoms (the official size at head_dim 128) at s = 8 and 16, with the
official 128-token buffer and 32-token compression chunks, attending over the codes; KIVI-2 and KIVI-4 (32-token
key groups, 32-channel value groups) share the buffer. Per row: stored bytes, dictionaries (per sequence and over a
batch of 8), the measured peak over 32 decode steps (stored bytes after the prefill plus the most allocated above
them), each over the full bf16 cache's stored bytes; and milliseconds per decode step, interleaved with the full
cache's. Writes benchmarks/results/lexico_widths.json and .md.

Stays a script: memory and step time of caches on random weights at real widths (no quality, no held-out items to
pair); ``llmx compare lexico`` covers quality at matched memory.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import publish  # noqa: E402


def decode(model, ids, context: int, cache) -> float:
    """Milliseconds per decode step after the prefill (every token of ``ids`` but the last, as ``decode_peak``)."""
    with torch.no_grad():
        model(input_ids=ids[:, :context], past_key_values=cache)
        t0 = time.perf_counter()
        for t in range(context, ids.shape[1] - 1):
            model(input_ids=ids[:, t:t + 1], past_key_values=cache)
        return (time.perf_counter() - t0) * 1e3 / (ids.shape[1] - 1 - context)


def makers(layers: int, dicts) -> dict:
    """A fresh cache per call, for every method of the table."""
    from llmx.plugins.lexico.cache import CompressedCache
    from llmx.plugins.lexico.codecs import KIVICodec, LexicoCodec

    out = {f"kivi {b}-bit": (lambda b=b: CompressedCache(lambda i: KIVICodec(b, 32), layers, 128, 32,
                                                         attention="codes")) for b in (2, 4)}
    for s in (8, 16):
        out[f"lexico s={s}"] = (lambda s=s: CompressedCache(lambda i: LexicoCodec(*dicts[i], s), layers, 128, 32,
                                                            attention="codes"))
    return out


def main() -> None:
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

    from llmx.plugins.lexico.attention import over_codes
    from llmx.plugins.lexico.measure import cache_bytes, decode_peak

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[4])
    ap.add_argument("--context", type=int, default=1984)
    ap.add_argument("--steps", type=int, default=32)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rows = []
    for layers in args.layers:
        config = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_attention_heads=16, num_key_value_heads=8,
                             num_hidden_layers=layers, vocab_size=2048, attention_bias=True,
                             max_position_embeddings=4096)
        model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
        ids = torch.randint(0, 2048, (1, args.context + args.steps + 1))  # + 1: decode ``steps`` tokens
        gen = torch.Generator().manual_seed(0)
        dicts = [[torch.nn.functional.normalize(torch.randn(128, 4096, generator=gen), dim=0).bfloat16()
                  for _ in range(2)] for _ in range(layers)]
        full_bytes = 2 * 2 * layers * 8 * 128 * (args.context + args.steps)
        methods = makers(layers, dicts)
        for name, make in methods.items():
            scope = over_codes(model) if name.startswith("lexico") else contextlib.nullcontext()
            with scope:
                ms_full, ms = decode(model, ids, args.context, DynamicCache()), decode(model, ids, args.context, make())
                cache = make()
                with torch.no_grad():
                    stored, above = decode_peak(model, ids, args.context, cache)
                    full_stored, above_full = decode_peak(model, ids, args.context, DynamicCache())
            dictionary = cache.dictionary_bytes()
            rows.append({"layers": layers, "method": name, "stored": round(cache_bytes(cache) / full_bytes, 4),
                         "with_dictionaries": round((cache_bytes(cache) + dictionary) / full_bytes, 4),
                         "dictionaries_over_batch_8": round((cache_bytes(cache) + dictionary / 8) / full_bytes, 4),
                         "peak": round((stored + above) / full_bytes, 4),
                         "peak_full_cache": round((full_stored + above_full) / full_bytes, 4),
                         "ms_per_step": round(ms, 2), "ms_per_step_full_cache": round(ms_full, 2),
                         "step_time_ratio": round(ms / ms_full, 2)})
            print(rows[-1], flush=True)
    publish("lexico_widths", rows, context=args.context, steps=args.steps, full_cache_bytes="bf16 K and V of every "
            "layer at context + steps tokens")


if __name__ == "__main__":
    main()
