"""What a compressed KV cache stores per token, and how attention reads it back.

A codec turns ``n`` tokens of keys (``[B, H, n, head_dim]``, ``n`` a multiple of its ``granule``) or of values into
a tuple of tensors, every one with the batch on dim 0 and time (tokens or token groups) on dim 2, so that a cache can
concatenate, reorder and select them without knowing the codec; keys and values are encoded apart (their counts may
differ). ``official_rule`` is the buffer rule of the method's own code (``buffers.py``); ``attend`` computes attention
over the codes followed by the exact buffers without rebuilding the compressed tokens.

- ``LexicoCodec`` (arXiv 2412.08890, Sec. 3): per vector, ``s`` atom ids (int16) and ``s`` coefficients (float8
  e4m3) over the layer's key or value dictionary; separate key and value sparsity as in the official cache.
- ``KIVICodec`` (Liu et al., 2024): keys per channel over groups of ``group`` tokens (padding left out of a group's
  statistics), values per token over groups of ``group`` channels, asymmetric ``bits``-bit integers packed
  ``8 / bits`` to a byte, fp16 scale and zero per group.
"""

from __future__ import annotations

import torch

from llmx.plugins.lexico.buffers import KIVIRule, LexicoRule
from llmx.plugins.lexico.omp import held_tables, omp, to_float, to_fp8

GATHER_ELEMENTS = 1 << 16  # bound on the (heads x query rows x code slots) ``LexicoCodec.attend`` gathers at once
DEQUANT_ELEMENTS = 1 << 18  # bound on the float32 elements of a KIVI block ``KIVICodec.attend`` dequantizes at once
DEQUANT_SPLIT = 8  # and on its tokens: an eighth of the quantized ones (a small cache's transient stays small)
ENCODE_CHUNK = 64  # vectors per OMP pass when the cache compresses on the CPU (CUDA sizes its passes by memory)


def _softmax(scores: torch.Tensor, mask: torch.Tensor | None, g: int, Tq: int) -> torch.Tensor:
    """Attention weights from ``scores`` ``[B, Hkv, g * Tq, T]`` (query heads grouped by KV head) under a
    transformers mask ``[B, 1, Tq, T]``, boolean (True: attend) or additive."""
    B, Hkv, _, T = scores.shape
    if mask is not None:
        if mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[-1] != T:
            raise ValueError(f"mask of shape {tuple(mask.shape)} does not cover the {T} cached keys")
        m = mask.reshape(mask.shape[0], 1, 1, Tq, T)
        s5 = scores.view(B, Hkv, g, Tq, T)
        s5 = s5.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else s5 + m.float()
        scores = s5.reshape(B, Hkv, g * Tq, T)
    return scores.softmax(-1)


