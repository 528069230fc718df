"""What sits at a mixer's named quantization points: an ``Observer`` while calibrating, an ``Int8Point`` after.

Int8 is symmetric with static scales, ``q(v) = s * clamp(round(v / s), -128, 127)`` (Quamba2 Sec. 3). A point's
scale is a scalar (per tensor) or one value per channel of the last dimension; grouped schemes (x by head group and
dim group, B/C per SSD group) are per-channel vectors whose values repeat inside each group.
"""

from __future__ import annotations

import torch

from llmx.core.quant.qlinear import quantize_activation
from llmx.plugins.quamba2.cluster import channel_stat


def fake_int8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Symmetric int8 quantize-dequantize with given (broadcastable) static scales."""
    codes, s = quantize_activation(x, 8, scale)
    return codes * s


class Int8Point(torch.nn.Module):
    """Static int8 fake-quant. The per-channel scale is stored compactly as a table of distinct scale rows plus, per
    row of ``row`` channels, an index into it: grouped scales (x: 16 values per layer, the cached state: one row of
    d_state values per head group x dim group) cost a few bytes per channel, not a float each."""

    def __init__(self, scale: torch.Tensor, row: int = 1):
        super().__init__()
        rows = scale.detach().float().clamp(min=1e-8).reshape(-1, row if scale.numel() > 1 else 1)
        table, index = torch.unique(rows, dim=0, return_inverse=True)
        self.register_buffer("table", table)
        self.register_buffer("index", index.to(torch.int16))

    @classmethod
    def empty(cls, table: list[int], index: list[int]) -> Int8Point:
        """A point of the stored shapes, on the CPU like the rest of the stored architecture (the storage loader
        fills in its tensors, then moves the model)."""
        point = cls(torch.ones(1, device="cpu"))
        point.table = torch.ones(table, device="cpu")
        point.index = torch.zeros(index, dtype=torch.int16, device="cpu")
        return point

    @property
    def scale(self) -> torch.Tensor:
        return self.table[self.index.long()].reshape(-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fake_int8(x.float(), self.scale).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.table.numel()} distinct scales over {self.index.numel() * self.table.shape[1]} channels"


class Observer(torch.nn.Module):
    """Records, over calibration batches: per-channel max |v|; per-channel max over samples of the mean |v| over
    tokens (Quamba2's sorting statistic); and, when ``percentile`` is set, the EMA of the per-batch percentile of |v|
    (Quamba1's x scale, momentum ``momentum``; a float64 scalar on the input's device). Passes its input through
    unchanged."""

    def __init__(self, percentile: float | None = None, momentum: float = 0.01):
        super().__init__()
        self.percentile, self.momentum = percentile, momentum
        self.absmax: torch.Tensor | None = None
        self.meanabs: torch.Tensor | None = None
        self.pct: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x.detach().float().abs()
        flat = a.reshape(-1, a.shape[-1])
        cmax = flat.amax(0)
        mean = channel_stat(a.reshape(a.shape[0], -1, a.shape[-1]))
        self.absmax = cmax if self.absmax is None else torch.maximum(self.absmax, cmax)
        self.meanabs = mean if self.meanabs is None else torch.maximum(self.meanabs, mean)
        if self.percentile is not None:
            k = max(1, min(flat.numel(), int(round(self.percentile * flat.numel()))))
            p = flat.reshape(-1).kthvalue(k).values.double()
            self.pct = p if self.pct is None else (1 - self.momentum) * self.pct + self.momentum * p
        return x

    def tensor_scale(self) -> torch.Tensor:
        return self.absmax.max() / 127

    def percentile_scale(self) -> torch.Tensor:
        return (self.pct / 127).float()

    def group_scale(self, groups: int) -> torch.Tensor:
        """One scale per contiguous block of ``channels / groups`` channels, expanded per channel."""
        g = self.absmax.reshape(groups, -1).amax(1, keepdim=True) / 127
        return g.expand(groups, self.absmax.numel() // groups).reshape(-1)

