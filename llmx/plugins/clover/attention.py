"""Attention layouts CLOVER works on, recognised by their projections, and the modules whose Q-K and V-O head widths
may differ from the model's head_dim (structured CLOVER pruning).

Layouts:
- ``separate``: ``q_proj``, ``k_proj``, ``v_proj`` and ``o_proj`` (or OPT's ``out_proj``) ``nn.Linear``, with or
  without biases, GQA. RoPE sits between Q and K when the module's forward takes ``position_embeddings`` (Llama,
  Qwen2, Mistral, Mixtral); otherwise positions are learned (OPT).
- ``fused``: GPT-2's ``c_attn`` / ``c_proj`` (``Conv1D``, weights stored ``(in, out)``): converted into separate
  ``nn.Linear`` projections holding the same numbers.

Refused with a one-line reason: fused QKV projections of other families (Phi-3, Falcon, GPT-NeoX), per-head query /
key norms (Qwen3, OLMo-2, StableLM), rotary embeddings applied to part of a head inside the forward (StableLM, Phi),
clipped activations (OLMo's clip_qkv), attention logit soft-capping (Gemma 2), attention sinks, BART-style attention
and encoder-decoder models. After conversion the model's logits on a probe must match the
original; an attention whose forward this module does not reproduce is refused rather than silently changed.

The attention scale stays ``1 / sqrt(original head_dim)``: pruning must not change the softmax temperature (the
official GPT code rescales by the pruned width; the invariance argument of the paper says not to).
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, eager_attention_forward
from transformers.pytorch_utils import Conv1D

from llmx.core.models.storage import transformers_class
from llmx.errors import UsageError

FUSED_QKV = ("qkv_proj", "query_key_value", "Wqkv", "W_pack", "qkv")


def layout_of(m: torch.nn.Module) -> str | None:
    """``separate``, ``fused`` (GPT-2) or None (not an attention CLOVER recognises)."""
    linear = torch.nn.Linear
    if all(isinstance(getattr(m, n, None), linear) for n in ("q_proj", "k_proj", "v_proj")) and (
            isinstance(getattr(m, "o_proj", None), linear) or isinstance(getattr(m, "out_proj", None), linear)):
        return "separate"
    if isinstance(getattr(m, "c_attn", None), Conv1D) and isinstance(getattr(m, "c_proj", None), Conv1D) \
            and hasattr(m, "split_size"):
        return "fused"
    return None


def _refusal(m: torch.nn.Module) -> str | None:
    """Why an attention-like module cannot be handled, or None when it can."""
    name, cfg = type(m).__name__, getattr(m, "config", None)
    if getattr(m, "is_cross_attention", False) or getattr(cfg, "is_encoder_decoder", False):
        return f"{name} belongs to an encoder-decoder model (cross-attention)"
    if "key_value_states" in inspect.signature(type(m).forward).parameters:
        return f"{name} is a BART-style attention (its forward takes key_value_states), which CLOVER does not run"
    if any(hasattr(m, n) for n in FUSED_QKV):
        return f"{name} fuses Q, K and V into one projection ({next(n for n in FUSED_QKV if hasattr(m, n))})"
    norms = [n for n in ("q_norm", "k_norm", "q_layernorm", "k_layernorm") if hasattr(m, n)]
    if norms:
        return f"{name} normalises each query / key head ({', '.join(norms)}), which CLOVER's transform does not " \
               "commute with"
    if hasattr(m, "rotary_ndims"):
        return f"{name} rotates only part of each head inside its forward (partial rotary embeddings, rotary_ndims)"
    if getattr(cfg, "clip_qkv", None):
        return f"{name} clips its query / key / value activations (clip_qkv)"
    if getattr(cfg, "attn_logit_softcapping", None) or getattr(m, "attn_logit_softcapping", None):
        return f"{name} soft-caps its attention logits"
    if hasattr(m, "sinks"):
        return f"{name} has attention sinks"
    if layout_of(m) is None:
        linears = [n for n, c in m.named_children() if isinstance(c, (torch.nn.Linear, Conv1D))]
        return f"{name} has projections CLOVER does not recognise ({', '.join(linears) or 'none'})"
    return None


def attention_layers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """Every attention module, in order; a UsageError names the first that CLOVER cannot handle."""
    found = []
    for n, m in model.named_modules():
        if isinstance(m, CloverAttention):
            found.append((n, m))
        elif type(m).__name__.endswith("Attention") or layout_of(m):
            reason = _refusal(m)
            if reason:
                raise UsageError(f"CLOVER cannot transform layer '{n}': {reason}")
            found.append((n, m))
    return found


def projections(m: torch.nn.Module) -> tuple[torch.nn.Linear, torch.nn.Linear, torch.nn.Linear, torch.nn.Linear]:
    return m.q_proj, m.k_proj, m.v_proj, (m.o_proj if hasattr(m, "o_proj") else m.out_proj)


def head_counts(m: torch.nn.Module) -> tuple[int, int]:
    cfg = m.config
    heads = cfg.num_attention_heads
    return heads, getattr(cfg, "num_key_value_heads", heads) or heads


def _linear(weight: torch.Tensor, bias: torch.Tensor | None) -> torch.nn.Linear:
    lin = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, dtype=weight.dtype,
                          device=weight.device)
    lin.weight.data.copy_(weight)
    if bias is not None:
        lin.bias.data.copy_(bias)
    return lin


def _split_fused(m: torch.nn.Module) -> None:
    """GPT-2's ``c_attn`` ([in, 3 * hidden] Conv1D) and ``c_proj`` as the equal separate ``nn.Linear`` layers."""
    w, b = m.c_attn.weight.data, m.c_attn.bias.data
    for i, name in enumerate(("q_proj", "k_proj", "v_proj")):
        cols = slice(i * m.split_size, (i + 1) * m.split_size)
        setattr(m, name, _linear(w[:, cols].T, b[cols]))
    m.o_proj = _linear(m.c_proj.weight.data.T, m.c_proj.bias.data)
    del m.c_attn, m.c_proj


