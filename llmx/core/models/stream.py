"""A causal LM over a token sequence that grows and is cut back: next-token log-probabilities for new positions from
one forward, reusing the KV cache for the prefix it has already seen. Speculative and collaborative decoding (a draft
block, then a verification that may keep only part of it) are built on it.

``crop_cache`` cuts a transformers cache to a length. Its ``crop`` argument changed meaning inside 5.x (5.0 took the
length to keep; the pinned 5.2x takes minus the tokens to drop), so the length is checked after the call; a cache
that cannot be cropped is dropped, and the prefix is recomputed.
"""

from __future__ import annotations

from typing import Any

import torch


def crop_cache(cache: Any, length: int) -> bool:
    """Cut ``cache`` to its first ``length`` positions in place; False when it cannot be (the caller recomputes)."""
    if cache is None or not hasattr(cache, "crop") or not hasattr(cache, "get_seq_length"):
        return False
    have = int(cache.get_seq_length())
    if have == length:
        return True
    if have < length:
        return False
    try:
        cache.crop(length - have)
    except (ValueError, NotImplementedError, TypeError, RuntimeError):  # sliding-window layers past their window
        return False
    return int(cache.get_seq_length()) == length


class Stream:
    """``logprobs(ids, start)``: the distributions of ``ids[start]``, ..., ``ids[-1]`` and of the token after them,
    given what precedes each (``len(ids) - start + 1`` rows of log-probabilities, float32). Batch size 1.

    With ``use_cache`` the model forwards only what its cache lacks: the longest common prefix of ``ids`` and the
    tokens it saw last is kept (cropped to), the rest is fed in one forward. Without it, every call feeds all of
    ``ids`` (the reference the cached path is tested against). ``fed`` counts the tokens fed.
    """

    def __init__(self, model: Any, use_cache: bool = True):
        self.model, self.use_cache = model, use_cache
        self.device = next(model.parameters()).device
        self.cache: Any = None
        self.seen: list[int] = []
        self.last: torch.Tensor | None = None  # log-probs after the last seen token
        self.fed = 0

    def _forward(self, ids: list[int], keep: int) -> torch.Tensor:
        """Log-probabilities at the last ``keep`` of the fed positions (the model computes no others)."""
        x = torch.tensor([ids], dtype=torch.long, device=self.device)
        kwargs: dict[str, Any] = {"use_cache": self.use_cache, "logits_to_keep": keep}
        if self.use_cache:
            if self.cache is None:
                from transformers import DynamicCache

                self.cache = DynamicCache(config=self.model.config)
            kwargs["past_key_values"] = self.cache
        out = self.model(input_ids=x, **kwargs)
        self.fed += len(ids)
        return torch.log_softmax(out.logits[0, -keep:].float(), dim=-1)  # a model may ignore logits_to_keep

    @torch.inference_mode()
    def logprobs(self, ids: list[int], start: int) -> torch.Tensor:
        if not 1 <= start <= len(ids):
            raise ValueError(f"start must be in [1, {len(ids)}], not {start}")
        need = len(ids) - start + 1  # positions start - 1 .. len(ids) - 1
        if not self.use_cache:
            return self._forward(ids, need)
        common = 0
        for a, b in zip(self.seen, ids, strict=False):
            if a != b:
                break
            common += 1
        if common == len(self.seen) and start >= common and self.last is not None:
            # the stored row is the distribution at position common - 1; the forward gives the rest
            fresh = [self._forward(ids[common:], min(need, len(ids) - common))] if common < len(ids) else []
            out = torch.cat(([self.last[None]] if start == common else []) + fresh)
        else:
            keep = min(common, start - 1)
            if not crop_cache(self.cache, keep):
                self.cache, keep = None, 0
            self.seen = self.seen[:keep]
            out = self._forward(ids[keep:], need)
        self.seen, self.last = list(ids), out[-1].clone()
        return out
