"""Attention over the interpreter's interleaved cache from visibility tables instead of a dense mask: slot s has an
owner thread ``owner[s]`` and query row t sees s iff ``s < limit[t, owner[s]]`` (``interpreter.Thread.limits``).
CUDA tensors go to the CuPy kernel ``kernels/segment_attention.cu``; everything else (and the kernel's test) to the
reference: SDPA on the dense mask the tables define. ``register()`` makes it a transformers attention implementation
(``AttentionInterface``) that reads the tables from the forward's ``pasta_owner`` / ``pasta_limit`` keywords."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from llmx.core import kernels

NAME = "pasta_segments"
SOURCE = Path(__file__).resolve().parent / "kernels" / "segment_attention.cu"
BIG = 1 << 30  # "every slot of this owner"
PREFILL = 64  # more query rows than this (a prefill) go to SDPA: the kernel's scratch is rows x heads x slots


def dense(owner: torch.Tensor, limit: torch.Tensor) -> torch.Tensor:
    """[T, S] bool: the mask the tables define."""
    slots = torch.arange(owner.shape[0], device=owner.device)
    return limit.gather(1, owner.long()[None].expand(limit.shape[0], -1)) > slots[None]


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, owner: torch.Tensor, limit: torch.Tensor,
              scale: float) -> torch.Tensor:
    """q [Hq, T, D], k and v [Hkv, S, D] -> [T, Hq, D], by SDPA on the dense mask."""
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=dense(owner, limit)[None], scale=scale,
                                         enable_gqa=q.shape[0] != k.shape[0])
    return out.transpose(0, 1)


def segment_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, owner: torch.Tensor, limit: torch.Tensor,
                      scale: float) -> torch.Tensor:
    """The kernel on CUDA tensors of a decode step, else the reference; same shapes and result. The kernel reads
    float32 (a half-precision cache is converted for it)."""
    if not kernels.use_kernel(q, k, v) or q.shape[1] > PREFILL:
        return reference(q, k, v, owner, limit, scale)
    import cupy

    dtype = q.dtype
    q, k, v = (x.float().contiguous() for x in (q, k, v))
    owner, limit = owner.int().contiguous(), limit.int().contiguous()
    hq, t, d = q.shape
    hkv, s, _ = k.shape
    out = torch.empty(t, hq, d, device=q.device)
    scratch = torch.empty(t, hq, s, device=q.device)
    kernels.launch(SOURCE, "pasta_segment_attention", (t, hq), (128,),
                   (q.data_ptr(), k.data_ptr(), v.data_ptr(), owner.data_ptr(), limit.data_ptr(), out.data_ptr(),
                    scratch.data_ptr(), cupy.int32(t), cupy.int32(s), cupy.int32(hq), cupy.int32(hkv), cupy.int32(d),
                    cupy.int32(limit.shape[1]), cupy.float32(scale)), like=q)
    return out.to(dtype)


def _attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention signature: query [1, Hq, T, D], key and value [1, Hkv, S, D] -> ([1, T, Hq, D], None)."""
    owner, limit = kwargs["pasta_owner"], kwargs["pasta_limit"]
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return segment_attention(query[0], key[0], value[0], owner, limit, scale)[None], None


def register() -> str:
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, _attention)
    return NAME
