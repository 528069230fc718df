"""Quamba2 kernel-backed ops (arXiv 2503.22879, Sec. 5 / W4A8 path) with their PyTorch references: the CuPy kernel for
CUDA tensors, the reference otherwise."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from llmx.core import kernels
from llmx.core.quant.qlinear import quantize_activation

KERNELS = Path(__file__).parent / "kernels"


def conv_silu_quant_reference(xbc: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                              out_scale: torch.Tensor) -> torch.Tensor:
    """int8 ``[B, T, C]`` codes of ``silu(causal depthwise conv1d(xbc))`` with static per-channel ``out_scale [C]``;
    ``weight`` is the ``nn.Conv1d`` ``[C, 1, K]`` weight. Rounds half to even (``torch.round``)."""
    t, c, k = xbc.shape[1], weight.shape[0], weight.shape[-1]
    y = F.conv1d(xbc.float().transpose(1, 2), weight.float(), bias.float() if bias is not None else None,
                 padding=k - 1, groups=c)[..., :t]
    codes, _ = quantize_activation(F.silu(y).transpose(1, 2), 8, out_scale.to(y.device, torch.float32))
    return codes.to(torch.int8)


def conv_silu_quant(xbc: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                    out_scale: torch.Tensor) -> torch.Tensor:
    """Same contract as the reference, fused in one kernel (``rintf``: half to even too)."""
    if not kernels.use_kernel(xbc, weight):
        return conv_silu_quant_reference(xbc, weight, bias, out_scale)
    import cupy

    b, t, c = xbc.shape
    k = weight.shape[-1]
    out = torch.empty(b, t, c, dtype=torch.int8, device=xbc.device)
    args = (cupy.asarray(xbc.detach().float().contiguous()), cupy.asarray(weight.detach().float().reshape(c, k).contiguous()),
            cupy.asarray(bias.detach().float().contiguous()) if bias is not None else cupy.uint64(0),
            cupy.asarray(out_scale.detach().to(xbc.device, torch.float32).contiguous()), cupy.asarray(out),
            cupy.int32(b), cupy.int32(t), cupy.int32(c), cupy.int32(k))
    threads = 256
    kernels.launch(KERNELS / "conv_quant.cu", "conv_silu_quant_int8", (-(-(b * t * c) // threads),), (threads,), args, xbc)
    return out
