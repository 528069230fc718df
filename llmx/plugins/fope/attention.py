"""The position step inside a Llama-family attention, replaced per layer: transformers hands every layer one RoPE
``(cos, sin)`` broadcast over heads, while FoPE needs a table per layer and per KV head and ALiBi a bias on the
scores. ``install`` re-classes each attention module in place (same projections, same attention interface) and the
stored spec rebuilds it (``llmx_spec`` / ``rebuild``). ``rope`` models keep transformers' own attention.

With GQA each KV head has its own table, shared by the query heads that read it (the official model has no GQA)."""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from typing import Any

import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import eager_attention_forward

from llmx.core.models.storage import transformers_class
from llmx.errors import UsageError
from llmx.plugins.fope import position

FAMILIES = ("llama", "mistral", "qwen2")  # attention with separate q/k/v/o projections and RoPE between q and k
COEFFICIENTS = ("fope_sin", "fope_cos")
BIASED = ("eager", "sdpa")  # attention interfaces that add a float mask to the scores (ALiBi needs one)


@dataclass(frozen=True)
class Settings:
    """What a converted attention needs to rebuild itself (stored in the model's ``llmx.json``)."""

    strategy: str  # fope | alibi
    train_len: int
    theta: float = 10_000.0
    floor_clip: bool = True
    ignore_zero: bool = True
    fourier_dim: int | str | None = None  # None: official min(D, head_dim // 4); "all": every kept frequency
    sigma: float = 0.3
    learnable: bool = False


def biased(config: Any) -> None:
    """ALiBi needs an attention that adds a float mask to its scores (checked at install and at every call: an
    implementation switched later would drop the bias)."""
    if config._attn_implementation not in BIASED:
        raise UsageError(f"fope: ALiBi adds a bias to the attention scores, which the {config._attn_implementation} "
                         "attention cannot take; use eager or sdpa")


class PositionAttention:
    """Mixin placed before the Hugging Face attention class."""

    base: type
    settings: Settings

    def _apply(self, fn, recurse=True):
        """Casts leave FoPE's coefficients and frequencies in float32 (the official ``rope_full_precision``): a bf16
        model keeps full-precision tables."""
        keep = {n: getattr(self, n).data for n in (*COEFFICIENTS, "fope_freqs") if getattr(self, n, None) is not None}
        super()._apply(fn, recurse)
        for n, t in keep.items():
            new = getattr(self, n)
            if new.dtype != t.dtype:  # a cast (a move or to_empty keeps what it made)
                new.data = t.to(new.device)
                if getattr(new, "grad", None) is not None:
                    new.grad.data = new.grad.data.to(t.dtype)
        return self

    def _positions(self, q: torch.Tensor, past_key_values, kwargs: dict) -> torch.Tensor:
        ids = kwargs.get("position_ids")
        if ids is not None:
            return ids.expand(q.shape[0], -1)
        past = past_key_values.get_seq_length(self.layer_idx) if past_key_values is not None else 0
        return (torch.arange(q.shape[-2], device=q.device) + past).expand(q.shape[0], -1)

    def _fope(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        from llmx.plugins.fope import ops

        return ops.fope_rotate(q, k, positions, self.fope_freqs, self.fope_sin, self.fope_cos)

    def _alibi(self, mask: torch.Tensor | None, q: torch.Tensor, kv_len: int) -> torch.Tensor:
        """``-slope_h (i - j)`` on the scores of query i and key j (keys in cache order), causal; a boolean mask
        (True: attend) or an additive one from transformers is folded in."""
        biased(self.config)
        q_len = q.shape[-2]
        i = torch.arange(kv_len - q_len, kv_len, device=q.device)[:, None]
        j = torch.arange(kv_len, device=q.device)[None, :]
        bias = -self.alibi_slopes.to(q.device, torch.float32)[:, None, None] * (i - j).float()  # (H, q, kv)
        low = torch.finfo(q.dtype).min
        if mask is None:
            bias = bias.masked_fill(j > i, low)[None]
        elif mask.dtype == torch.bool:
            bias = bias[None].masked_fill(~mask, low)
        else:
            bias = (bias[None] + mask.float()).clamp(min=low)
        return bias.to(q.dtype)

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, past_key_values=None, **kwargs):
        shape = hidden_states.shape[:-1]
        heads = (*shape, -1, self.head_dim)
        q = self.q_proj(hidden_states).view(heads).transpose(1, 2)
        k = self.k_proj(hidden_states).view(heads).transpose(1, 2)
        v = self.v_proj(hidden_states).view(heads).transpose(1, 2)
        if self.settings.strategy == "fope":
            q, k = self._fope(q, k, self._positions(q, past_key_values, kwargs))
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)
        if self.settings.strategy == "alibi":
            attention_mask = self._alibi(attention_mask, q, k.shape[-2])
        family = sys.modules[self.base.__module__]
        interface = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, getattr(family, "eager_attention_forward", eager_attention_forward))
        window = getattr(self, "sliding_window", getattr(self.config, "sliding_window", None))
        out, weights = interface(self, q, k, v, attention_mask, dropout=self.attention_dropout if self.training else 0.0,
                                 scaling=self.scaling, **({"sliding_window": window} if window else {}), **kwargs)
        return self.o_proj(out.reshape(*shape, -1).contiguous()), weights

    def llmx_spec(self) -> dict[str, Any]:
        return {"layer": "fope_attention", "attention": f"{self.base.__module__}.{self.base.__qualname__}",
                "layer_idx": self.layer_idx, **asdict(self.settings)}


