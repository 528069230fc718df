"""What sits at a mixer's named quantization points: an ``Observer`` while calibrating, an ``Int8Point`` after.

Int8 is symmetric with static scales, ``q(v) = s * clamp(round(v / s), -128, 127)`` (Quamba2 Sec. 3). A point's
scale is a scalar (per tensor) or one value per channel of the last dimension; grouped schemes (x by head group and
dim group, B/C per SSD group) are per-channel vectors whose values repeat inside each group.
"""

from __future__ import annotations

import torch

from llmx.plugins.quamba2.cluster import channel_stat


def fake_int8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Symmetric int8 quantize-dequantize with given (broadcastable) static scales."""
    return torch.clamp(torch.round(x / scale), -128, 127) * scale


class Int8Point(torch.nn.Module):
    def __init__(self, scale: torch.Tensor):
        super().__init__()
        self.register_buffer("scale", scale.detach().float().clamp(min=1e-8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fake_int8(x.float(), self.scale).to(x.dtype)

    def extra_repr(self) -> str:
        return "per-tensor" if self.scale.dim() == 0 else f"per-channel ({self.scale.numel()})"


class Observer(torch.nn.Module):
    """Records, over calibration batches: per-channel max |v|; per-channel max over samples of the mean |v| over
    tokens (Quamba2's sorting statistic); and the EMA of the per-batch ``percentile`` of |v| (Quamba1's x scale,
    momentum ``momentum``). Passes its input through unchanged."""

    def __init__(self, percentile: float = 0.9995, momentum: float = 0.01):
        super().__init__()
        self.percentile, self.momentum = percentile, momentum
        self.absmax: torch.Tensor | None = None
        self.meanabs: torch.Tensor | None = None
        self.pct: float | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x.detach().float().abs()
        flat = a.reshape(-1, a.shape[-1])
        cmax = flat.amax(0)
        mean = channel_stat(a.reshape(a.shape[0], -1, a.shape[-1]))
        self.absmax = cmax if self.absmax is None else torch.maximum(self.absmax, cmax)
        self.meanabs = mean if self.meanabs is None else torch.maximum(self.meanabs, mean)
        k = max(1, min(flat.numel(), int(round(self.percentile * flat.numel()))))
        p = float(flat.reshape(-1).kthvalue(k).values)
        self.pct = p if self.pct is None else (1 - self.momentum) * self.pct + self.momentum * p
        return x

    def tensor_scale(self) -> torch.Tensor:
        return self.absmax.max() / 127

    def percentile_scale(self) -> torch.Tensor:
        return torch.tensor(self.pct / 127)

    def group_scale(self, groups: int) -> torch.Tensor:
        """One scale per contiguous block of ``channels / groups`` channels, expanded per channel."""
        g = self.absmax.reshape(groups, -1).amax(1, keepdim=True) / 127
        return g.expand(groups, self.absmax.numel() // groups).reshape(-1)

