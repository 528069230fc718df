"""LUT GEMM for LUTLinear (per-row fp16 codebooks, packed b-bit indices): a CuPy kernel for CUDA tensors, the
PyTorch gather-and-matmul as its reference."""

from __future__ import annotations

from pathlib import Path

import torch

from llmx.core import kernels
from llmx.core.kernels.ops import MAX_GRID_Y
from llmx.core.quant.packing import unpack

CUDA = Path(__file__).parent / "cuda"


def use_kernel(x: torch.Tensor) -> bool:
    return kernels.use_kernel(x) and not (x.requires_grad and torch.is_grad_enabled())


def lut_gemm_reference(x: torch.Tensor, qweight: torch.Tensor, codebook: torch.Tensor, bias: torch.Tensor | None,
                       bits: int) -> torch.Tensor:
    """``x [M, K] @ W^T + bias`` with ``W[n, k] = codebook[n, idx(n, k)]``, in float32."""
    w = codebook.float().gather(1, unpack(qweight, bits, x.shape[-1]).long())
    out = x.float() @ w.T
    return out + bias.float() if bias is not None else out


def lut_gemm(x: torch.Tensor, qweight: torch.Tensor, codebook: torch.Tensor, bias: torch.Tensor | None,
             bits: int) -> torch.Tensor:
    """Same contract as the reference; 2-D ``x``."""
    if not kernels.use_kernel(x, qweight):
        return lut_gemm_reference(x, qweight, codebook, bias, bits)
    import cupy

    m, k = x.shape
    n = qweight.shape[0]
    out = torch.empty(m, n, device=x.device, dtype=torch.float32)
    args = (cupy.asarray(x.detach().float().contiguous()), cupy.asarray(qweight.contiguous()),
            cupy.asarray(codebook.float().contiguous()),
            cupy.asarray(bias.detach().float().contiguous()) if bias is not None else cupy.uint64(0),
            cupy.asarray(out), cupy.int32(m), cupy.int32(n), cupy.int32(k), cupy.int32(bits))
    warps = 4
    kernels.launch(CUDA / "lut_gemm.cu", "lut_gemm", (-(-n // warps), min(m, MAX_GRID_Y)), (32 * warps,), args, x)
    return out