def _heads(out: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    """``[B, Hkv, g * Tq, d]`` back to ``[B, Tq, Hq, d]`` in the query's dtype, as transformers' attention returns."""
    B, Hq, Tq, d = query.shape
    return out.view(B, -1, Hq // out.shape[1], Tq, d).reshape(B, Hq, Tq, d).transpose(1, 2).to(query.dtype) \
        .contiguous()


class LexicoCodec:
    granule = 1

    def __init__(self, keys_dict: torch.Tensor, values_dict: torch.Tensor, key_sparsity: int,
                 value_sparsity: int | None = None, fp8: bool = True, tol: float | None = None):
        if max(keys_dict.shape[1], values_dict.shape[1]) > 32767:
            raise ValueError("Lexico stores atom ids as int16: at most 32767 atoms")
        self.dicts = (keys_dict, values_dict)
        self.sparsity = (key_sparsity, value_sparsity or key_sparsity)
        self.fp8, self.tol = fp8, tol

    @staticmethod
    def official_rule(buffer_length: int, chunk: int) -> LexicoRule:
        return LexicoRule(buffer_length, chunk)

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

    def encode_keys(self, keys: torch.Tensor, valid: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """Each vector on its own: padding (``valid``) changes no other vector's code."""
        return self._encode(keys, 0)

    def encode_values(self, values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self._encode(values, 1)

    def _decode(self, codes, which: int, dtype: torch.dtype) -> torch.Tensor:
        idx, coef = codes
        atoms = self._dict(which, coef).T[idx.long()].to(dtype)  # [..., s, d]
        return torch.einsum("...s,...sd->...d", to_float(coef).to(dtype), atoms)

    def decode_keys(self, codes, dtype: torch.dtype) -> torch.Tensor:
        return self._decode(codes, 0, dtype)

    def decode_values(self, codes, dtype: torch.dtype) -> torch.Tensor:
        return self._decode(codes, 1, dtype)

    def held(self) -> tuple[torch.Tensor, ...]:
        """Every tensor the codec keeps between calls: its dictionaries and the fp8 decoding table (OMP's workspaces
        live for one call)."""
        return (*self.dicts, *(held_tables(self.dicts[0].device) if self.fp8 else ()))

    def attend(self, query, buffer_keys, buffer_values, key_codes, value_codes, mask, scaling: float) -> torch.Tensor:
        """Attention over compressed tokens followed by the exact buffer, without rebuilding the compressed ones:
        a key's score is ``sum_j c_j (q D_k)[id_j]`` (the query projected once onto the atoms, then gathered at the
        stored ids), and the values' contribution is ``D_v w`` with ``w`` the attention weights scattered onto the
        atoms (an N-vector per query). Keys and values cover the same tokens (Lexico's buffer rules move both).
        ``query`` [B, Hq, Tq, d]; returns [B, Tq, Hq, d] like transformers' attention functions."""
        (kid, kc), (vid, vc) = key_codes, value_codes
        B, Hq, Tq, d = query.shape
        Hkv, Tc = buffer_keys.shape[1], kid.shape[2]
        g = Hq // Hkv
        q = query.reshape(B, Hkv, g * Tq, d).float() * scaling
        Dk, Dv = self._dict(0, q), self._dict(1, q)  # in their own dtype: no per-step conversion
        rows, span = _tiles(B * Hkv, g * Tq, Tc, max(kid.shape[-1], vid.shape[-1]))
        scores_c = torch.empty(B, Hkv, g * Tq, Tc, device=q.device)
        for r0 in range(0, g * Tq, rows):
            qd = q[:, :, r0:r0 + rows].to(Dk.dtype) @ Dk  # [B, Hkv, r, N]: the query on every atom, once
            for t0 in range(0, Tc, span):
                ids, coef = kid[:, :, t0:t0 + span], to_float(kc[:, :, t0:t0 + span])  # [B, Hkv, t, s]
                picked = qd.gather(-1, ids.long().flatten(2)[:, :, None].expand(-1, -1, qd.shape[2], -1))
                scores_c[:, :, r0:r0 + rows, t0:t0 + span] = (picked.float().unflatten(-1, ids.shape[2:])
                                                              * coef[:, :, None]).sum(-1)
        weights = _softmax(torch.cat([scores_c, q @ buffer_keys.float().transpose(-1, -2)], -1), mask, g, Tq)
        out = weights[..., Tc:] @ buffer_values.float()
        mass = torch.zeros(B, Hkv, g * Tq, Dv.shape[1], device=q.device)  # attention mass on each value atom
        for r0 in range(0, g * Tq, rows):
            for t0 in range(0, Tc, span):
                t1 = min(t0 + span, Tc)  # the weights go on to the buffer's
                ids, coef = vid[:, :, t0:t1], to_float(vc[:, :, t0:t1])
                part = (weights[:, :, r0:r0 + rows, t0:t1, None] * coef[:, :, None]).flatten(3)
                mass[:, :, r0:r0 + rows].scatter_add_(-1, ids.long().flatten(2)[:, :, None].expand_as(part), part)
        return _heads(out + (mass.to(Dv.dtype) @ Dv.T).float(), query)


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
    """The codes of ``_pack`` as float32, read through a table of every byte's codes (one gather, no shifts)."""
    shifts = torch.arange(0, 8, bits, device=packed.device, dtype=torch.uint8)
    table = ((torch.arange(256, device=packed.device, dtype=torch.uint8)[:, None] >> shifts) & (2**bits - 1)).float()
    return table.index_select(0, packed.reshape(-1).int()).view(*packed.shape[:-1], -1)


class KIVICodec:
    """KIVI: keys per channel over ``group``-token groups, values per token over ``group``-channel groups; codes packed
    to bytes. Its official buffer (``KIVIRule``) quantizes keys a residual of whole groups at a time."""

    def __init__(self, bits: int, group: int = 32):
        if 8 % bits:
            raise ValueError(f"KIVI packs codes into bytes: bits must be 1, 2, 4 or 8, got {bits}")
        self.bits, self.group, self.granule = bits, group, group

    def official_rule(self, buffer_length: int, chunk: int) -> KIVIRule:
        return KIVIRule(buffer_length, self.group)

    def _quant(self, x: torch.Tensor, dim: int, valid: torch.Tensor | None = None):
        """Asymmetric integers over ``dim`` between its min and max, taken over the ``valid`` entries (padding is left
        out; a group of padding alone gets zero 0 and the least scale: masked keys, read as about 0)."""
        lo = (x if valid is None else x.masked_fill(~valid, float("inf"))).amin(dim, keepdim=True)
        hi = (x if valid is None else x.masked_fill(~valid, float("-inf"))).amax(dim, keepdim=True)
        if valid is not None:
            some = valid.any(dim, keepdim=True)
            lo, hi = lo.where(some, 0.0), hi.where(some, 0.0)
        scale = ((hi - lo) / (2**self.bits - 1)).clamp(min=1e-6).half()  # stored in fp16: quantise with what is read
        lo = lo.half()
        q = torch.round((x - lo.float()) / scale.float()).clamp(0, 2**self.bits - 1).to(torch.uint8)
        return q, scale.squeeze(dim), lo.squeeze(dim)

    def encode_keys(self, keys: torch.Tensor, valid: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """``valid`` ``[B, n]``: which tokens are not padding (None: all)."""
        B, H, n, d = keys.shape
        mask = None if valid is None else valid.reshape(B, 1, n // self.group, self.group, 1)
        kq, ks, kz = self._quant(keys.float().reshape(B, H, n // self.group, self.group, d), 3, mask)
        return _pack(kq.reshape(B, H, n // self.group, -1), self.bits), ks, kz

    def encode_values(self, values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        B, H, n, d = values.shape
        vg = min(self.group, d)
        if d % vg:
            raise ValueError(f"KIVI value groups of {vg} channels do not divide head_dim {d}")
        vq, vs, vz = self._quant(values.float().reshape(B, H, n, d // vg, vg), 4)
        return _pack(vq.reshape(B, H, n, -1), self.bits), vs, vz

    def _keys(self, codes, g0: int, g1: int) -> torch.Tensor:
        """Key groups ``g0 .. g1`` dequantized, float32 ``[B, H, tokens, d]``."""
        kp, ks, kz = (t[:, :, g0:g1] for t in codes)
        B, H, groups, d = ks.shape
        k = torch.addcmul(kz[:, :, :, None].float(), _unpack(kp, self.bits).view(B, H, groups, self.group, d),
                          ks[:, :, :, None].float())
        return k.view(B, H, groups * self.group, d)

    def _values(self, codes, t0: int, t1: int) -> torch.Tensor:
        """Value tokens ``t0 .. t1`` dequantized, float32 ``[B, H, tokens, d]``."""
        vp, vs, vz = (t[:, :, t0:t1] for t in codes)
        B, H, n, groups = vs.shape
        v = torch.addcmul(vz[..., None].float(), _unpack(vp, self.bits).view(B, H, n, groups, -1), vs[..., None].float())
        return v.view(B, H, n, -1)

    def decode_keys(self, codes, dtype: torch.dtype) -> torch.Tensor:
        return self._keys(codes, 0, codes[1].shape[2]).to(dtype)

    def decode_values(self, codes, dtype: torch.dtype) -> torch.Tensor:
        return self._values(codes, 0, codes[1].shape[2]).to(dtype)

    def held(self) -> tuple[torch.Tensor, ...]:
        return ()

    def attend(self, query, buffer_keys, buffer_values, key_codes, value_codes, mask, scaling: float) -> torch.Tensor:
        """``softmax(q K^T) V`` over the quantized tokens then the exact buffers (either side may hold none yet),
        dequantizing a block of tokens at a time (whole key groups; at most ``DEQUANT_ELEMENTS`` float32 and an
        eighth of the tokens), multiplying and dropping it: the dense prefix never exists. Scores ``q . dequant(K)``
        per key block; the output accumulates ``softmax . dequant(V)`` per value block. ``query`` [B, Hq, Tq, d];
        returns [B, Tq, Hq, d]."""
        B, Hq, Tq, d = query.shape
        Hkv = buffer_keys.shape[1]
        g = Hq // Hkv
        q = query.reshape(B, Hkv, g * Tq, d).float() * scaling
        groups = 0 if key_codes is None else key_codes[1].shape[2]
        Tv = 0 if value_codes is None else value_codes[1].shape[2]
        tokens = max(min(DEQUANT_ELEMENTS // (B * Hkv * d), -(-max(groups * self.group, Tv) // DEQUANT_SPLIT)), 1)
        blocks = max(tokens // self.group, 1)  # key groups per block
        scores = [q @ self._keys(key_codes, g0, g0 + blocks).transpose(-1, -2) for g0 in range(0, groups, blocks)]
        weights = _softmax(torch.cat([*scores, q @ buffer_keys.float().transpose(-1, -2)], -1), mask, g, Tq)
        out = weights[..., Tv:] @ buffer_values.float()
        for t0 in range(0, Tv, tokens):
            t1 = min(t0 + tokens, Tv)  # the weights go on to the buffer's
            out += weights[..., t0:t1] @ self._values(value_codes, t0, t1)
        return _heads(out, query)
