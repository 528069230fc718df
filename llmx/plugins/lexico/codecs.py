"""What a compressed KV cache stores per token, and how it is read back.

A codec turns ``n`` tokens of keys and values (``[B, H, n, head_dim]``, ``n`` a multiple of its ``granule``) into a
tuple of tensors, every one with the batch on dim 0 and time (tokens or token groups) on dim 2, so that a cache can
concatenate, reorder and select them without knowing the codec.

- ``LexicoCodec`` (arXiv 2412.08890, Sec. 3): per vector, ``s`` atom ids (int16) and ``s`` coefficients (float8
  e4m3) over the layer's key or value dictionary; separate key and value sparsity as in the official cache. It also
  attends over its codes without rebuilding them (``attend``).
- ``KIVICodec`` (Liu et al., 2024): keys per channel over groups of ``group`` tokens, values per token over groups of
  ``group`` channels, asymmetric ``bits``-bit integers packed ``8 / bits`` to a byte, fp16 scale and zero per group.
"""

from __future__ import annotations

import torch

from llmx.plugins.lexico.omp import held_tables, omp, to_float, to_fp8

GATHER_ELEMENTS = 1 << 16  # bound on the (heads x query rows x code slots) ``LexicoCodec.attend`` gathers at once
ENCODE_CHUNK = 64  # vectors per OMP pass when the cache compresses on the CPU (CUDA sizes its passes by memory)


