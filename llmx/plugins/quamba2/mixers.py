"""llmx-owned Mamba / Mamba2 mixers with named quantization points (Quamba2, arXiv 2503.22879, Sec. 4-5).

transformers' mixers call module-level scan functions and use ``conv1d`` (and Mamba1's ``dt_proj``) only through
``.weight``, so the SSM inputs have no hook points and swapped modules are silently ignored. These mixers reproduce
them on the same weights (parity tests check both), route every tensor Quamba2 quantizes through ``self.points``
(empty: full precision), keep transformers' cache contract (conv and recurrent states per layer, so ``generate``
decodes step by step; the blocks pass it as ``cache``, older transformers as ``cache_params``), and describe
themselves for storage (``llmx_spec`` / ``rebuild``).

The scans are the exact sequential recurrences in float32: what the quantized kernels compute, not a fast path.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from llmx.core import kernels
from llmx.core.quant.hadamard import hadamard_transform
from llmx.plugins.quamba2 import ops
from llmx.plugins.quamba2.points import Int8Point, Observer


def _mask(h: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """Zero padded positions (transformers does the same before the projection and after the convolution)."""
    if attention_mask is None or attention_mask.shape[1] != h.shape[1]:
        return h
    return (h * attention_mask[:, :, None]).to(h.dtype)


CHUNK = 64  # time steps whose decay and input terms exist at once (each is batch x chunk x the state's size)


def recurrence(parts: Callable[[int, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]], steps: int,
               h: torch.Tensor, track_peak: bool, chunk: int = CHUNK):
    """The exact sequential scan ``h_t = decay_t * h_{t-1} + inject_t``, ``y_t = sum_n h_t C_t``. ``parts(s, e)``
    builds ``(decay, inject, C)`` for steps ``s..e-1`` (time on dim 1, ``C`` shaped to broadcast against ``h``), so
    memory holds ``chunk`` steps of them, not the whole sequence. Returns the stacked y, the last h and
    (``track_peak``) max |h_t|."""
    ys, peak = [], h.abs() if track_peak else None
    for start in range(0, steps, chunk):
        decay, inject, C = parts(start, min(start + chunk, steps))
        for i in range(decay.shape[1]):
            h = decay[:, i] * h + inject[:, i]
            ys.append((h * C[:, i]).sum(-1))
            if peak is not None:
                peak = torch.maximum(peak, h.abs())
    return torch.stack(ys, dim=1), h, peak


class QuantMixer(torch.nn.Module):
    ARCH = ""
    POINTS: tuple[str, ...] = ()

    def _common(self, hf: torch.nn.Module) -> None:
        self.layer_idx = hf.layer_idx
        self.in_proj, self.out_proj = hf.in_proj, hf.out_proj
        self.conv_weight = torch.nn.Parameter(hf.conv1d.weight.detach().clone())
        self.conv_bias = torch.nn.Parameter(hf.conv1d.bias.detach().clone()) if hf.conv1d.bias is not None else None
        self.A_log = torch.nn.Parameter(hf.A_log.detach().clone())
        self.D = torch.nn.Parameter(hf.D.detach().clone())
        self.points = torch.nn.ModuleDict()
        self.hadamard_out = False  # online rotation of the out_proj input (its inverse is fused into out_proj)

    def q(self, name: str, t: torch.Tensor) -> torch.Tensor:
        return self.points[name](t) if name in self.points else t

    def conv(self, xbc: torch.Tensor, cache: Any) -> torch.Tensor:
        """Depthwise causal conv + SiLU on ``[b, t, c]``; with a cache, the stored left context is prepended."""
        t, k = xbc.shape[1], self.conv_weight.shape[-1]
        seq = xbc.transpose(1, 2)
        if cache is not None:
            seq = cache.update_conv_state(seq, self.layer_idx, conv_kernel_size=k)
        out = F.conv1d(seq.to(self.conv_weight.dtype), self.conv_weight, self.conv_bias, padding=k - 1,
                       groups=seq.shape[1])[..., :seq.shape[-1]]
        return F.silu(out[..., -t:]).transpose(1, 2)

    def output(self, y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if self.hadamard_out:
            y = hadamard_transform(y)
        return self.out_proj(self.q("ssm_out", y).to(dtype))

    def initial_state(self, cache: Any) -> torch.Tensor | None:
        """The cached SSM state, None before the prefill (read before ``conv``, whose cache update marks the layer).
        ``has_previous_state`` and the layer's ``recurrent_states`` exist in every supported transformers (5.17 has no
        ``get_recurrent_state``, which in 5.23 reads the same two)."""
        if cache is None or not cache.has_previous_state(self.layer_idx, 0):
            return None
        return cache.layers[self.layer_idx].recurrent_states[0]

    def observing_state(self) -> bool:
        return "state" in self.points and isinstance(self.points["state"], Observer)

    def store_state(self, h: torch.Tensor, cache: Any, peak: torch.Tensor | None) -> None:
        """The last SSM state goes into the cache through the ``state`` point (one channel per state element): int8
        for decoding, as the official W8A8/W4A8 kernels keep it. A calibrating observer sees ``peak``, the max |h|
        over every step, since any step's state may be the one cached."""
        flat = (h.shape[0], 1, -1)
        if peak is not None:
            self.points["state"](peak.reshape(flat))
        if cache is not None:
            cache.update_recurrent_state(h if peak is not None else self.q("state", h.reshape(flat)).reshape(h.shape),
                                         self.layer_idx)

    def llmx_spec(self) -> dict[str, Any]:
        from llmx.core.models.storage import layer_specs

        return {"layer": "quamba2_mixer", "arch": self.ARCH, "layer_idx": self.layer_idx,
                "hadamard_out": self.hadamard_out, "modules": layer_specs(self),
                "points": {n: [list(p.table.shape), list(p.index.shape)] for n, p in self.points.items()}}


