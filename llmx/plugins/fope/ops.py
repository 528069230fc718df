"""FoPE's rotation of q and k: the CuPy kernel (``kernels/fope_rotate.cu``) for CUDA tensors with frozen
coefficients, the PyTorch reference (``position.fourier_tables`` + ``position.rotate``) otherwise; the ``gpu`` test
compares the two."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from llmx.core import kernels
from llmx.plugins.fope import position

SOURCE = Path(__file__).parent / "kernels" / "fope_rotate.cu"
TILE, MAX_FREQS = 8, 128  # as in the kernel


def fope_rotate_reference(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor,
                          sin_coef: torch.Tensor, cos_coef: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q ``(B, Hq, T, hd)`` and k ``(B, Hkv, T, hd)`` rotated by their KV head's table (query head h reads KV head
    ``h // (Hq / Hkv)``, as transformers' ``repeat_kv``)."""
    off = torch.autocast(q.device.type, enabled=False) if torch.amp.is_autocast_available(q.device.type) \
        else contextlib.nullcontext()
    with off:  # fp32 tables under bf16 autocast (the official rope_full_precision)
        cos, sin = position.fourier_tables(positions, freqs, sin_coef, cos_coef, k.shape[-1])
        rep = q.shape[1] // k.shape[1]
        return (position.rotate(q, cos.repeat_interleave(rep, 1), sin.repeat_interleave(rep, 1)),
                position.rotate(k, cos, sin))


def _launch(q, k, positions, freqs, sin_coef, cos_coef, sign: float):
    import cupy

    b, hq, t, hd = q.shape
    hkv, d, d_out = sin_coef.shape
    if k.shape[0] != b or k.shape[2] != t or hq % hkv or d < 1 or d_out > hd // 2 or freqs.numel() != d:
        raise ValueError(f"fope_rotate: q {tuple(q.shape)}, k {tuple(k.shape)} and coefficients "
                         f"{tuple(sin_coef.shape)} do not fit together")
    qf, kf = q.float().contiguous(), k.float().contiguous()
    q_out, k_out = torch.empty_like(qf), torch.empty_like(kf)
    args = tuple(cupy.asarray(x) for x in (qf, kf, positions.long().contiguous(), freqs.float().contiguous(),
                                           sin_coef.float().contiguous(), cos_coef.float().contiguous(), q_out, k_out))
    args += (cupy.int32(t), cupy.int32(hq), cupy.int32(hkv), cupy.int32(hd), cupy.int32(d), cupy.int32(d_out),
             cupy.float32(sign))
    kernels.launch(SOURCE, "fope_rotate", (-(-t // TILE), hkv, b), (128,), args, q)
    return q_out.to(q.dtype), k_out.to(k.dtype)


class _Rotate(torch.autograd.Function):
    """The kernel with a frozen table: the backward is the transposed rotation (the same kernel, sine negated)."""

    @staticmethod
    def forward(ctx, q, k, positions, freqs, sin_coef, cos_coef):
        ctx.save_for_backward(positions, freqs, sin_coef, cos_coef)
        return _launch(q, k, positions, freqs, sin_coef, cos_coef, 1.0)

    @staticmethod
    def backward(ctx, grad_q, grad_k):
        positions, freqs, sin_coef, cos_coef = ctx.saved_tensors
        gq, gk = _launch(grad_q, grad_k, positions, freqs, sin_coef, cos_coef, -1.0)
        return gq, gk, None, None, None, None


def fope_rotate(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor,
                sin_coef: torch.Tensor, cos_coef: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as the reference; learnable coefficients (which need their gradient) take the reference."""
    frozen = not (sin_coef.requires_grad or cos_coef.requires_grad)
    if frozen and freqs.numel() <= MAX_FREQS and kernels.use_kernel(q, k, positions, sin_coef):
        return _Rotate.apply(q, k, positions, freqs, sin_coef, cos_coef)
    return fope_rotate_reference(q, k, positions, freqs, sin_coef, cos_coef)