class CloverAttention:
    """Mixin placed before the Hugging Face attention class: one forward for every recognised layout, with the Q-K
    and V-O widths as attributes, and how llmx stores / rebuilds the module."""

    qk_dim: int
    vo_dim: int
    base: type  # the Hugging Face attention class
    rope: bool  # RoPE sits between Q and K (the base's forward takes position embeddings)

    def _dropout(self) -> float:
        if not self.training:
            return 0.0
        for name in ("attention_dropout", "dropout"):
            if isinstance(getattr(self, name, None), (int, float)):
                return float(getattr(self, name))
        drop = getattr(self, "attn_dropout", None)
        return float(drop.p) if isinstance(drop, torch.nn.Dropout) else 0.0

    def _window(self) -> dict[str, Any]:
        window = self.sliding_window if hasattr(self, "sliding_window") else getattr(self.config, "sliding_window", None)
        return {"sliding_window": window} if window is not None else {}

    def forward(self, hidden_states, *, attention_mask=None, past_key_values=None, position_embeddings=None,
                encoder_hidden_states=None, **kwargs):
        if encoder_hidden_states is not None:
            raise ValueError("CLOVER attention is self-attention only")
        shape = hidden_states.shape[:-1]
        q = self.q_proj(hidden_states).view(*shape, -1, self.qk_dim).transpose(1, 2)
        k = self.k_proj(hidden_states).view(*shape, -1, self.qk_dim).transpose(1, 2)
        v = self.v_proj(hidden_states).view(*shape, -1, self.vo_dim).transpose(1, 2)
        if self.rope:
            rotate = getattr(sys.modules[self.base.__module__], "apply_rotary_pos_emb", apply_rotary_pos_emb)
            q, k = rotate(q, k, *position_embeddings)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)
        family = sys.modules[self.base.__module__]
        interface = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, getattr(family, "eager_attention_forward", eager_attention_forward))
        kwargs.pop("output_attentions", None)
        out, weights = interface(self, q, k, v, attention_mask, dropout=self._dropout(), scaling=self.scaling,
                                 **self._window(), **kwargs)
        out = projections(self)[3](out.reshape(*shape, -1).contiguous())
        if isinstance(getattr(self, "resid_dropout", None), torch.nn.Dropout):
            out = self.resid_dropout(out)
        return out, weights

    def llmx_spec(self) -> dict[str, Any]:
        return {"layer": "clover_attention", "attention": f"{self.base.__module__}.{self.base.__qualname__}",
                "layer_idx": self.layer_idx, "qk_dim": self.qk_dim, "vo_dim": self.vo_dim}

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


