"""Block-format attention matmuls (BlockDialect's "full path", arXiv 2501.01144 Sec. 4): QKᵀ with Q and K blocked
along head_dim (after RoPE: the function sees what the module hands ``AttentionInterface``), and PV with P and V
blocked along the key axis, their reduction axes.

The function is registered with transformers' ``AttentionInterface`` as ``llmx_blockfp``; each attention module
carries its formats in a ``block_attn`` child (a stored layer, so a saved model reloads with them and switches its
attention implementation back). With no formats it computes eager attention (float32 softmax, the additive eager mask).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from llmx.core.quant import blockfp
from llmx.core.quant.blockfp import BlockFormat
from llmx.errors import UsageError

NAME = "llmx_blockfp"
CHILD = "block_attn"


class BlockAttention(torch.nn.Module):
    """The formats of one attention module's QKᵀ (``qk``) and PV (``pv``); no tensors."""

    LAYER = "block_attention"

    def __init__(self, qk: BlockFormat | None, pv: BlockFormat | None):
        super().__init__()
        self.qk, self.pv = qk, pv

    def llmx_spec(self) -> dict[str, Any]:
        return {"layer": self.LAYER, "qk": self.qk.spec() if self.qk else None, "pv": self.pv.spec() if self.pv else None}

    @classmethod
    def rebuild(cls, spec: dict[str, Any], state: dict[str, torch.Tensor], dtype: torch.dtype,
                config: Any = None) -> BlockAttention:
        return cls(*(BlockFormat.from_spec(spec[k]) if spec[k] else None for k in ("qk", "pv")))

    def llmx_after_load(self, model: torch.nn.Module) -> None:
        model.set_attn_implementation(NAME)

    def extra_repr(self) -> str:
        return ", ".join(f"{k} {f.describe()}" for k, f in (("qk", self.qk), ("pv", self.pv)) if f)


def block_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
                    **kwargs):
    unsupported = [k for k in ("softcap", "s_aux") if kwargs.get(k) is not None]
    if unsupported:
        raise NotImplementedError(f"block-format attention does not support {', '.join(unsupported)}")
    formats = getattr(module, CHILD, None)
    qk, pv = (formats.qk, formats.pv) if formats is not None else (None, None)
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    if qk is not None:
        query, key = blockfp.fake_quantize(query, qk), blockfp.fake_quantize(key, qk)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    scores = torch.matmul(query, key.transpose(2, 3)) * scale
    if attention_mask is not None:
        scores = scores + attention_mask[..., : key.shape[-2]]
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    probs = torch.nn.functional.dropout(probs, p=dropout, training=module.training)
    if pv is not None:
        probs, value = blockfp.fake_quantize(probs, pv), blockfp.fake_quantize(value, pv, dim=-2)
    out = torch.matmul(probs, value).transpose(1, 2).contiguous()
    return out, probs


AttentionInterface.register(NAME, block_attention)
AttentionMaskInterface.register(NAME, eager_mask)


def attention_modules(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The modules that call ``AttentionInterface`` (transformers' attention classes), by name."""
    return {name: m for name, m in model.named_modules()
            if type(m).__name__.endswith("Attention") and hasattr(m, "config") and hasattr(m, "layer_idx")}


def install(model: torch.nn.Module, qk: BlockFormat | None, pv: BlockFormat | None) -> int:
    """Give every attention module its formats and switch the model to the block-format attention; returns how many.
    A model without attention (Mamba), one whose attention does not go through ``AttentionInterface`` (Falcon, Bloom,
    GPT-J) or one with soft-capping or sinks is a usage error before anything changes."""
    name = type(model).__name__
    mods = attention_modules(model)
    if not any("Attention" in type(m).__name__ for m in model.modules()):
        raise UsageError(f"{name} has no attention layers: attn_qk / attn_pv need them (use targets: [\"linear\"])")
    if not mods or not getattr(model, "_supports_attention_backend", False):
        raise UsageError(f"{name}'s attention does not go through transformers' AttentionInterface, so its QK^T and "
                         "PV cannot be quantized here (use targets: [\"linear\"])")
    config = getattr(model.config, "get_text_config", lambda: model.config)()
    extras = [k for k in ("attn_logit_softcapping",) if getattr(config, k, None)]
    extras += ["attention sinks"] if any("sinks" in n for n, _ in model.named_parameters()) else []
    if extras:
        raise UsageError(f"{name} uses {', '.join(extras)}, which block-format attention does not implement")
    for m in mods.values():
        setattr(m, CHILD, BlockAttention(qk, pv))
    model.set_attn_implementation(NAME)
    if getattr(model.config, "_attn_implementation", None) != NAME:
        raise UsageError(f"{name} did not take the block-format attention implementation")
    return len(mods)
