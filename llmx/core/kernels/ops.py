"""Kernel-backed ops with their PyTorch references. Each op runs the CuPy kernel for CUDA tensors (when CuPy and a
device are present) and the reference otherwise; the ``gpu`` tests compare the two."""

from __future__ import annotations

from pathlib import Path

import torch

from llmx.core import kernels
from llmx.core.quant.packing import unpack

CUDA = Path(__file__).parent / "cuda"


def int4_gemm_reference(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
                        bias: torch.Tensor | None, group_size: int, offset: int) -> torch.Tensor:
    """``x @ dequant(W)^T + bias`` for the packed int4 layout (two codes per byte, low nibble first)."""
    n, k = qweight.shape[0], x.shape[-1]
    codes = unpack(qweight, 4, k).float()  # stored values (code + offset)
    g = -(-k // group_size)
    pad = g * group_size - k
    c = torch.nn.functional.pad(codes, (0, pad)).reshape(n, g, group_size)
    z = zeros.float()[..., None] if zeros is not None else torch.full((1, 1, 1), float(offset), device=x.device)
    w = ((c - z) * scales.float()[..., None]).reshape(n, -1)[:, :k]
    out = x.float() @ w.T
    return out + bias.float() if bias is not None else out


def int4_gemm(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
              bias: torch.Tensor | None, group_size: int, offset: int) -> torch.Tensor:
    """Same contract as the reference; 2-D ``x`` ``[M, K]``."""
    if not kernels.use_kernel(x, qweight):
        return int4_gemm_reference(x, qweight, scales, zeros, bias, group_size, offset)
    import cupy

    m, k = x.shape
    n = qweight.shape[0]
    out = torch.empty(m, n, device=x.device, dtype=torch.float32)
    xf, sf = x.float().contiguous(), scales.float().contiguous()
    args = (cupy.asarray(xf), cupy.asarray(qweight.contiguous()), cupy.asarray(sf),
            cupy.asarray(zeros.contiguous()) if zeros is not None else cupy.uint64(0),
            cupy.asarray(bias.float().contiguous()) if bias is not None else cupy.uint64(0),
            cupy.asarray(out), cupy.int32(m), cupy.int32(n), cupy.int32(k), cupy.int32(group_size), cupy.int32(offset))
    threads = 128
    kernels.function(CUDA / "int4_gemm.cu", "int4_dequant_gemm")(((n + threads - 1) // threads, m), (threads,), args)
    return out


def quantize_rows_int8_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = (x.float().abs().amax(dim=-1) / 127).clamp(min=1e-8)
    q = torch.clamp(torch.round(x.float() / scale[:, None]), -128, 127).to(torch.int8)
    return q, scale


def quantize_rows_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row symmetric int8 codes and scales of a 2-D float tensor."""
    if not kernels.use_kernel(x):
        return quantize_rows_int8_reference(x)
    import cupy

    rows, cols = x.shape
    xf = x.float().contiguous()
    q = torch.empty(rows, cols, dtype=torch.int8, device=x.device)
    scale = torch.empty(rows, dtype=torch.float32, device=x.device)
    threads = 256
    kernels.function(CUDA / "int8_quant.cu", "quantize_rows_int8")(
        (rows,), (threads,), (cupy.asarray(xf), cupy.asarray(q), cupy.asarray(scale), cupy.int32(rows), cupy.int32(cols)))
    return q, scale
