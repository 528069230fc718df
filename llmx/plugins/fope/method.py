"""``train --method fope``: the ``lm`` stage on a Llama-family model whose attention's position step is FoPE, RoPE
(transformers' own) or ALiBi, so every variant trains through one code path and one data order."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import torch

from llmx.core.context import RunContext
from llmx.core.train.lm.run import run as lm
from llmx.errors import UsageError
from llmx.plugins.fope import attention
from llmx.plugins.fope.config import FopeParams

STATE_KEY = "train_len"  # read by eval --method length in the same run


def rope_theta(config: Any) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    return float(params.get("rope_theta") or getattr(config, "rope_theta", None) or 10_000.0)


def settings(model: torch.nn.Module, p: FopeParams) -> attention.Settings:
    return attention.Settings(strategy=p.position, train_len=p.train_len, theta=p.theta or rope_theta(model.config),
                              floor_clip=p.floor_clip, ignore_zero=p.ignore_zero, fourier_dim=p.fourier_dim,
                              sigma=p.sigma, learnable=p.learnable)


def convert(model: torch.nn.Module, p: FopeParams, seed: int, source: str) -> torch.nn.Module:
    """The model to train: converted from RoPE (a fresh init, or ``continue`` from a RoPE model), or a converted
    model continued with the same strategy (FoPE at a longer ``train_len`` grows its coefficients)."""
    layers = attention.attentions(model, source)
    have = {m.settings.strategy for m in layers if isinstance(m, attention.PositionAttention)}
    if have and have != {p.position}:
        raise UsageError(f"fope: '{source}' already uses position {have.pop()}; it cannot continue as {p.position} "
                         "(start from scratch: init: scratch)")
    if p.position == "rope":
        return model
    if have:
        stored, wanted = asdict(layers[0].settings), asdict(settings(model, p))
        changed = [k for k in stored if k != "train_len" and stored[k] != wanted[k]]
        if changed:
            what = ", ".join(f"{k} {stored[k]} (asked {wanted[k]})" for k in changed)
            raise UsageError(f"fope: '{source}' was trained with {what}; a continued run keeps them (set them to "
                             "match, or init: scratch)")
        if p.position == "fope":
            generator = torch.Generator().manual_seed(seed)
            for m in layers:
                attention.expand(m, p.train_len, generator)
        return model
    attention.convert(model, settings(model, p), seed, source)
    return model


def train(ctx: RunContext, p: FopeParams) -> dict[str, Any]:
    source = str(ctx.config.model)
    out = lm(ctx, p, method="fope", convert=lambda m: convert(m, p, ctx.config.seed, source))
    ctx.state[STATE_KEY] = p.train_len
    out.update(position=p.position, train_len=p.train_len)
    layers = [m for m in ctx.model.modules() if isinstance(m, attention.PositionAttention)]
    if p.position == "fope" and layers:
        first = layers[0]
        out.update(frequencies_kept=int(first.fope_freqs.numel()), fourier_dims=int(first.fope_sin.shape[-1]),
                   coefficient_params=sum(m.fope_sin.numel() + m.fope_cos.numel() for m in layers),
                   settings=asdict(first.settings))
    return out