class LexicoCodec:
    granule = 1

    def __init__(self, keys_dict: torch.Tensor, values_dict: torch.Tensor, key_sparsity: int,
                 value_sparsity: int | None = None, fp8: bool = True, tol: float | None = None):
        if max(keys_dict.shape[1], values_dict.shape[1]) > 32767:
            raise ValueError("Lexico stores atom ids as int16: at most 32767 atoms")
        self.dicts = (keys_dict, values_dict)
        self.sparsity = (key_sparsity, value_sparsity or key_sparsity)
        self.fp8, self.tol = fp8, tol

    def _dict(self, which: int, like: torch.Tensor) -> torch.Tensor:
        d = self.dicts[which]
        if d.device != like.device:  # moved once, then kept where the model runs
            d = d.to(like.device)
            self.dicts = (d, self.dicts[1]) if which == 0 else (self.dicts[0], d)
        return d

    def _encode(self, x: torch.Tensor, which: int) -> tuple[torch.Tensor, torch.Tensor]:
        lead = x.shape[:-1]
        s = min(self.sparsity[which], x.shape[-1])  # past head_dim OMP has nothing left to take: store no empty slots
        idx, coef = omp(self._dict(which, x), x.reshape(-1, x.shape[-1]).float(), s, self.tol,
                        chunk=None if x.is_cuda else ENCODE_CHUNK)
        coef = to_fp8(coef) if self.fp8 else coef.half()
        return idx.to(torch.int16).reshape(*lead, -1), coef.reshape(*lead, -1)

    def encode(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (*self._encode(keys, 0), *self._encode(values, 1))

    def _decode(self, idx, coef, which: int, dtype: torch.dtype) -> torch.Tensor:
        atoms = self._dict(which, coef).T[idx.long()].to(dtype)  # [..., s, d]
        return torch.einsum("...s,...sd->...d", to_float(coef).to(dtype), atoms)

    def decode(self, codes, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return self._decode(codes[0], codes[1], 0, dtype), self._decode(codes[2], codes[3], 1, dtype)

    def held(self) -> tuple[torch.Tensor, ...]:
        """Every tensor the codec keeps between calls: its dictionaries and the fp8 decoding table (OMP's workspaces
        live for one call)."""
        return (*self.dicts, *(held_tables(self.dicts[0].device) if self.fp8 else ()))

    def attend(self, query, buffer_keys, buffer_values, codes, mask, scaling: float) -> torch.Tensor:
        """Attention over compressed tokens followed by the exact buffer, without rebuilding the compressed ones:
        a key's score is ``sum_j c_j (q D_k)[id_j]`` (the query projected once onto the atoms, then gathered at the
        stored ids), and the values' contribution is ``D_v w`` with ``w`` the attention weights scattered onto the
        atoms (an N-vector per query). ``query`` [B, Hq, Tq, d]; returns [B, Tq, Hq, d] like transformers' attention
        functions."""
        kid, kc, vid, vc = codes
        B, Hq, Tq, d = query.shape
        Hkv, Tc, Tb = buffer_keys.shape[1], kid.shape[2], buffer_keys.shape[2]
        g = Hq // Hkv
        q = query.reshape(B, Hkv, g * Tq, d).float() * scaling
        Dk, Dv = self._dict(0, q), self._dict(1, q)  # in their own dtype: no per-step conversion
        rows, span = _tiles(B * Hkv, g * Tq, Tc, max(kid.shape[-1], vid.shape[-1]))
        scores_c = torch.empty(B, Hkv, g * Tq, Tc, device=q.device)
        for r0 in range(0, g * Tq, rows):
            qd = q[:, :, r0:r0 + rows].to(Dk.dtype) @ Dk  # [B, Hkv, r, N]: the query on every atom, once
            for t0 in range(0, Tc, span):
                t1 = min(t0 + span, Tc)
                ids, coef = kid[:, :, t0:t1], to_float(kc[:, :, t0:t1])  # [B, Hkv, t, s]
                picked = qd.gather(-1, ids.long().flatten(2)[:, :, None].expand(-1, -1, qd.shape[2], -1))
                scores_c[:, :, r0:r0 + rows, t0:t1] = (picked.float().unflatten(-1, ids.shape[2:])
                                                       * coef[:, :, None]).sum(-1)
        scores = torch.cat([scores_c, q @ buffer_keys.float().transpose(-1, -2)], -1)  # [B, Hkv, g*Tq, Tc+Tb]
        if mask is not None:  # [B, 1, Tq, Tc + Tb], boolean (True: attend) or additive
            if mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[-1] != Tc + Tb:
                raise ValueError(f"mask of shape {tuple(mask.shape)} does not cover {Tc} compressed + {Tb} exact keys")
            m = mask.reshape(mask.shape[0], 1, 1, Tq, -1)
            s5 = scores.view(B, Hkv, g, Tq, Tc + Tb)
            s5 = s5.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else s5 + m.float()
            scores = s5.reshape(B, Hkv, g * Tq, Tc + Tb)
        weights = scores.softmax(-1)
        out = weights[..., Tc:] @ buffer_values.float()
        mass = torch.zeros(B, Hkv, g * Tq, Dv.shape[1], device=q.device)  # attention mass on each value atom
        for r0 in range(0, g * Tq, rows):
            for t0 in range(0, Tc, span):
                t1 = min(t0 + span, Tc)
                ids, coef = vid[:, :, t0:t1], to_float(vc[:, :, t0:t1])
                part = (weights[:, :, r0:r0 + rows, t0:t1, None] * coef[:, :, None]).flatten(3)
                mass[:, :, r0:r0 + rows].scatter_add_(-1, ids.long().flatten(2)[:, :, None].expand_as(part), part)
        out = out + (mass.to(Dv.dtype) @ Dv.T).float()
        return out.view(B, Hkv, g, Tq, d).reshape(B, Hq, Tq, d).transpose(1, 2).to(query.dtype).contiguous()


def _tiles(heads: int, rows: int, tokens: int, slots: int) -> tuple[int, int]:
    """Query rows and compressed tokens per tile so that a tile gathers at most ``GATHER_ELEMENTS`` code slots (over
    heads and rows): the transient memory of ``attend`` stays bounded whatever the context length."""
    per_row = heads * max(tokens, 1) * slots
    if per_row <= GATHER_ELEMENTS:
        return max(1, GATHER_ELEMENTS // per_row), max(tokens, 1)
    return 1, max(1, GATHER_ELEMENTS // (heads * slots))


def _pack(q: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 codes in [0, 2^bits) along the last dim -> ``8 / bits`` codes per byte."""
    per = 8 // bits
    q = q.reshape(*q.shape[:-1], -1, per)
    shifts = torch.arange(0, 8, bits, device=q.device, dtype=torch.uint8)
    return (q << shifts).sum(-1, dtype=torch.uint8)


def _unpack(packed: torch.Tensor, bits: int) -> torch.Tensor:
    shifts = torch.arange(0, 8, bits, device=packed.device, dtype=torch.uint8)
    return ((packed[..., None] >> shifts) & (2**bits - 1)).reshape(*packed.shape[:-1], -1)


class KIVICodec:
    """KIVI: keys per channel over ``group``-token groups (the exact buffer keeps a partial group in fp16 until it
    fills, as KIVI's residual does), values per token over ``group``-channel groups; codes packed to bytes."""

    def __init__(self, bits: int, group: int = 32):
        if 8 % bits:
            raise ValueError(f"KIVI packs codes into bytes: bits must be 1, 2, 4 or 8, got {bits}")
        self.bits, self.group, self.granule = bits, group, group

    def _quant(self, x: torch.Tensor, dim: int):
        lo, hi = x.amin(dim, keepdim=True), x.amax(dim, keepdim=True)
        scale = ((hi - lo) / (2**self.bits - 1)).clamp(min=1e-6).half()  # stored in fp16: quantise with what is read
        lo = lo.half()
        q = torch.round((x - lo.float()) / scale.float()).clamp(0, 2**self.bits - 1).to(torch.uint8)
        return q, scale.squeeze(dim), lo.squeeze(dim)

    def encode(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        B, H, n, d = keys.shape
        vg = min(self.group, d)
        if d % vg:
            raise ValueError(f"KIVI value groups of {vg} channels do not divide head_dim {d}")
        kq, ks, kz = self._quant(keys.float().reshape(B, H, n // self.group, self.group, d), 3)
        vq, vs, vz = self._quant(values.float().reshape(B, H, n, d // vg, vg), 4)
        return (_pack(kq.reshape(B, H, n // self.group, -1), self.bits), ks, kz,
                _pack(vq.reshape(B, H, n, -1), self.bits), vs, vz)

    def decode(self, codes, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        kp, ks, kz, vp, vs, vz = codes
        B, H, groups, d = ks.shape
        k = _unpack(kp, self.bits).reshape(B, H, groups, self.group, d).float() * ks[:, :, :, None].float() \
            + kz[:, :, :, None].float()
        n, vgroups = vs.shape[2], vs.shape[3]
        v = _unpack(vp, self.bits).reshape(B, H, n, vgroups, -1).float() * vs[..., None].float() + vz[..., None].float()
        return k.reshape(B, H, groups * self.group, d).to(dtype), v.reshape(B, H, n, -1).to(dtype)

    def held(self) -> tuple[torch.Tensor, ...]:
        return ()
