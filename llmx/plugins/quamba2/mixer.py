"""An llmx-owned Mamba2 mixer with named quantization points (groundwork for Quamba2, arXiv 2503.22879).

transformers' ``Mamba2Mixer`` calls module-level scan functions and uses ``conv1d`` only through ``.weight``, so its
internals (x, B, C, dt after the convolution; the gated SSM output) have no hook points. This mixer reproduces it on
the same weights (a parity test checks it) and routes every tensor Quamba2 quantizes through ``self.points[name]``
(identity by default): ``in_proj_in``, ``z``, ``x``, ``B``, ``C``, ``dt``, ``ssm_out`` (the gated output before
``out_proj``). The scan is the exact sequential recurrence (float32): a reference, not a fast path.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

POINTS = ("in_proj_in", "z", "x", "B", "C", "dt", "ssm_out")


class Mamba2Reference(torch.nn.Module):
    def __init__(self, hf_mixer: torch.nn.Module):
        super().__init__()
        m = hf_mixer
        self.in_proj, self.out_proj = m.in_proj, m.out_proj
        self.conv_weight, self.conv_bias = m.conv1d.weight, m.conv1d.bias
        self.dt_bias, self.A_log, self.D = m.dt_bias, m.A_log, m.D
        self.norm_weight, self.norm_eps, self.norm_group = m.norm.weight, m.norm.variance_epsilon, m.norm.group_size
        self.heads, self.head_dim, self.groups, self.state = m.num_heads, m.head_dim, m.n_groups, m.ssm_state_size
        self.inner = m.intermediate_size
        self.dt_limit = m.time_step_limit
        self.points: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {}

    def q(self, name: str, t: torch.Tensor) -> torch.Tensor:
        fn = self.points.get(name)
        return fn(t) if fn is not None else t

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        b, t, _ = hidden.shape
        proj = self.in_proj(self.q("in_proj_in", hidden))
        z, xbc, dt = proj.split([self.inner, self.inner + 2 * self.groups * self.state, self.heads], dim=-1)
        k = self.conv_weight.shape[-1]
        xbc = F.conv1d(xbc.transpose(1, 2), self.conv_weight, self.conv_bias, padding=k - 1,
                       groups=xbc.shape[-1])[..., :t]
        xbc = F.silu(xbc).transpose(1, 2)
        x, B, C = xbc.split([self.inner, self.groups * self.state, self.groups * self.state], dim=-1)
        x, B, C, dt, z = self.q("x", x), self.q("B", B), self.q("C", C), self.q("dt", dt), self.q("z", z)
        y = self.scan(x, dt, B, C)
        y = self.gated_norm(y, z)
        return self.out_proj(self.q("ssm_out", y).to(hidden.dtype))

    def scan(self, x: torch.Tensor, dt: torch.Tensor, B: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
        """``h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T``, ``y_t = h_t C_t + D x_t`` per head (float32)."""
        b, t, _ = x.shape
        dt = F.softplus(dt.float() + self.dt_bias.float()).clamp(self.dt_limit[0], self.dt_limit[1])  # [b, t, H]
        A = -torch.exp(self.A_log.float())  # [H]
        xs = x.float().reshape(b, t, self.heads, self.head_dim)
        per = self.heads // self.groups
        Bs = B.float().reshape(b, t, self.groups, self.state).repeat_interleave(per, dim=2)  # [b, t, H, N]
        Cs = C.float().reshape(b, t, self.groups, self.state).repeat_interleave(per, dim=2)
        h = torch.zeros(b, self.heads, self.head_dim, self.state, device=x.device)
        ys = []
        for i in range(t):
            decay = torch.exp(dt[:, i] * A)[:, :, None, None]
            h = decay * h + (dt[:, i, :, None, None] * xs[:, i, :, :, None]) * Bs[:, i, :, None, :]
            ys.append((h * Cs[:, i, :, None, :]).sum(-1) + self.D.float()[None, :, None] * xs[:, i])
        return torch.stack(ys, dim=1).reshape(b, t, -1)

    def gated_norm(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        y = y.float() * F.silu(z.float())
        g = y.reshape(*y.shape[:-1], -1, self.norm_group)
        g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + self.norm_eps)
        return self.norm_weight * g.reshape(y.shape)
