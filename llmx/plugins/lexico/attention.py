"""Attention that reads compressed KV codes directly (Lexico, arXiv 2412.08890, Sec. 3.3), registered in transformers'
``AttentionInterface`` as ``llmx_codes``.

A ``CompressedLayer`` with ``attention="codes"`` returns its exact buffer tagged with the codes of the older tokens;
this function hands such calls to the codec's ``attend`` and every other call (prefill, a full cache, a layer with
nothing compressed yet) to transformers' SDPA attention, with SDPA's masks.
"""

from __future__ import annotations

import contextlib

from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from llmx.plugins.lexico.cache import CODES_ATTR, PENDING

NAME = "llmx_codes"


def codes_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
                    **kwargs):
    tagged = getattr(key, CODES_ATTR, None)
    expected = PENDING.pop(getattr(module, "layer_idx", None), None)
    if tagged is None:
        if expected is not None:
            raise RuntimeError("the compressed KV codes did not reach the attention function (the key tensor was "
                               "transformed after the cache update); refusing to attend over the buffer alone")
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    unsupported = [k for k in ("softcap", "sliding_window", "s_aux") if kwargs.get(k) is not None] + \
        (["dropout"] if dropout else [])
    if unsupported:
        raise NotImplementedError(f"attention over Lexico codes does not support {', '.join(unsupported)}")
    codec, codes = tagged
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return codec.attend(query, key, value, codes, attention_mask, scale), None


AttentionInterface.register(NAME, codes_attention)
AttentionMaskInterface.register(NAME, sdpa_mask)


@contextlib.contextmanager
def over_codes(model):
    """Run ``model`` with the codes-reading attention inside the block, then restore its attention."""
    previous = model.config._attn_implementation
    PENDING.clear()
    model.set_attn_implementation(NAME)
    try:
        yield model
    finally:
        model.set_attn_implementation(previous)