_CLASSES: dict[type, type] = {}


def _clover_class(base: type) -> type:
    if base not in _CLASSES:
        _CLASSES[base] = type(f"Clover{base.__name__}", (CloverAttention, base), {
            "base": base, "rope": "position_embeddings" in inspect.signature(base.forward).parameters})
    return _CLASSES[base]


def convert(module: torch.nn.Module) -> CloverAttention:
    """Re-class an attention module in place (the same function; GPT-2's fused projections split)."""
    if isinstance(module, CloverAttention):
        return module
    base = type(module)
    if layout_of(module) == "fused":
        _split_fused(module)
    module.__class__ = _clover_class(base)
    module.qk_dim = module.vo_dim = module.head_dim
    return module


@torch.no_grad()
def convert_model(model: torch.nn.Module, source: str) -> list[CloverAttention]:
    """Every attention layer converted; the model's logits on a probe are checked to be unchanged."""
    layers = attention_layers(model)
    if not layers:
        raise UsageError(f"model '{source}' has no attention layers CLOVER supports (separate q/k/v/o projections "
                         "or GPT-2's c_attn/c_proj)")
    todo = [m for _, m in layers if not isinstance(m, CloverAttention)]
    if not todo:
        return [m for _, m in layers]
    weight = next(model.parameters())
    vocab = model.get_input_embeddings().num_embeddings
    length = min(64, getattr(model.config, "max_position_embeddings", None) or 64)
    probe = torch.randint(0, vocab, (2, length), generator=torch.Generator().manual_seed(0)).to(weight.device)
    name = type(todo[0]).__name__
    training = model.training
    model.eval()
    before = model(input_ids=probe).logits.float()
    converted = [convert(m) for _, m in layers]
    try:
        after = model(input_ids=probe).logits.float()
    except (RuntimeError, ValueError, TypeError, AttributeError, IndexError, KeyError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UsageError(f"CLOVER's attention cannot run {name} ({first}); this layout is not "
                         "supported") from exc
    finally:
        model.train(training)
    tol = max(1e-4, 4 * torch.finfo(weight.dtype).eps) * max(1.0, float(before.abs().max()))  # 4 ulps of half types
    if not torch.allclose(before, after, atol=tol, rtol=0):
        raise UsageError(f"CLOVER's attention does not reproduce {name} "
                         f"(logits differ by {float((before - after).abs().max()):.2e}); this layout is not supported")
    return converted


LEGACY = {"llama": "transformers.models.llama.modeling_llama.LlamaAttention",
          "opt": "transformers.models.opt.modeling_opt.OPTAttention"}  # specs written before "attention" was stored


def rebuild(spec: dict[str, Any], state: dict[str, torch.Tensor], dtype: torch.dtype, config: Any) -> torch.nn.Module:
    """The storage builder: a module of the saved widths, then its tensors."""
    module = convert(transformers_class(spec.get("attention") or LEGACY[spec["kind"]])(config, layer_idx=spec["layer_idx"]))
    module.resize(spec["qk_dim"], spec["vo_dim"])
    module.load_state_dict(state, strict=True)
    return module.to(dtype)