_CLASSES: dict[type, type] = {}


def _class(base: type) -> type:
    if base not in _CLASSES:
        _CLASSES[base] = type(f"Position{base.__name__}", (PositionAttention, base), {"base": base})
    return _CLASSES[base]


def coefficient_shape(module: torch.nn.Module, s: Settings) -> tuple[int, int, int]:
    kept = position.kept_frequencies(module.head_dim, s.theta, s.train_len, s.floor_clip, s.ignore_zero)
    kv = module.config.num_key_value_heads
    return kv, len(kept), position.output_dims(len(kept), module.head_dim, s.fourier_dim, s.ignore_zero)


def install(module: torch.nn.Module, s: Settings, generator: torch.Generator | None = None) -> PositionAttention:
    """Re-class one attention in place and give it its tables (FoPE: fresh coefficients) or slopes (ALiBi)."""
    device = module.q_proj.weight.device
    module.__class__ = _class(type(module))
    module.settings = s
    if s.strategy == "fope":
        freqs = position.kept_frequencies(module.head_dim, s.theta, s.train_len, s.floor_clip, s.ignore_zero)
        if not bool((freqs != 0).any()):
            raise UsageError(f"fope: train_len {s.train_len} is so short that floor clipping keeps no frequency "
                             f"(every frequency of head_dim {module.head_dim}, theta {s.theta:g} is below "
                             f"2 pi / {s.train_len}); use a longer train_len or floor_clip: false")
        shape = coefficient_shape(module, s)
        module.register_buffer("fope_freqs", freqs.to(device), persistent=False)
        for name in COEFFICIENTS:
            coef = position.init_coefficients(shape, s.sigma, generator, device)
            setattr(module, name, torch.nn.Parameter(coef, requires_grad=s.learnable))
    else:
        biased(module.config)
        module.register_buffer("alibi_slopes", position.alibi_slopes(module.config.num_attention_heads, device),
                               persistent=False)
    return module


def expand(module: PositionAttention, train_len: int, generator: torch.Generator | None = None) -> None:
    """Continue a FoPE attention at a longer ``train_len``: more frequencies pass the floor, so the coefficients
    grow (old block copied, new entries initialised as at the start; official ``len_extra_fourier_expand``)."""
    s = module.settings
    if train_len < s.train_len:
        raise UsageError(f"fope: the model was trained at train_len {s.train_len}; continuing at the shorter "
                         f"{train_len} is not supported")
    new = Settings(**{**asdict(s), "train_len": train_len})
    shape = coefficient_shape(module, new)
    module.fope_freqs = position.kept_frequencies(module.head_dim, s.theta, train_len, s.floor_clip,
                                                  s.ignore_zero).to(module.fope_freqs.device)
    for name in COEFFICIENTS:
        old = getattr(module, name)
        grown = position.expand_coefficients(old.detach(), shape, s.sigma, generator)
        setattr(module, name, torch.nn.Parameter(grown, requires_grad=s.learnable))
    module.settings = new


def attentions(model: torch.nn.Module, source: str) -> list[torch.nn.Module]:
    """The self-attention module of every decoder layer; a one-line UsageError for any other family."""
    kind = getattr(model.config, "model_type", type(model).__name__)
    if kind not in FAMILIES:
        raise UsageError(f"fope: '{source}' is a {kind} model; the position strategies replace the rotary step of a "
                         f"Llama-family attention ({', '.join(FAMILIES)})")
    return [layer.self_attn for layer in model.model.layers]


def convert(model: torch.nn.Module, s: Settings, seed: int, source: str) -> list[PositionAttention]:
    """Every layer converted (``fope`` / ``alibi``), seeded: coefficients differ per layer and per head."""
    generator = torch.Generator().manual_seed(seed)
    return [install(m, s, generator) for m in attentions(model, source)]


def rebuild(spec: dict[str, Any], state: dict[str, torch.Tensor], dtype: torch.dtype, config: Any) -> torch.nn.Module:
    """The storage builder: the attention of the stored class with its stored tables (coefficients stay float32)."""
    fields = {k: spec[k] for k in Settings.__dataclass_fields__ if k in spec}
    module = transformers_class(spec["attention"])(config, layer_idx=spec["layer_idx"])
    module.to(dtype)
    install(module, Settings(**fields), torch.Generator())  # the stored tensors replace this init
    for name in COEFFICIENTS:
        if name in state:
            setattr(module, name, torch.nn.Parameter(torch.empty_like(state[name], dtype=torch.float32),
                                                     requires_grad=module.settings.learnable))
    module.load_state_dict(state, strict=True)
    return module
