"""Lexico stages: ``train`` learns the universal dictionaries; ``decode`` measures the compressed cache. KIVI is the
quantization baseline measured the same way."""

from __future__ import annotations

import torch

from llmx.core.context import RunContext
from llmx.errors import UsageError
from llmx.plugins.lexico import dictionary as dictionary_lib
from llmx.plugins.lexico import store
from llmx.plugins.lexico.cache import CompressedCache, KIVICodec, LexicoCodec, WindowCache
from llmx.plugins.lexico.config import KIVIParams, LexicoDecodeParams, LexicoTrainParams, WindowParams
from llmx.plugins.lexico.measure import measure


def _layers(model) -> int:
    if not hasattr(model.config, "num_key_value_heads") and not hasattr(model.config, "num_attention_heads"):
        raise UsageError("Lexico needs an attention model with a KV cache")
    return model.config.num_hidden_layers


def train(ctx: RunContext, p: LexicoTrainParams) -> dict:
    from llmx.core.data import random_windows

    model = ctx.model
    _layers(model)
    windows = random_windows(ctx.tokenizer, ctx.config.data.source, p.windows, p.seq_len, ctx.config.seed)
    kv = dictionary_lib.collect_kv(model, windows)
    dicts, out = [], {}
    with torch.inference_mode(False), torch.enable_grad():
        for i, (keys, values) in enumerate(ctx.progress(kv, description="layers")):
            pair = []
            for name, vectors in (("keys", keys), ("values", values)):
                d, losses = dictionary_lib.learn(vectors, p.atoms, p.sparsity, p.steps, p.lr, p.batch, ctx.config.seed)
                pair.append(d)
                out[f"layer{i}_{name}_rel_error"] = dictionary_lib.relative_error(d, vectors[:4096], p.sparsity)
            dicts.append(tuple(pair))
    path = store.save(ctx.artifact("dictionaries.safetensors"), dicts, model, p.sparsity)
    ctx.state["lexico_dictionary"] = str(path)
    return {"dictionary": str(path), "atoms": p.atoms, "sparsity": p.sparsity, "vectors_per_layer": len(kv[0][0]), **out}


def decode(ctx: RunContext, p: LexicoDecodeParams) -> dict:
    path = p.dictionary or ctx.state.get("lexico_dictionary")
    if path is None:
        raise UsageError("lexico decode needs --set dictionary=FILE (or a lexico train stage earlier in the run)")
    dicts, trained_s = store.load(path, ctx.model)
    s = p.sparsity or trained_s

    def make():
        return CompressedCache(lambda i: LexicoCodec(*dicts[i], s, p.fp8), len(dicts), p.buffer_length, p.chunk)

    return {"method": f"lexico s={s}", "sparsity": s, **measure(ctx, p, make)}


def kivi(ctx: RunContext, p: KIVIParams) -> dict:
    layers = _layers(ctx.model)

    def make():
        return CompressedCache(lambda i: KIVICodec(p.bits, p.group), layers, p.buffer_length, max(p.chunk, p.group))

    return {"method": f"kivi {p.bits}-bit", **measure(ctx, p, make)}


def window(ctx: RunContext, p: WindowParams) -> dict:
    layers = _layers(ctx.model)
    return {"method": f"window {p.window}+{p.sinks}", **measure(ctx, p, lambda: WindowCache(layers, p.window, p.sinks))}
