"""Put a model in block formats: every selected Linear becomes a BlockQuantLinear, and the attention matmuls take
block-format operands. ``quantize_blocks_`` is the Python API (in place, as torchao's ``quantize_``); the
``mxfp4`` / ``nvfp4`` / ``int4-block`` / ``blockdialect`` methods call it."""

from __future__ import annotations

from typing import Any

import torch

from llmx.core.models.linear import linear_layers, replace_module
from llmx.core.quant import blockattn
from llmx.core.quant.blockfp import BlockFormat
from llmx.core.quant.blocklinear import BlockQuantLinear
from llmx.core.quant.params import BLOCK_TARGETS


@torch.no_grad()
def quantize_blocks_(model: torch.nn.Module, weight_format: BlockFormat, act_format: BlockFormat | None,
                     targets: tuple[str, ...] = ("linear",), skip: tuple[str, ...] = ("lm_head",),
                     progress: Any = None) -> dict[str, Any]:
    """Quantize ``model`` in place. ``act_format`` None leaves activations in float (W4A16; no attention targets).
    Returns counts and the stored bits per element of the quantized linears."""
    unknown = set(targets) - set(BLOCK_TARGETS)
    if unknown:
        raise ValueError(f"unknown targets {sorted(unknown)}; valid: {', '.join(BLOCK_TARGETS)}")
    attn = [t for t in targets if t != "linear"]
    if attn and act_format is None:
        raise ValueError("attention targets quantize activations: give an act_format")
    heads = blockattn.install(model, act_format if "attn_qk" in attn else None,
                              act_format if "attn_pv" in attn else None) if attn else 0
    layers = linear_layers(model, list(skip)) if "linear" in targets else {}
    items = list(layers.items())
    for name, linear in progress(items, description=f"{weight_format.name} weights") if progress else items:
        replace_module(model, name, BlockQuantLinear.from_linear(linear, weight_format, act_format))
    return {"layers": len(layers), "attention_layers": heads, **stored_bits(model)}


def stored_bits(model: torch.nn.Module) -> dict[str, Any]:
    """Weight bits per element as stored (every buffer of the block linears except the bias, over their weights) and
    the share of the model's weights they hold (embeddings, lm_head, norms and fused 3-D experts stay in float)."""
    qlayers = [m for m in model.modules() if isinstance(m, BlockQuantLinear)]
    params = sum(m.in_features * m.out_features for m in qlayers)
    packed = sum(t.numel() * t.element_size() for m in qlayers for k, t in m.state_dict().items() if k != "bias")
    left = sum(p.numel() for p in model.parameters())
    return {"quantized_params": params, "quantized_bytes": packed, "quantized_share": params / max(params + left, 1),
            "weight_bits_per_element": 8 * packed / params if params else None}


def run(ctx, p, method: str, weight_format: BlockFormat, act_format: BlockFormat) -> dict[str, Any]:
    """A method's stage: quantize ``ctx.model`` per ``p`` (``BlockQuantParams``), then save it when asked."""
    from llmx.core.quant import apply

    act = act_format if p.bitspec.act < 16 else None
    targets = p.resolved_targets
    stats = quantize_blocks_(ctx.model, weight_format, act, targets, tuple(p.skip), ctx.progress)
    out = {"bits": p.bits, "targets": list(targets), "weight_format": weight_format.describe(),
           "act_format": act.describe() if act else None, "format_bits_per_element": weight_format.bits, **stats}
    return {**out, **apply.save(ctx, p, method)} if p.save else out
