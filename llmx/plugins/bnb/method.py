"""bitsandbytes as a quantization backend: swap each selected Linear for Linear4bit (NF4/FP4) or Linear8bitLt."""

from __future__ import annotations

import torch

from llmx.core.context import RunContext
from llmx.core.models.linear import replace_module
from llmx.core.quant.apply import target_linears
from llmx.plugins.bnb.config import BnbParams
from llmx.plugins.bnb.layers import linear4bit, linear8bit


@torch.no_grad()
def run(ctx: RunContext, p: BnbParams) -> dict:
    from llmx.core import models
    from llmx.core.models.storage import weight_file_bytes

    model = ctx.model
    layers = target_linears(model, p.skip)
    params = packed = 0
    for name, linear in ctx.progress(list(layers.items()), description=f"bitsandbytes {p.bits}"):
        new = linear4bit(linear, p.quant_type, p.blocksize, p.double_quant) if p.bits == "w4a16" else \
            linear8bit(linear, p.threshold)
        replace_module(model, name, new)
        params += linear.in_features * linear.out_features
        packed += sum(t.numel() * t.element_size() for t in new.state_dict().values()) - \
            (linear.bias.numel() * linear.bias.element_size() if linear.bias is not None else 0)
    out = {"bits": p.bits, "format": p.quant_type if p.bits == "w4a16" else "llm.int8", "layers": len(layers),
           "quantized_params": params, "quantized_bytes": packed, "quantized_bytes_vs_fp16": packed / max(2 * params, 1),
           "weight_bits_per_element": 8 * packed / params if params else None}
    if p.save:
        path = models.save(model, ctx.tokenizer, ctx.artifact("model"),
                           {"source": ctx.config.model, "method": "bnb", "params": p.model_dump()})
        out.update(model_dir=str(path), stored_weight_bytes=weight_file_bytes(path))
    return out
