"""Attention that reads compressed KV codes directly (Lexico, arXiv 2412.08890, Sec. 3.3), registered in transformers'
``AttentionInterface`` as ``llmx_codes``.

A ``CompressedLayer`` with ``attention="codes"`` returns its exact buffers, the key tagged with the codes of the
older tokens; this function marks them read on their layer, hands such calls to the codec's ``attend`` (Lexico's
gathered scores, KIVI's blockwise dequantization) and every other call (prefill, a full cache, a layer with nothing
compressed yet) to transformers' SDPA attention, with SDPA's masks. It keeps no state: codes never read are the
cache's to notice (``CompressedCache.update``).
"""

from __future__ import annotations

import contextlib

from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from llmx.plugins.lexico.cache import CODES_ATTR

NAME = "llmx_codes"


def codes_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
                    **kwargs):
    tagged = getattr(key, CODES_ATTR, None)
    if tagged is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    unsupported = [k for k in ("softcap", "sliding_window", "s_aux") if kwargs.get(k) is not None] + \
        (["dropout"] if dropout else [])
    if unsupported:
        raise NotImplementedError(f"attention over compressed KV codes does not support {', '.join(unsupported)}")
    layer, key_codes, value_codes = tagged
    layer.unread = False
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return layer.codec.attend(query, key, value, key_codes, value_codes, attention_mask, scale), None


AttentionInterface.register(NAME, codes_attention)
AttentionMaskInterface.register(NAME, sdpa_mask)


@contextlib.contextmanager
def over_codes(model):
    """Run ``model`` with the codes-reading attention inside the block, then restore its attention."""
    previous = model.config._attn_implementation
    model.set_attn_implementation(NAME)
    try:
        yield model
    finally:
        model.set_attn_implementation(previous)
