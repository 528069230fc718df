"""RTN: every selected Linear replaced by a QuantLinear holding its round-to-nearest codes."""

from __future__ import annotations

import torch

from llmx.core.context import RunContext
from llmx.core.quant import apply
from llmx.core.quant.formats import quantize
from llmx.plugins.rtn.config import RTNParams


@torch.no_grad()
def run(ctx: RunContext, p: RTNParams) -> dict:
    model = ctx.model
    layers = apply.target_linears(model, p.skip)
    stats = {}
    if apply.needs_calibration(p):
        from llmx.core.quant.calibration import collect

        stats = collect(model, layers, apply.calibration(ctx, p), with_hessian=False, progress=ctx.progress)
    for name, linear in ctx.progress(list(layers.items()), description=f"RTN {p.bits}"):
        fmt = p.format(linear.in_features)
        codes, scale, zero = quantize(linear.weight, fmt)
        apply.install(model, name, linear, codes, scale, zero, fmt, p, stats[name].absmax if stats else None)
    return apply.finish(ctx, p, "rtn", {})
