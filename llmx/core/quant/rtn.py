"""Round-to-nearest integer quantization of weight matrices, per-channel or per-group."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class IntFormat:
    """``bits``-bit integers; ``group_size`` None means one scale per output channel."""

    bits: int
    group_size: int | None = 128
    symmetric: bool = True

    @property
    def qmax(self) -> int:
        return 2 ** (self.bits - 1) - 1 if self.symmetric else 2**self.bits - 1

    @property
    def qmin(self) -> int:
        return -(2 ** (self.bits - 1)) if self.symmetric else 0


def _grouped(w: torch.Tensor, group_size: int | None) -> torch.Tensor:
    """``[rows, groups, g]``; a ragged last group is zero-padded, which changes neither its absmax nor,
    since the range always includes 0, its asymmetric min/max."""
    rows, cols = w.shape
    g = cols if group_size is None else group_size
    pad = -cols % g
    if pad:
        w = torch.nn.functional.pad(w, (0, pad))
    return w.reshape(rows, (cols + pad) // g, g)


def _ungrouped(wg: torch.Tensor, cols: int) -> torch.Tensor:
    return wg.reshape(wg.shape[0], -1)[:, :cols]


def scales(w: torch.Tensor, fmt: IntFormat) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-group scale and zero point, shaped ``[rows, groups, 1]``."""
    wg = _grouped(w.float(), fmt.group_size)
    if fmt.symmetric:
        scale = wg.abs().amax(-1, keepdim=True) / fmt.qmax
        zero = torch.zeros_like(scale)
    else:
        lo, hi = wg.amin(-1, keepdim=True).clamp(max=0), wg.amax(-1, keepdim=True).clamp(min=0)
        scale = (hi - lo) / fmt.qmax
        zero = torch.round(-lo / scale.clamp(min=1e-12))
    return scale.clamp(min=1e-12), zero


def quantize(w: torch.Tensor, fmt: IntFormat) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Integer codes (same shape as ``w``), scale and zero."""
    scale, zero = scales(w, fmt)
    q = torch.clamp(torch.round(_grouped(w.float(), fmt.group_size) / scale) + zero, fmt.qmin, fmt.qmax)
    dtype = (torch.int8 if fmt.symmetric else torch.uint8) if fmt.bits <= 8 else torch.int32
    return _ungrouped(q, w.shape[1]).to(dtype), scale, zero


def dequantize(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_size: int | None) -> torch.Tensor:
    return _ungrouped((_grouped(q.float(), group_size) - zero) * scale, q.shape[1])


def fake_quantize(w: torch.Tensor, fmt: IntFormat) -> torch.Tensor:
    """``dequantize(quantize(w))`` in ``w``'s dtype: the weight the quantized model computes with."""
    q, scale, zero = quantize(w, fmt)
    return dequantize(q, scale, zero, fmt.group_size).to(w.dtype)
