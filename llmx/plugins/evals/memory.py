"""Memory figures: weights in memory and as stored on disk, the cache a prompt leaves behind, and peak RSS."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from llmx.core.context import RunContext
from llmx.core.data import token_stream
from llmx.core.memory import peak_rss_bytes
from llmx.plugins.evals.config import MemoryParams


def tensor_bytes(obj: Any, seen: set[int] | None = None) -> int:
    """Bytes of every distinct tensor reachable from ``obj`` (a cache object, list, dict...)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v, seen) for v in obj)
    if hasattr(obj, "__dict__") and not isinstance(obj, (torch.nn.Module, type)):
        return sum(tensor_bytes(v, seen) for v in vars(obj).values())
    return 0


def stored_bytes(source: str | None) -> int | None:
    """Size of the weight files of a model loaded from a local folder, as stored."""
    from llmx.core.models.storage import weight_file_bytes

    if not source or not Path(source).is_dir():
        return None
    return weight_file_bytes(source) or None


@torch.inference_mode()
def run(ctx: RunContext, p: MemoryParams) -> dict:
    model, tok = ctx.model, ctx.tokenizer
    device = next(model.parameters()).device
    prompt = token_stream(tok, ctx.config.data.source, "validation", p.context_len, ctx.config.data.splitting)[None].to(device)
    out = model(input_ids=prompt, use_cache=True)
    cache = getattr(out, "past_key_values", None) or getattr(out, "cache_params", None)
    cache_bytes = tensor_bytes(cache)
    weights = sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))
    return {"weight_bytes": weights, "stored_weight_bytes": stored_bytes(ctx.config.model),
            "params": sum(t.numel() for t in model.parameters()), "cache_bytes": cache_bytes,
            "cache_bytes_per_token": cache_bytes / prompt.shape[1], "context_len": prompt.shape[1],
            "peak_rss_bytes": peak_rss_bytes()}
