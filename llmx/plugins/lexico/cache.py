"""KV caches that keep the most recent tokens exact and older tokens compressed, as transformers ``Cache`` objects
(``model.generate(..., past_key_values=cache)`` works, beam search included).

``CompressedLayer`` holds the exact buffers in ``keys`` / ``values`` (in the model's dtype, or fp16 under a 32-bit
model, as the paper's fp16 models hold them) and the older tokens as a codec's tensors (``key_codes``,
``value_codes``, see ``codecs.py``). Each ``update`` appends the new tokens to the buffers, then hands the oldest to
the codec as the buffer rule says (``buffers.py``: each method's official rule by default, llmx's earlier
"at least ``buffer_length`` exact" as ``buffer="at_least"``); keys and values may keep different counts exact (KIVI).
No storage outlives what it holds: a buffer left after a compression is a fresh tensor, not a view of the prompt.
``padding`` (the prompt's attention mask, 0 at padding) keeps padded positions out of the statistics a codec takes over
several tokens (KIVI's per-channel key groups).

Attention over the compressed part, per layer: with ``attention="codes"`` the layer returns only the exact buffers,
the key tagged with this step's codes, and ``attention.py``'s function hands them to the codec's ``attend`` (Lexico:
scores gathered from the codes; KIVI: a block of tokens dequantized at a time), which must read them before the
cache's next update (the cache checks: codes left unread mean the model ran outside ``over_codes`` or the tag was
lost); with ``attention="dense"`` it rebuilds every compressed token (a transient ``[B, H, T, head_dim]`` per layer):
the reference the codes path is tested against.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

from llmx.plugins.lexico.buffers import AtLeast

CODES_ATTR = "llmx_codes"  # attribute on the returned key tensor: (layer, key codes, value codes) for attention


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _append(codes, new):
    return new if codes is None else tuple(torch.cat(pair, dim=2) for pair in zip(codes, new, strict=True))


class CompressedLayer(DynamicLayer):
    def __init__(self, codec, buffer_length: int, chunk: int = 1, buffer_dtype: torch.dtype | None = torch.float16,
                 attention: str = "dense", buffer: str = "official", padding: torch.Tensor | None = None):
        super().__init__()
        if buffer_length < 1:
            raise ValueError("buffer_length must be at least 1 (generate crops the newest token)")
        if attention not in ("dense", "codes"):
            raise ValueError(f"attention must be 'dense' or 'codes', got {attention}")
        if buffer not in ("official", "at_least"):
            raise ValueError(f"buffer must be 'official' or 'at_least', got {buffer}")
        self.codec, self.attention, self.padding = codec, attention, padding
        self.rule = codec.official_rule(buffer_length, chunk) if buffer == "official" else \
            AtLeast(buffer_length, chunk, codec.granule)
        self.buffer_dtype = buffer_dtype  # the exact tokens' storage under a 32-bit model; None: the model's dtype
        self.key_codes = self.value_codes = None
        self.compressed_keys = self.compressed_values = 0
        self.unread = False  # codes handed to attention this step and not read yet

    def lazy_initialization(self, key_states, value_states) -> None:
        super().lazy_initialization(key_states, value_states)
        self.dtype = key_states.dtype  # the model's dtype, returned to attention (transformers >= 5.25 keeps none)
        store = self.buffer_dtype if self.buffer_dtype and key_states.element_size() > 2 else key_states.dtype
        self.keys, self.values = self.keys.to(store), self.values.to(store)

    def _valid(self, start: int, n: int, like: torch.Tensor) -> torch.Tensor | None:
        """Which of tokens ``start .. start + n`` are not padding, ``[batch, n]`` on ``like``'s device (None: no
        padding given; the mask may have been given on another device than the model's)."""
        if self.padding is None:
            return None
        batch = like.shape[0]
        if self.padding.shape[0] != batch:
            raise ValueError(f"padding has {self.padding.shape[0]} rows for a batch of {batch} (expand it as the "
                             "inputs are, e.g. for beam search)")
        valid = self.padding[:, start:start + n].to(device=like.device, dtype=torch.bool)
        return torch.cat([valid, valid.new_ones(batch, n - valid.shape[1])], 1)

    def _view(self, keys, values):
        """What attention reads this step: the codes held before it, then every exact token."""
        out_k, out_v = keys.to(self.dtype), values.to(self.dtype)
        if self.key_codes is None and self.value_codes is None:
            return out_k, out_v
        if self.attention == "codes":
            out_k = out_k.view(out_k.shape)  # a fresh tensor object to carry the tag
            setattr(out_k, CODES_ATTR, (self, self.key_codes, self.value_codes))
            self.unread = True
            return out_k, out_v
        parts_k = [self.codec.decode_keys(self.key_codes, self.dtype)] if self.key_codes is not None else []
        parts_v = [self.codec.decode_values(self.value_codes, self.dtype)] if self.value_codes is not None else []
        return torch.cat([*parts_k, out_k], -2), torch.cat([*parts_v, out_v], -2)

    def update(self, key_states, value_states, *args, **kwargs):
        first = not self.is_initialized
        if first:
            self.lazy_initialization(key_states, value_states)
        held_k, held_v = self.get_buffer_lengths()
        keys = torch.cat([self.keys, key_states.to(self.keys.dtype)], dim=-2)
        values = torch.cat([self.values, value_states.to(self.values.dtype)], dim=-2)
        out = self._view(keys, values)
        nk, nv = self.rule(held_k, held_v, key_states.shape[-2], first)
        if nk:
            valid = self._valid(self.compressed_keys, nk, keys)
            self.key_codes = _append(self.key_codes, self.codec.encode_keys(keys[..., :nk, :], valid))
            self.compressed_keys += nk
            keys = keys[..., nk:, :].clone()
        if nv:
            self.value_codes = _append(self.value_codes, self.codec.encode_values(values[..., :nv, :]))
            self.compressed_values += nv
            values = values[..., nv:, :].clone()
        self.keys, self.values = keys, values
        return out

    def get_buffer_lengths(self) -> tuple[int, int]:
        """Exact keys and values held."""
        if not self.is_initialized or self.keys.dim() < 4:
            return 0, 0
        return self.keys.shape[-2], self.values.shape[-2]

    def get_seq_length(self) -> int:
        return self.compressed_keys + self.get_buffer_lengths()[0] if self.is_initialized else 0

    def reset(self) -> None:
        self.key_codes = self.value_codes = None
        self.compressed_keys = self.compressed_values = 0
        self.unread = False
        super().reset()

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove and self.get_seq_length() and -tokens_to_remove > min(self.get_buffer_lengths()):
            raise ValueError("cannot crop into the compressed part of the cache")
        super().crop(tokens_to_remove)

    def _batch(self, op) -> None:
        self.keys, self.values = op(self.keys), op(self.values)
        self.key_codes, self.value_codes = (None if c is None else tuple(op(t) for t in c)
                                            for c in (self.key_codes, self.value_codes))
        if self.padding is not None:
            self.padding = op(self.padding)

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
        return _nbytes((self.keys, self.values, *(self.key_codes or ()), *(self.value_codes or ())))


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
    """One CompressedLayer per decoder layer; ``codec_for(layer_idx)`` gives each layer its codec. The codes-reading
    attention's state is the cache's own: a layer whose codes were handed out and not read is an error at this
    cache's next update (the next layer's, within a step), whatever other model runs in the process meanwhile."""

    def __init__(self, codec_for, layers: int, buffer_length: int = 128, chunk: int = 1,
                 buffer_dtype: torch.dtype | None = torch.float16, attention: str = "dense", buffer: str = "official",
                 padding: torch.Tensor | None = None):
        super().__init__(layers=[CompressedLayer(codec_for(i), buffer_length, chunk, buffer_dtype, attention, buffer,
                                                 padding) for i in range(layers)])

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        if any(layer.unread for layer in self.layers):
            raise RuntimeError("compressed KV codes handed to attention were never read: run the model inside "
                               "lexico.attention.over_codes(model) when the cache attends over codes, and keep the "
                               "key tensor the cache returns (its tag carries the codes)")
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)


class WindowCache(_Measured):
    def __init__(self, layers: int, window: int, sinks: int = 4, store_dtype: torch.dtype | None = torch.float16):
        super().__init__(layers=[WindowLayer(window, sinks, store_dtype) for _ in range(layers)])
