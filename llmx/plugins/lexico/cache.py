"""KV caches that keep the most recent tokens exact and older tokens compressed, as transformers ``Cache`` objects
(``model.generate(..., past_key_values=cache)`` works).

``CompressedLayer`` holds the exact buffer in ``keys`` / ``values`` (the last ``buffer_length`` tokens, stored in fp16
by default, as the paper's fp16 models hold them) and the older
tokens in a codec's compact form; tokens leave the buffer ``chunk`` at a time (the prompt's excess at once).
Attention needs dense keys and values, so each ``update`` rebuilds the compressed part for that layer: a transient
``[B, H, T, head_dim]`` tensor per layer while it runs (peak memory is that plus the stored bytes; the stored bytes
are what ``stored_bytes`` counts). Codecs: Lexico (sparse codes over a per-layer dictionary: int16 atom ids + fp8
coefficients, 3s bytes per vector) and KIVI (keys per channel over token groups, values per token over channel
groups, asymmetric b-bit codes with fp16 scale and zero per group).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

from llmx.plugins.lexico.omp import omp, to_fp8


class LexicoCodec:
    def __init__(self, keys_dict: torch.Tensor, values_dict: torch.Tensor, sparsity: int, fp8: bool = True):
        if keys_dict.shape[1] > 32767:
            raise ValueError("Lexico stores atom ids as int16: at most 32767 atoms")
        self.dicts, self.s, self.fp8 = (keys_dict, values_dict), sparsity, fp8

    def encode(self, x: torch.Tensor, which: int):
        lead = x.shape[:-1]
        idx, coef = omp(self.dicts[which], x.reshape(-1, x.shape[-1]), self.s)
        coef = to_fp8(coef) if self.fp8 else coef.half()
        return idx.to(torch.int16).reshape(*lead, -1), coef.reshape(*lead, -1)

    def decode(self, code, which: int, dtype: torch.dtype) -> torch.Tensor:
        idx, coef = code
        atoms = self.dicts[which].T.to(dtype)[idx.long()]  # [..., s, d]
        return torch.einsum("...s,...sd->...d", coef.to(dtype), atoms)

    def nbytes(self, code) -> int:
        return sum(t.numel() * t.element_size() for t in code)


class KIVICodec:
    """KIVI (Liu et al., 2024): keys quantized per channel across groups of ``group`` tokens, values per token across
    groups of ``group`` channels; asymmetric ``bits``-bit integers with fp16 scale and zero per group."""

    def __init__(self, bits: int, group: int = 32):
        self.bits, self.group = bits, group

    def _quant(self, x: torch.Tensor, dim: int):
        g = self.group
        xt = x.transpose(dim, -1)
        shape = xt.shape
        n = shape[-1]
        pad = -n % g
        xg = torch.nn.functional.pad(xt.float(), (0, pad)).reshape(*shape[:-1], -1, g)
        lo, hi = xg.amin(-1, keepdim=True), xg.amax(-1, keepdim=True)
        scale = ((hi - lo) / (2**self.bits - 1)).clamp(min=1e-8)
        q = torch.round((xg - lo) / scale).clamp(0, 2**self.bits - 1).to(torch.uint8)
        return q, scale.half(), lo.half(), n, dim

    def encode(self, x: torch.Tensor, which: int):
        return self._quant(x, -2 if which == 0 else -1)  # keys along time (per channel), values along channels

    def decode(self, code, which: int, dtype: torch.dtype) -> torch.Tensor:
        q, scale, lo, n, dim = code
        x = (q.float() * scale.float() + lo.float()).reshape(*q.shape[:-2], -1)[..., :n]
        return x.transpose(dim, -1).to(dtype)

    def nbytes(self, code) -> int:
        q, scale, lo, _, _ = code
        return q.numel() * self.bits // 8 + scale.numel() * 2 + lo.numel() * 2


def append_stored(layer: DynamicLayer, key_states, value_states, store_dtype: torch.dtype | None) -> None:
    """Append new tokens to ``layer.keys`` / ``layer.values`` kept in ``store_dtype`` (None: the model's dtype)."""
    if not layer.is_initialized:
        layer.lazy_initialization(key_states, value_states)
        store = store_dtype or key_states.dtype
        layer.keys, layer.values = layer.keys.to(store), layer.values.to(store)
    layer.keys = torch.cat([layer.keys, key_states.to(layer.keys.dtype)], dim=-2)
    layer.values = torch.cat([layer.values, value_states.to(layer.values.dtype)], dim=-2)


class CompressedLayer(DynamicLayer):
    def __init__(self, codec, buffer_length: int, chunk: int, buffer_dtype: torch.dtype | None = torch.float16):
        super().__init__()
        self.codec, self.buffer_length, self.chunk = codec, buffer_length, chunk
        self.buffer_dtype = buffer_dtype  # the exact tokens' storage (fp16, as the paper's models); None: model dtype
        self.codes: list[tuple] = []  # (keys code, values code, tokens)

    def _compressed_len(self) -> int:
        return sum(n for _, _, n in self.codes)

    def update(self, key_states, value_states, *args, **kwargs):
        append_stored(self, key_states, value_states, self.buffer_dtype)
        out_k = torch.cat([self.codec.decode(c, 0, self.dtype) for c, _, _ in self.codes] + [self.keys.to(self.dtype)], -2)
        out_v = torch.cat([self.codec.decode(c, 1, self.dtype) for _, c, _ in self.codes] + [self.values.to(self.dtype)], -2)
        excess = self.keys.shape[-2] - self.buffer_length
        if excess >= self.chunk or (excess > 0 and not self.codes):
            n = excess if not self.codes else excess - excess % self.chunk
            self.codes.append((self.codec.encode(self.keys[..., :n, :].float(), 0),
                               self.codec.encode(self.values[..., :n, :].float(), 1), n))
            self.keys, self.values = self.keys[..., n:, :], self.values[..., n:, :]
        return out_k, out_v

    def get_seq_length(self) -> int:
        return 0 if not self.is_initialized else self._compressed_len() + self.keys.shape[-2]

    def reset(self) -> None:
        self.codes = []
        super().reset()

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove and -tokens_to_remove > self.keys.shape[-2]:
            raise ValueError("cannot crop into the compressed part of the cache")
        super().crop(tokens_to_remove)

    def stored_bytes(self) -> int:
        exact = (self.keys.numel() + self.values.numel()) * self.keys.element_size() if self.is_initialized else 0
        return exact + sum(self.codec.nbytes(k) + self.codec.nbytes(v) for k, v, _ in self.codes)


class WindowLayer(DynamicLayer):
    """Token eviction (StreamingLLM-style sliding window): after each update keep the first ``sinks`` tokens and the
    last ``window`` tokens. Positions stay absolute (``get_seq_length`` counts every token seen); the attention mask
    covers only the kept keys."""

    def __init__(self, window: int, sinks: int = 4, store_dtype: torch.dtype | None = torch.float16):
        super().__init__()
        self.window, self.sinks, self.seen, self.store_dtype = window, sinks, 0, store_dtype

    def update(self, key_states, value_states, *args, **kwargs):
        append_stored(self, key_states, value_states, self.store_dtype)
        out_k, out_v = self.keys.to(self.dtype), self.values.to(self.dtype)
        self.seen += key_states.shape[-2]
        keep = self.sinks + self.window
        if self.keys.shape[-2] > keep:
            self.keys = torch.cat([self.keys[..., : self.sinks, :], self.keys[..., -self.window:, :]], dim=-2)
            self.values = torch.cat([self.values[..., : self.sinks, :], self.values[..., -self.window:, :]], dim=-2)
        return out_k, out_v

    def get_seq_length(self) -> int:
        return self.seen if self.is_initialized else 0

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        kept = self.keys.shape[-2] if self.is_initialized else 0
        return kept + query_length, 0

    def reset(self) -> None:
        self.seen = 0
        super().reset()

    def stored_bytes(self) -> int:
        return (self.keys.numel() + self.values.numel()) * self.keys.element_size() if self.is_initialized else 0


class CompressedCache(Cache):
    """One CompressedLayer per decoder layer; ``codec_for(layer_idx)`` gives each layer its codec."""

    def __init__(self, codec_for, layers: int, buffer_length: int = 128, chunk: int = 1,
                 buffer_dtype: torch.dtype | None = torch.float16):
        super().__init__(layers=[CompressedLayer(codec_for(i), buffer_length, chunk, buffer_dtype)
                                 for i in range(layers)])

    def stored_bytes(self) -> int:
        return sum(layer.stored_bytes() for layer in self.layers)


class WindowCache(Cache):
    def __init__(self, layers: int, window: int, sinks: int = 4, store_dtype: torch.dtype | None = torch.float16):
        super().__init__(layers=[WindowLayer(window, sinks, store_dtype) for _ in range(layers)])

    def stored_bytes(self) -> int:
        return sum(layer.stored_bytes() for layer in self.layers)
