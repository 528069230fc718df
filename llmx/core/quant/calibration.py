"""Calibration: hook Linear inputs on token windows, accumulate Hessians ``X X^T`` and activation ranges.

``sequential`` walks the model block by block: the inputs of block ``i`` are computed with blocks ``< i`` already
quantized (``propagate="quantized"``, as GPTQ and Quamba do) or all in full precision (``propagate="fp"``, as
GuidedQuant's Hessians are), and a callback quantizes each block once its statistics are in.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

_BLOCK = re.compile(r"\.(?:layers|h|blocks)\.(\d+)\.")


@dataclass
class LinearStats:
    """What the hooks saw at one Linear's input."""

    hessian: torch.Tensor | None = None  # sum over tokens of x x^T (float64)
    tokens: int = 0
    absmax: float = 0.0
    channel_absmax: torch.Tensor | None = None
    extra: dict = field(default_factory=dict)

    def add(self, x: torch.Tensor, with_hessian: bool) -> None:
        x = x.detach().reshape(-1, x.shape[-1]).double()
        if with_hessian:
            h = x.T @ x
            self.hessian = h if self.hessian is None else self.hessian + h
        self.tokens += x.shape[0]
        self.absmax = max(self.absmax, float(x.abs().max()))
        cmax = x.abs().amax(dim=0)
        self.channel_absmax = cmax if self.channel_absmax is None else torch.maximum(self.channel_absmax, cmax)


def block_of(name: str) -> int | None:
    m = _BLOCK.search(f".{name}.")
    return int(m.group(1)) if m else None


@torch.no_grad()
def forward_batches(model: torch.nn.Module, batches: torch.Tensor, batch_size: int = 8, progress=None,
                    description: str = "calibrating") -> None:
    """Run token windows through ``model`` in chunks (whatever hooks or observers it carries record them)."""
    device = next(model.parameters()).device
    chunks = list(range(0, len(batches), batch_size))
    for i in progress(chunks, description=description) if progress else chunks:
        model(input_ids=batches[i:i + batch_size].to(device))


@torch.no_grad()
def collect(model: torch.nn.Module, layers: dict[str, torch.nn.Module], batches: torch.Tensor, with_hessian: bool = True,
            batch_size: int = 8, progress=None) -> dict[str, LinearStats]:
    """Run ``batches`` through ``model`` once, recording the inputs of ``layers``."""
    stats = {name: LinearStats() for name in layers}
    hooks = [m.register_forward_pre_hook(lambda _m, args, n=name: stats[n].add(args[0], with_hessian))
             for name, m in layers.items()]
    try:
        forward_batches(model, batches, batch_size, progress)
    finally:
        for h in hooks:
            h.remove()
    return stats


def sequential(model: torch.nn.Module, layers: dict[str, torch.nn.Module], batches: torch.Tensor,
               quantize_block: Callable[[dict[str, torch.nn.Module], dict[str, LinearStats]], None],
               propagate: str = "quantized", with_hessian: bool = True, progress=None) -> None:
    """Group ``layers`` by decoder block and call ``quantize_block(block_layers, stats)`` block by block."""
    blocks: dict[int, dict[str, torch.nn.Module]] = {}
    for name, module in layers.items():
        idx = block_of(name)
        blocks.setdefault(10**9 if idx is None else idx, {})[name] = module
    order: Iterable[int] = sorted(blocks)
    if propagate == "fp":
        stats = collect(model, layers, batches, with_hessian)
        for idx in progress(order, description="quantizing") if progress else order:
            quantize_block(blocks[idx], {n: stats[n] for n in blocks[idx]})
        return
    for idx in progress(order, description="quantizing") if progress else order:
        quantize_block(blocks[idx], collect(model, blocks[idx], batches, with_hessian))
