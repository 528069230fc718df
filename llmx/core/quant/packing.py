"""Dense bit packing of integer codes: eight ``b``-bit codes fill exactly ``b`` bytes (int4: two per byte)."""

from __future__ import annotations

import torch


def pack(codes: torch.Tensor, bits: int, offset: int = 0) -> torch.Tensor:
    """Pack codes (any int dtype, values in ``[-offset, 2**bits - offset)``) along the last dim into uint8.
    The last dim is zero-padded to a multiple of 8."""
    if not 1 <= bits <= 8:
        raise ValueError(f"bits must be 1..8, got {bits}")
    u = (codes.to(torch.int64) + offset)
    if int(u.min()) < 0 or int(u.max()) >= 2**bits:
        raise ValueError(f"codes out of range for {bits}-bit packing")
    pad = -u.shape[-1] % 8
    if pad:
        u = torch.nn.functional.pad(u, (0, pad))
    u = u.reshape(*u.shape[:-1], -1, 8)
    word = torch.zeros(u.shape[:-1], dtype=torch.int64, device=u.device)
    for i in range(8):
        word |= u[..., i] << (bits * i)
    out = torch.stack([(word >> (8 * k)) & 0xFF for k in range(bits)], dim=-1)
    return out.reshape(*u.shape[:-2], -1).to(torch.uint8)


def unpack(packed: torch.Tensor, bits: int, n: int, offset: int = 0) -> torch.Tensor:
    """Inverse of :func:`pack`: the first ``n`` codes of the last dim, as int16."""
    if bits in (1, 2, 4, 8):  # byte-aligned: code i of byte k sits at bits [i*b, (i+1)*b)
        per_byte = 8 // bits
        p = packed.to(torch.int16)
        u = torch.stack([(p >> (bits * i)) & ((1 << bits) - 1) for i in range(per_byte)], dim=-1)
        return u.reshape(*packed.shape[:-1], -1)[..., :n] - offset
    p = packed.to(torch.int64).reshape(*packed.shape[:-1], -1, bits)
    word = torch.zeros(p.shape[:-1], dtype=torch.int64, device=packed.device)
    for k in range(bits):
        word |= p[..., k] << (8 * k)
    mask = (1 << bits) - 1
    u = torch.stack([(word >> (bits * i)) & mask for i in range(8)], dim=-1)
    return (u.reshape(*u.shape[:-2], -1)[..., :n] - offset).to(torch.int16)
