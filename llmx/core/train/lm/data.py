"""Packed token windows for causal-LM training: documents joined by EOS, cut into non-overlapping ``seq_len``
windows, visited in a seeded random order that is reshuffled each epoch. The windows of a micro-batch are a pure
function of its index (the loop's contract)."""

from __future__ import annotations

import hashlib

import torch

from llmx.core.data.sampling import EpochOrder
from llmx.errors import UsageError


def fingerprint(stream: torch.Tensor) -> str:
    """16 hex digits of the token stream: checkpoint series and cooldowns refuse other data."""
    return hashlib.sha256(stream.to(torch.int64).cpu().numpy().tobytes()).hexdigest()[:16]


class TokenWindows:
    def __init__(self, stream: torch.Tensor, seq_len: int, seed: int, skip: int = 0):
        """``skip`` windows of the seeded order are passed over: a converted model continues its source's data."""
        n = len(stream) // seq_len
        if n < 1:
            raise UsageError(f"the training data has {len(stream)} tokens, fewer than one window of {seq_len}")
        self.windows = stream[: n * seq_len].view(n, seq_len)
        self.order, self.skip = EpochOrder(n, seed), skip

    def batch(self, i: int, size: int) -> torch.Tensor:
        """The ``size`` windows of micro-batch ``i`` (``[size, seq_len]``)."""
        return self.windows[self.order.batch(i, size, self.skip)]
