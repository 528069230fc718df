"""Attention modules whose Q-K and V-O head widths may differ from the model's head_dim (structured CLOVER pruning).

The attention scale stays ``1 / sqrt(original head_dim)``: pruning must not change the softmax temperature (the
official GPT code rescales by the pruned width; the invariance argument of the paper says not to).
Supported: Llama-family attention (RoPE, GQA; only V-O may shrink) and OPT attention (learned positions, biases).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaAttention, apply_rotary_pos_emb, eager_attention_forward
from transformers.models.opt.modeling_opt import OPTAttention

KINDS = {LlamaAttention: "llama", OPTAttention: "opt"}


def kind_of(module: torch.nn.Module) -> str | None:
    for cls, kind in KINDS.items():
        if isinstance(module, cls):
            return kind
    return None


def attention_layers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    return [(n, m) for n, m in model.named_modules() if kind_of(m)]


def projections(m: torch.nn.Module) -> tuple[torch.nn.Linear, torch.nn.Linear, torch.nn.Linear, torch.nn.Linear]:
    return m.q_proj, m.k_proj, m.v_proj, (m.o_proj if hasattr(m, "o_proj") else m.out_proj)


def head_counts(m: torch.nn.Module) -> tuple[int, int]:
    cfg = m.config
    heads = cfg.num_attention_heads
    return heads, getattr(cfg, "num_key_value_heads", heads) or heads


def _attend(module, q, k, v, attention_mask, scaling, dropout, kwargs):
    interface = ALL_ATTENTION_FUNCTIONS.get_interface(module.config._attn_implementation, eager_attention_forward)
    return interface(module, q, k, v, attention_mask, dropout=dropout, scaling=scaling, **kwargs)


class _Pruned:
    """Mixin: widths of the Q-K and V-O head spaces, and how llmx stores / rebuilds the module."""

    qk_dim: int
    vo_dim: int

    def llmx_spec(self) -> dict[str, Any]:
        return {"layer": "clover_attention", "kind": kind_of(self), "layer_idx": self.layer_idx,
                "qk_dim": self.qk_dim, "vo_dim": self.vo_dim}

    def resize(self, qk_dim: int, vo_dim: int) -> None:
        heads, kv = head_counts(self)
        q, k, v, o = projections(self)
        hidden = q.in_features
        for name, out_features in (("q_proj", heads * qk_dim), ("k_proj", kv * qk_dim), ("v_proj", kv * vo_dim)):
            old = getattr(self, name)
            setattr(self, name, torch.nn.Linear(hidden, out_features, bias=old.bias is not None,
                                                dtype=old.weight.dtype, device=old.weight.device))
        out_name = "o_proj" if hasattr(self, "o_proj") else "out_proj"
        setattr(self, out_name, torch.nn.Linear(heads * vo_dim, hidden, bias=o.bias is not None, dtype=o.weight.dtype,
                                                device=o.weight.device))
        self.qk_dim, self.vo_dim = qk_dim, vo_dim


class CloverLlamaAttention(_Pruned, LlamaAttention):
    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, past_key_values=None, **kwargs):
        shape = hidden_states.shape[:-1]
        q = self.q_proj(hidden_states).view(*shape, -1, self.qk_dim).transpose(1, 2)
        k = self.k_proj(hidden_states).view(*shape, -1, self.qk_dim).transpose(1, 2)
        v = self.v_proj(hidden_states).view(*shape, -1, self.vo_dim).transpose(1, 2)
        cos, sin = position_embeddings
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)
        out, weights = _attend(self, q, k, v, attention_mask, self.scaling,
                               0.0 if not self.training else self.attention_dropout, kwargs)
        return self.o_proj(out.reshape(*shape, -1).contiguous()), weights


class CloverOPTAttention(_Pruned, OPTAttention):
    def forward(self, hidden_states, past_key_values=None, attention_mask=None, output_attentions=False, **kwargs):
        bsz, tgt, _ = hidden_states.size()
        q = (self.q_proj(hidden_states) * self.scaling).view(bsz, -1, self.num_heads, self.qk_dim).transpose(1, 2)
        k = self.k_proj(hidden_states).view(bsz, -1, self.num_heads, self.qk_dim).transpose(1, 2)
        v = self.v_proj(hidden_states).view(bsz, -1, self.num_heads, self.vo_dim).transpose(1, 2)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)
        out, weights = _attend(self, q, k, v, attention_mask, 1.0, 0.0 if not self.training else self.dropout, kwargs)
        return self.out_proj(out.reshape(bsz, tgt, -1).contiguous()), weights


CLASSES = {"llama": CloverLlamaAttention, "opt": CloverOPTAttention}


def convert(module: torch.nn.Module) -> _Pruned:
    """Re-class an HF attention module in place (weights untouched) so its widths can change."""
    if isinstance(module, _Pruned):
        return module
    module.__class__ = CLASSES[kind_of(module)]
    module.qk_dim = module.vo_dim = module.head_dim
    return module


def rebuild(spec: dict[str, Any], state: dict[str, torch.Tensor], dtype: torch.dtype, config: Any) -> torch.nn.Module:
    """The storage builder: a module of the saved widths, then its tensors."""
    cls = CLASSES[spec["kind"]]
    module = cls(config, layer_idx=spec["layer_idx"]).to(dtype)
    module.qk_dim = module.vo_dim = module.head_dim
    module.resize(spec["qk_dim"], spec["vo_dim"])
    module.load_state_dict(state, strict=True)
    return module
