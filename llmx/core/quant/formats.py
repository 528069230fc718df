"""Integer quantization formats and round-to-nearest: per-tensor, per-channel or per-group scales.

A weight ``W`` is ``[out, in]``; groups run along the input dimension (``group_size`` columns share a scale), as in
GPTQ. ``group_size=None`` means one scale per output channel, ``group_size=0`` one scale for the whole tensor.

Symmetric grids come in two kinds. ``full_range`` (the reference GPTQ code, compressed-tensors and Quamba2's official
code) spreads ``±absmax`` over all ``2^b - 1`` steps, ``scale = absmax / ((2^b - 1) / 2)``, and uses every code in
``[-2^(b-1), 2^(b-1) - 1]`` (the largest positive weight clips by half a step). The restricted grid,
``scale = absmax / (2^(b-1) - 1)``, never uses ``-2^(b-1)``: one level of ``2^b`` wasted (RTN error +12% at int4).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class IntFormat:
    bits: int
    group_size: int | None = 128
    symmetric: bool = True
    full_range: bool = True

    def __post_init__(self) -> None:
        if not 2 <= self.bits <= 8:
            raise ValueError(f"bits must be 2..8, got {self.bits}")
        if self.group_size is not None and self.group_size < 0:
            raise ValueError("group_size must be None (per channel), 0 (per tensor) or positive")

    @property
    def qmax(self) -> int:
        return 2 ** (self.bits - 1) - 1 if self.symmetric else 2**self.bits - 1

    @property
    def qmin(self) -> int:
        return -(2 ** (self.bits - 1)) if self.symmetric else 0

    @property
    def steps(self) -> float:
        """Grid steps that the range (``2 absmax`` symmetric, ``max - min`` asymmetric) spans."""
        if not self.symmetric:
            return 2**self.bits - 1
        return (2**self.bits - 1) / 2 if self.full_range else 2 ** (self.bits - 1) - 1

    @property
    def granularity(self) -> str:
        return "tensor" if self.group_size == 0 else "channel" if self.group_size is None else "group"

    def describe(self) -> str:
        g = {"tensor": "per-tensor", "channel": "per-channel"}.get(self.granularity, f"g{self.group_size}")
        kind = ("sym" if self.full_range else "sym-restricted") if self.symmetric else "asym"
        return f"int{self.bits} {g} {kind}"


def _grouped(w: torch.Tensor, group_size: int | None) -> torch.Tensor:
    """``[rows, groups, g]``; a ragged last group is zero-padded, which changes neither its absmax nor,
    since the range always includes 0, its asymmetric min/max."""
    rows, cols = w.shape
    if group_size == 0:
        return w.reshape(1, 1, rows * cols)
    g = cols if group_size is None else group_size
    pad = -cols % g
    if pad:
        w = torch.nn.functional.pad(w, (0, pad))
    return w.reshape(rows, (cols + pad) // g, g)


def _ungrouped(wg: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    rows, cols = shape
    if wg.shape[0] == 1 and rows != 1 and wg.shape[-1] == rows * cols:
        return wg.reshape(rows, cols)
    return wg.reshape(rows, -1)[:, :cols]


def range_to_scale(lo: torch.Tensor, hi: torch.Tensor, fmt: IntFormat) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero point that map ``[lo, hi]`` (or ``±max|.|`` when symmetric) onto the integer grid.

    The divisor is a tensor on the range's device: CUDA divides by a Python number as a multiplication by its
    reciprocal (an ulp off), and the scales, hence the codes, would then differ from the CPU's."""
    steps = torch.full((), fmt.steps, dtype=lo.dtype, device=lo.device)
    if fmt.symmetric:
        scale = torch.maximum(lo.abs(), hi.abs()) / steps
        return scale.clamp(min=1e-12), torch.zeros_like(scale)
    lo, hi = lo.clamp(max=0), hi.clamp(min=0)
    scale = ((hi - lo) / steps).clamp(min=1e-12)
    return scale, torch.round(-lo / scale)


def scales(w: torch.Tensor, fmt: IntFormat) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-group scale and zero point, shaped ``[rows, groups, 1]``."""
    wg = _grouped(w.float(), fmt.group_size)
    return range_to_scale(wg.amin(-1, keepdim=True), wg.amax(-1, keepdim=True), fmt)


def quantize_with(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, fmt: IntFormat) -> torch.Tensor:
    """Integer codes of ``w`` for given (grouped) scales."""
    q = torch.clamp(torch.round(_grouped(w.float(), fmt.group_size) / scale) + zero, fmt.qmin, fmt.qmax)
    return _ungrouped(q, w.shape).to(torch.int16)


def quantize(w: torch.Tensor, fmt: IntFormat) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Round-to-nearest codes (int16, same shape as ``w``), scale and zero."""
    scale, zero = scales(w, fmt)
    return quantize_with(w, scale, zero, fmt), scale, zero


def dequantize(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_size: int | None) -> torch.Tensor:
    return _ungrouped((_grouped(q.float(), group_size) - zero) * scale, q.shape)


def fake_quantize(w: torch.Tensor, fmt: IntFormat) -> torch.Tensor:
    """``dequantize(quantize(w))`` in ``w``'s dtype: the weight the quantized model computes with."""
    q, scale, zero = quantize(w, fmt)
    return dequantize(q, scale, zero, fmt.group_size).to(w.dtype)
