"""Kernel-backed ops with their PyTorch references. Each op runs the CuPy kernel for CUDA tensors (when CuPy and a
device are present) and the reference otherwise; the ``gpu`` tests compare the two."""

from __future__ import annotations

from pathlib import Path

import torch

from llmx.core import kernels
from llmx.core.quant.packing import unpack

CUDA = Path(__file__).parent / "cuda"
MAX_GRID_Y = 65535  # CUDA's limit on gridDim.y; the GEMM kernels stride over rows beyond it


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
            cupy.asarray(bias.detach().float().contiguous()) if bias is not None else cupy.uint64(0),
            cupy.asarray(out), cupy.int32(m), cupy.int32(n), cupy.int32(k), cupy.int32(group_size), cupy.int32(offset))
    threads = 128
    kernels.launch(CUDA / "int4_gemm.cu", "int4_dequant_gemm", (-(-n // threads), min(m, MAX_GRID_Y)), (threads,), args, x)
    return out


def w4a8_gemm_reference(xq: torch.Tensor, x_scale: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                        bias: torch.Tensor | None, group_size: int) -> torch.Tensor:
    """int8 ``xq [M, K]`` times symmetric int4 weights (packed as ``pack(codes, 4, offset=8)``), Quamba2 (arXiv
    2503.22879) Sec. 5 / W4A8 path: exact integer sums per group (int32 ``torch._int_mm`` on the CPU, float64
    elsewhere, which holds them exactly), scaled in float32 by the group's weight scale, then by ``x_scale`` (one
    value, or one per row), plus bias."""
    k = xq.shape[-1]
    cpu = xq.device.type == "cpu"
    codes = unpack(qweight, 4, k, offset=8).to(torch.int8 if cpu else torch.float64)
    x = xq if cpu else xq.double()
    out = torch.zeros(xq.shape[0], qweight.shape[0], dtype=torch.float32, device=xq.device)
    for g, start in enumerate(range(0, k, group_size)):
        cols = slice(start, start + group_size)
        acc = int_mm(x[:, cols].contiguous(), codes[:, cols].t()) if cpu else x[:, cols] @ codes[:, cols].T
        out += acc.float() * scales[:, g].float()
    out = out * x_scale.to(out.device, torch.float32).reshape(-1, 1)
    return out + bias.float() if bias is not None else out


def w4a8_gemm(xq: torch.Tensor, x_scale: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
              bias: torch.Tensor | None, group_size: int) -> torch.Tensor:
    """Same contract as the reference; 2-D int8 ``xq``, fp16 ``scales [N, G]`` (passed to the kernel as float32)."""
    m, k = xq.shape
    if x_scale.numel() not in (1, m):
        raise ValueError(f"x_scale must have 1 or {m} elements, got {x_scale.numel()}")
    if not kernels.use_kernel(xq, qweight):
        return w4a8_gemm_reference(xq, x_scale, qweight, scales, bias, group_size)
    import cupy

    n = qweight.shape[0]
    out = torch.empty(m, n, device=xq.device, dtype=torch.float32)
    sx = x_scale.detach().to(xq.device, torch.float32).reshape(-1).contiguous()
    args = (cupy.asarray(xq.contiguous()), cupy.asarray(sx), cupy.int32(sx.numel()), cupy.asarray(qweight.contiguous()),
            cupy.asarray(scales.detach().float().contiguous()),
            cupy.asarray(bias.detach().float().contiguous()) if bias is not None else cupy.uint64(0),
            cupy.asarray(out), cupy.int32(m), cupy.int32(n), cupy.int32(k), cupy.int32(group_size))
    threads = 128
    kernels.launch(CUDA / "w4a8_gemm.cu", "w4a8_gemm", (-(-n // threads), min(m, MAX_GRID_Y)), (threads,), args, xq)
    return out


def int_mm(a: torch.Tensor, b: torch.Tensor, pad: bool | None = None) -> torch.Tensor:
    """``a @ b`` for int8 ``a [M, K]`` and ``b [K, N]``, exact int32. CUDA's ``torch._int_mm`` needs M > 16 and K, N
    multiples of 8 (a decode step has M = 1): there (or with ``pad=True``) the operands are zero-padded to fit and the
    result cut back, which changes no sum."""
    m, k = a.shape
    n = b.shape[1]
    if not (a.is_cuda if pad is None else pad):
        return torch._int_mm(a, b)
    mp, kp, np_ = max(m, 17), -(-k // 8) * 8, -(-n // 8) * 8
    if (mp, kp) != (m, k):
        a = torch.nn.functional.pad(a, (0, kp - k, 0, mp - m))
    if (kp, np_) != (k, n):
        b = torch.nn.functional.pad(b, (0, np_ - n, 0, kp - k))
    return torch._int_mm(a, b)[:m, :n]


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
    kernels.launch(CUDA / "int8_quant.cu", "quantize_rows_int8", (rows,), (threads,),
                   (cupy.asarray(xf), cupy.asarray(q), cupy.asarray(scale), cupy.int32(rows), cupy.int32(cols)), x)
    return q, scale