def rebuild(spec: dict[str, Any], state: dict[str, torch.Tensor], dtype: torch.dtype, config: Any) -> QuantMixer:
    """Storage builder: a mixer of ``spec['arch']`` with its quantized children and points, then its tensors."""
    from llmx.core.models.linear import replace_module
    from llmx.core.models.storage import build_layer

    hf_cls, cls = hf_mixers()[spec["arch"]]
    mixer = cls(hf_cls(config, layer_idx=spec["layer_idx"]).to(dtype))
    mixer.hadamard_out = spec["hadamard_out"]
    for name, (table, index) in spec["points"].items():
        mixer.points[name] = Int8Point.empty(table, index)
    for name, child in spec["modules"].items():
        local = {k[len(name) + 1:]: v for k, v in state.items() if k.startswith(name + ".")}
        replace_module(mixer, name, build_layer(child, local, dtype, config))
    mixer.load_state_dict(state, strict=True)
    return mixer


class Mamba2Mixer(QuantMixer):
    """Points: ``in_proj_in``, ``conv_in`` (x, B, C before the conv), ``z``, ``x``, ``B``, ``C``, ``dt`` (before
    softplus), ``ssm_out`` (the gated-norm output, after the online Hadamard when on), ``state`` (the cached state,
    flattened ``heads x head_dim x d_state``)."""

    ARCH = "mamba2"
    POINTS = ("in_proj_in", "conv_in", "z", "x", "B", "C", "dt", "ssm_out", "state")

    def __init__(self, hf: torch.nn.Module):
        super().__init__()
        self._common(hf)
        self.dt_bias = torch.nn.Parameter(hf.dt_bias.detach().clone())
        self.norm_weight = torch.nn.Parameter(hf.norm.weight.detach().clone())
        # Mamba2's gated RMSNorm normalizes each of the n_groups groups separately (mamba_ssm, transformers 5.23's
        # ``group_size``); transformers 5.17's norm has no group size and spans the whole width, which is the same
        # only for n_groups == 1. The group follows the model either way.
        self.norm_eps = hf.norm.variance_epsilon
        self.norm_group = getattr(hf.norm, "group_size", hf.intermediate_size // hf.n_groups)
        self.heads, self.head_dim, self.groups, self.state = hf.num_heads, hf.head_dim, hf.n_groups, hf.ssm_state_size
        self.inner = hf.intermediate_size
        self.dt_limit = tuple(hf.time_step_limit)

    def forward(self, hidden: torch.Tensor, cache: Any = None, attention_mask: torch.Tensor | None = None,
                cache_params: Any = None, **_: Any) -> torch.Tensor:
        cache = cache_params if cache is None else cache
        h0 = self.initial_state(cache)
        proj = self.in_proj(self.q("in_proj_in", _mask(hidden, attention_mask)))
        gs = self.groups * self.state
        z, xbc, dt = proj.split([self.inner, self.inner + 2 * gs, self.heads], dim=-1)
        xbc = _mask(self.conv_xbc(self.q("conv_in", xbc), cache), attention_mask)
        x, B, C = xbc.split([self.inner, gs, gs], dim=-1)
        x, B, C, dt, z = self.q("x", x), self.q("B", B), self.q("C", C), self.q("dt", dt), self.q("z", z)
        y, h, peak = self.scan(x, dt, B, C, h0, self.observing_state())
        self.store_state(h, cache, peak)
        return self.output(self.gated_norm(y, z), hidden.dtype)

    def xbc_scales(self) -> torch.Tensor | None:
        """Per-channel int8 scales of x, B and C concatenated, when all three are quantized."""
        if not all(n in self.points and isinstance(self.points[n], Int8Point) for n in ("x", "B", "C")):
            return None
        sizes = (self.inner, self.groups * self.state, self.groups * self.state)
        return torch.cat([self.points[n].scale.expand(k) for n, k in zip(("x", "B", "C"), sizes, strict=True)])

    def conv_xbc(self, xbc: torch.Tensor, cache: Any) -> torch.Tensor:
        """Conv + SiLU; on CUDA with int8 x/B/C and no cache, the fused kernel also writes them in int8."""
        scale = self.xbc_scales() if cache is None and kernels.use_kernel(xbc) else None
        if scale is None:
            return self.conv(xbc, cache)
        return ops.conv_silu_quant(xbc, self.conv_weight, self.conv_bias, scale).float() * scale

    def scan(self, x, dt, B, C, h0=None, track_peak=False):
        """``h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T``, ``y_t = h_t C_t + D x_t`` per head; returns y, the last
        h and (``track_peak``) max |h_t| over the steps."""
        b, t, _ = x.shape
        dt = F.softplus(dt.float() + self.dt_bias.float()).clamp(self.dt_limit[0], self.dt_limit[1])
        A = -torch.exp(self.A_log.float())
        xs = x.float().reshape(b, t, self.heads, self.head_dim)
        per = self.heads // self.groups
        Bs = B.float().reshape(b, t, self.groups, self.state).repeat_interleave(per, dim=2)
        Cs = C.float().reshape(b, t, self.groups, self.state).repeat_interleave(per, dim=2)
        h = h0.float() if h0 is not None else x.new_zeros(b, self.heads, self.head_dim, self.state, dtype=torch.float32)

        def parts(s, e):
            d = dt[:, s:e]
            return (torch.exp(d * A)[..., None, None], (d[..., None, None] * xs[:, s:e, ..., None]) * Bs[:, s:e, :, None, :],
                    Cs[:, s:e, :, None, :])

        y, h, peak = recurrence(parts, t, h, track_peak)
        return (y + self.D.float()[:, None] * xs).reshape(b, t, -1), h, peak

    def gated_norm(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        y = y.float() * F.silu(z.float())
        g = y.reshape(*y.shape[:-1], -1, self.norm_group)
        g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + self.norm_eps)
        return self.norm_weight.float() * g.reshape(y.shape)


class MambaMixer(QuantMixer):
    """Mamba1. Points: ``in_proj_in``, ``x`` (the SSM input = ``x_proj`` input), ``xproj_out`` (dt rank, B, C),
    ``dt`` (``dt_proj`` output, before softplus), ``z``, ``ssm_out``, ``state`` (the cached state, flattened).
    ``dt_proj`` is called as a module here."""

    ARCH = "mamba"
    POINTS = ("in_proj_in", "x", "xproj_out", "dt", "z", "ssm_out", "state")

    def __init__(self, hf: torch.nn.Module):
        super().__init__()
        self._common(hf)
        self.x_proj, self.dt_proj = hf.x_proj, hf.dt_proj
        self.inner, self.state, self.rank = hf.intermediate_size, hf.ssm_state_size, hf.time_step_rank

    def forward(self, hidden: torch.Tensor, cache: Any = None, attention_mask: torch.Tensor | None = None,
                cache_params: Any = None, **_: Any) -> torch.Tensor:
        cache = cache_params if cache is None else cache
        h0 = self.initial_state(cache)
        x, z = self.in_proj(self.q("in_proj_in", _mask(hidden, attention_mask))).chunk(2, dim=-1)
        x = self.q("x", _mask(self.conv(x, cache), attention_mask))
        dt, B, C = self.q("xproj_out", self.x_proj(x)).split([self.rank, self.state, self.state], dim=-1)
        dt = self.q("dt", self.dt_proj(dt))
        y, h, peak = self.scan(x, dt, B, C, h0, self.observing_state())
        self.store_state(h, cache, peak)
        return self.output(y * F.silu(self.q("z", z).float()), hidden.dtype)

    def scan(self, x, dt, B, C, h0=None, track_peak=False):
        """``h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t``, ``y_t = h_t C_t + D x_t`` per channel (dt: after dt_proj);
        returns y, the last h and (``track_peak``) max |h_t| over the steps."""
        dt = F.softplus(dt.float())
        A = -torch.exp(self.A_log.float())
        dx, B, C = dt * x.float(), B.float(), C.float()
        h = h0.float() if h0 is not None else x.new_zeros(x.shape[0], self.inner, self.state, dtype=torch.float32)

        def parts(s, e):
            return torch.exp(dt[:, s:e, :, None] * A), dx[:, s:e, :, None] * B[:, s:e, None, :], C[:, s:e, None, :]

        y, h, peak = recurrence(parts, x.shape[1], h, track_peak)
        return y + self.D.float() * x.float(), h, peak


@functools.cache
def hf_mixers() -> dict[str, tuple[type, type]]:
    """model_type -> (transformers mixer class, llmx mixer class)."""
    from transformers.models.mamba.modeling_mamba import MambaMixer as HFMamba
    from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer as HFMamba2

    return {"mamba2": (HFMamba2, Mamba2Mixer), "mamba": (HFMamba, MambaMixer)}


def convert(model: torch.nn.Module) -> list[QuantMixer]:
    """Replace every transformers mixer of a Mamba / Mamba2 model by the llmx mixer (same weights, same outputs)."""
    hf_cls, cls = hf_mixers()[model.config.model_type]
    out = []
    for layer in model.backbone.layers:
        if isinstance(layer.mixer, hf_cls):
            layer.mixer = cls(layer.mixer)
        out.append(layer.mixer)
    return out
