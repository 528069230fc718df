"""RTN: every linear weight replaced by its round-to-nearest quantized value (simulated in float)."""

from __future__ import annotations

import torch

from llmx.core import models
from llmx.core.context import RunContext
from llmx.core.quant.bits import parse_bits
from llmx.core.quant.rtn import IntFormat, fake_quantize
from llmx.plugins.rtn.config import BITS, RTNParams


def quantizable_linears(model: torch.nn.Module, skip: list[str]) -> list[tuple[str, torch.nn.Linear]]:
    return [(n, m) for n, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and not any(s in n for s in skip)]


@torch.no_grad()
def run(ctx: RunContext, p: RTNParams) -> dict:
    bits = parse_bits(p.bits, BITS)
    layers = quantizable_linears(ctx.model, p.skip)
    n_params, err_sum = 0, 0.0
    for _, layer in ctx.progress(layers, description=f"RTN {bits}"):
        w = layer.weight
        group = None if p.group_size == -1 else min(p.group_size, w.shape[1])
        q = fake_quantize(w, IntFormat(bits.weight, group, p.symmetric))
        err_sum += float((q.float() - w.float()).norm() / w.float().norm().clamp(min=1e-12))
        w.copy_(q)
        n_params += w.numel()
    if p.save:
        models.save(ctx.model, ctx.tokenizer, ctx.artifact("model"),
                    {"source": ctx.config.model, "method": "rtn", "params": p.model_dump()})
    return {"bits": str(bits), "layers": len(layers), "quantized_params": n_params,
            "mean_rel_weight_error": err_sum / max(len(layers), 1)}
