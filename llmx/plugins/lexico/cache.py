"""KV caches that keep the most recent tokens exact and older tokens compressed, as transformers ``Cache`` objects
(``model.generate(..., past_key_values=cache)`` works, beam search included).

``CompressedLayer`` holds the exact buffer in ``keys`` / ``values`` (in the model's dtype, or fp16 under a 32-bit
model, as the paper's fp16 models hold them) and the older tokens as a codec's tensors (``codes``, see
``codecs.py``). Each ``update`` appends the new tokens to the buffer, then moves its oldest tokens out to the codec
``chunk`` at a time (the prompt's excess at once, in whole codec granules: a partial KIVI key group stays exact) so
that ``buffer_length`` tokens stay exact.
No storage outlives what it holds: the buffer left after a compression is a fresh tensor, not a view of the prompt.

Attention over the compressed part, per layer: with ``attention="codes"`` (Lexico) the layer returns only the exact
buffer and tags it with the codes, and ``attention.py``'s function scores the codes directly; with
``attention="dense"`` it rebuilds every compressed token (a transient ``[B, H, T, head_dim]`` per layer): the
reference the codes path is tested against, and the only path for KIVI here.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

CODES_ATTR = "llmx_codes"  # attribute on the returned key tensor: (codec, codes) for the attention function
PENDING: dict[int, bool] = {}  # layer index -> codes handed out and not yet read (a lost tag is an error, not silence)


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class CompressedLayer(DynamicLayer):
    def __init__(self, codec, buffer_length: int, chunk: int = 1, buffer_dtype: torch.dtype | None = torch.float16,
                 attention: str = "dense", layer_idx: int | None = None):
        super().__init__()
        if buffer_length < 1:
            raise ValueError("buffer_length must be at least 1 (generate crops the newest token)")
        if attention not in ("dense", "codes") or (attention == "codes" and not hasattr(codec, "attend")):
            raise ValueError(f"attention must be 'dense' or 'codes' (codes needs a codec that attends), got {attention}")
        self.codec, self.buffer_length, self.chunk, self.attention = codec, buffer_length, chunk, attention
        self.buffer_dtype = buffer_dtype  # the exact tokens' storage under a 32-bit model; None: the model's dtype
        self.codes: tuple[torch.Tensor, ...] | None = None
        self.compressed, self.layer_idx = 0, layer_idx

    def lazy_initialization(self, key_states, value_states) -> None:
        super().lazy_initialization(key_states, value_states)
        self.dtype = key_states.dtype  # the model's dtype, returned to attention (transformers >= 5.25 keeps none)
        store = self.buffer_dtype if self.buffer_dtype and key_states.element_size() > 2 else key_states.dtype
        self.keys, self.values = self.keys.to(store), self.values.to(store)

    def _to_compress(self, exact: int) -> int:
        excess = exact - self.buffer_length
        if excess <= 0:
            return 0
        n = excess if self.codes is None else excess - excess % self.chunk  # the prompt's excess at once
        return n - n % self.codec.granule

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        keys = torch.cat([self.keys, key_states.to(self.keys.dtype)], dim=-2)
        values = torch.cat([self.values, value_states.to(self.values.dtype)], dim=-2)
        before = self.codes
        if before is not None and self.attention == "codes":
            out_k, out_v = keys.to(self.dtype), values.to(self.dtype)
            out_k = out_k.view(out_k.shape)  # a fresh tensor object to carry the tag
            setattr(out_k, CODES_ATTR, (self.codec, before))
            if self.layer_idx is not None:
                if PENDING.get(self.layer_idx):
                    raise RuntimeError("the previous step's compressed KV codes were never read: run the model inside "
                                       "lexico.attention.over_codes(model) when the cache attends over codes")
                PENDING[self.layer_idx] = True
        elif before is not None:
            old_k, old_v = self.codec.decode(before, self.dtype)
            out_k, out_v = torch.cat([old_k, keys.to(self.dtype)], -2), torch.cat([old_v, values.to(self.dtype)], -2)
        else:
            out_k, out_v = keys.to(self.dtype), values.to(self.dtype)
        n = self._to_compress(keys.shape[-2])
        if n:
            new = self.codec.encode(keys[..., :n, :], values[..., :n, :])
            self.codes = new if before is None else tuple(torch.cat(pair, dim=2) for pair in zip(before, new, strict=True))
            self.compressed += n
            keys, values = keys[..., n:, :].clone(), values[..., n:, :].clone()
        self.keys, self.values = keys, values
        return out_k, out_v

    def get_seq_length(self) -> int:
        return 0 if not self.is_initialized or self.keys.dim() < 4 else self.compressed + self.keys.shape[-2]

    def reset(self) -> None:
        self.codes, self.compressed = None, 0
        super().reset()

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove and self.get_seq_length() and -tokens_to_remove > self.keys.shape[-2]:
            raise ValueError("cannot crop into the compressed part of the cache")
        super().crop(tokens_to_remove)

    def _batch(self, op) -> None:
        self.keys, self.values = op(self.keys), op(self.values)
        if self.codes is not None:
            self.codes = tuple(op(t) for t in self.codes)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.get_seq_length():
            self._batch(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.get_seq_length():
            self._batch(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.get_seq_length():
            self._batch(lambda t: t[indices.to(t.device) if isinstance(indices, torch.Tensor) else indices, ...])

    def stored_bytes(self) -> int:
        if not self.is_initialized:
            return 0
        return _nbytes((self.keys, self.values)) + (_nbytes(self.codes) if self.codes is not None else 0)


class WindowLayer(DynamicLayer):
    """Token eviction (StreamingLLM-style sliding window): after each update keep the first ``sinks`` tokens and the
    last ``window`` tokens. Positions stay absolute (``get_seq_length`` counts every token seen); the attention mask
    covers only the kept keys."""

    def __init__(self, window: int, sinks: int = 4, store_dtype: torch.dtype | None = torch.float16):
        super().__init__()
        self.window, self.sinks, self.seen, self.store_dtype = window, sinks, 0, store_dtype

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self.dtype = key_states.dtype  # the model's dtype (transformers >= 5.25 keeps none)
            store = self.store_dtype or key_states.dtype
            self.keys, self.values = self.keys.to(store), self.values.to(store)
        self.keys = torch.cat([self.keys, key_states.to(self.keys.dtype)], dim=-2)
        self.values = torch.cat([self.values, value_states.to(self.values.dtype)], dim=-2)
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

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove and self.is_initialized:
            if self.seen > self.keys.shape[-2] and -tokens_to_remove > self.keys.shape[-2] - self.sinks:
                raise ValueError("cannot crop past the evicted part of the cache")
            super().crop(tokens_to_remove)
            self.seen += tokens_to_remove

    def stored_bytes(self) -> int:
        return _nbytes((self.keys, self.values)) if self.is_initialized else 0


class _Measured(Cache):
    def stored_bytes(self) -> int:
        return sum(layer.stored_bytes() for layer in self.layers)

    def dictionary_bytes(self) -> int:
        """Bytes the layers' codecs keep between calls, shared by the sequences (each distinct tensor once): the
        dictionaries and any table; the codecs' workspaces live for one call (in the measured peak, not here)."""
        seen = {}
        for layer in self.layers:
            codec = getattr(layer, "codec", None)
            for t in codec.held() if codec is not None else ():
                seen[id(t)] = t.numel() * t.element_size()
        return sum(seen.values())


class CompressedCache(_Measured):
    """One CompressedLayer per decoder layer; ``codec_for(layer_idx)`` gives each layer its codec."""

    def __init__(self, codec_for, layers: int, buffer_length: int = 128, chunk: int = 1,
                 buffer_dtype: torch.dtype | None = torch.float16, attention: str = "dense"):
        super().__init__(layers=[CompressedLayer(codec_for(i), buffer_length, chunk, buffer_dtype, attention, i)
                                 for i in range(layers)])


class WindowCache(_Measured):
    def __init__(self, layers: int, window: int, sinks: int = 4, store_dtype: torch.dtype | None = torch.float16):
        super().__init__(layers=[WindowLayer(window, sinks, store_dtype) for _ in range(layers)])
