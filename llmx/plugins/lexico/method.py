"""Lexico stages: ``train`` learns the universal dictionaries; ``decode`` measures the compressed cache. KIVI and token
eviction are the baselines measured the same way."""

from __future__ import annotations

import torch

from llmx.core.context import RunContext
from llmx.errors import UsageError
from llmx.plugins.lexico import dictionary as dictionary_lib
from llmx.plugins.lexico import store
from llmx.plugins.lexico.cache import CompressedCache, WindowCache
from llmx.plugins.lexico.codecs import KIVICodec, LexicoCodec
from llmx.plugins.lexico.config import CompressedParams, KIVIParams, LexicoDecodeParams, LexicoTrainParams, WindowParams
from llmx.plugins.lexico.measure import measure


def _layers(model) -> int:
    if not hasattr(model.config, "num_key_value_heads") and not hasattr(model.config, "num_attention_heads"):
        raise UsageError("Lexico needs an attention model with a KV cache")
    return model.config.num_hidden_layers


def _held_out_errors(ctx: RunContext, p: LexicoTrainParams, dicts, source: str, prefix: str) -> dict:
    from llmx.core.data import random_windows

    windows = random_windows(ctx.tokenizer, source, p.held_out_windows, p.seq_len, ctx.config.seed + 1,
                             split="validation", splitting=ctx.config.data.splitting)
    out = {}
    for i, (keys, values) in enumerate(dictionary_lib.collect_kv(ctx.model, windows)):
        for name, d, vectors in (("keys", dicts[i][0], keys), ("values", dicts[i][1], values)):
            out[f"{prefix}layer{i}_{name}_rel_error"] = dictionary_lib.relative_error(d, vectors, p.sparsity)
    return out


def train(ctx: RunContext, p: LexicoTrainParams) -> dict:
    from llmx.core.data import random_windows

    model = ctx.model
    _layers(model)
    windows = random_windows(ctx.tokenizer, ctx.config.data.source, p.windows, p.seq_len, ctx.config.seed,
                             splitting=ctx.config.data.splitting)
    kv = dictionary_lib.collect_kv(model, windows)
    dicts = []
    with torch.inference_mode(False), torch.enable_grad():
        for keys, values in ctx.progress(kv, description="layers"):
            dicts.append(tuple(dictionary_lib.learn(v, p.atoms, p.sparsity, p.steps, p.lr, p.batch, ctx.config.seed)[0]
                               for v in (keys, values)))
    out = _held_out_errors(ctx, p, dicts, ctx.config.data.source, "")
    if p.transfer_data:
        out.update(_held_out_errors(ctx, p, dicts, p.transfer_data, "transfer_"))
    path = store.save(ctx.artifact("dictionaries.safetensors"), [tuple(d.cpu() for d in pair) for pair in dicts],
                      model, p.sparsity)
    ctx.state["lexico_dictionary"] = str(path)
    return {"dictionary": str(path), "atoms": p.atoms, "sparsity": p.sparsity, "vectors_per_layer": len(kv[0][0]), **out}


def _measured(ctx: RunContext, p: CompressedParams, make) -> dict:
    """``measure`` under the codes-reading attention when the cache attends over codes."""
    if p.attention == "dense":
        return measure(ctx, p, make)
    from llmx.plugins.lexico.attention import over_codes

    with over_codes(ctx.model):
        return measure(ctx, p, make)


def decode(ctx: RunContext, p: LexicoDecodeParams) -> dict:
    path = p.dictionary or ctx.state.get("lexico_dictionary")
    if path is None:
        raise UsageError("lexico decode needs --set dictionary=FILE (or a lexico train stage earlier in the run)")
    loaded, trained_s = store.load(path, ctx.model)
    weight = next(ctx.model.parameters())
    dicts = [tuple(d.to(device=weight.device, dtype=weight.dtype) for d in pair) for pair in loaded]  # as computed
    sk, sv = p.sparsity or trained_s, p.value_sparsity or p.sparsity or trained_s

    def make():
        return CompressedCache(lambda i: LexicoCodec(*dicts[i], sk, sv, p.fp8, p.tol), len(dicts), p.buffer_length,
                               p.chunk, attention=p.attention, buffer=p.buffer)

    name = f"lexico s={sk}" if sk == sv else f"lexico s={sk}/{sv}"
    return {"method": name, "sparsity": sk, "value_sparsity": sv, "attention": p.attention, "buffer_rule": p.buffer,
            **_measured(ctx, p, make)}


def kivi(ctx: RunContext, p: KIVIParams) -> dict:
    layers = _layers(ctx.model)

    def make():
        return CompressedCache(lambda i: KIVICodec(p.bits, p.group), layers, p.buffer_length, p.chunk,
                               attention=p.attention, buffer=p.buffer)

    return {"method": f"kivi {p.bits}-bit", "attention": p.attention, "buffer_rule": p.buffer, **_measured(ctx, p, make)}


def window(ctx: RunContext, p: WindowParams) -> dict:
    layers = _layers(ctx.model)
    return {"method": f"window {p.window}+{p.sinks}", **measure(ctx, p, lambda: WindowCache(layers, p.window, p.sinks))}
