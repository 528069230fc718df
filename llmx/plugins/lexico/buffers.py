"""How many of its oldest exact tokens a compressed layer hands to its codec after an update.

A rule maps (exact keys held before the update, exact values held, tokens appended, whether it is the layer's first
update) to (keys to compress, values to compress), oldest first; attention in that update still reads them exact.
Each codec names its method's official rule (``official_rule``); ``AtLeast`` is llmx's earlier rule, kept as an option.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LexicoRule:
    """Official Lexico (``LexicoCache.update``, arXiv 2412.08890 Sec. 3.3): the prompt's tokens but the last
    ``length``; then each update that finds ``length`` tokens exact compresses the oldest ``chunk`` of them
    (``approximation_length``). Token by token, ``length - chunk + 1`` to ``length`` stay exact (97-128 at 128 and 32)."""

    length: int
    chunk: int

    def __post_init__(self) -> None:
        if not 0 < self.chunk <= self.length:
            raise ValueError(f"Lexico compresses chunk <= buffer_length tokens at a time, got {self.chunk} > "
                             f"{self.length}")

    def __call__(self, held_k: int, held_v: int, new: int, first: bool) -> tuple[int, int]:
        if first:
            n = max(new - self.length, 0)
        else:  # as many chunks as take what was held below ``length`` (one, for a decode step)
            n = -(-(held_k - self.length + 1) // self.chunk) * self.chunk if held_k >= self.length else 0
        return n, n


@dataclass(frozen=True)
class KIVIRule:
    """Official KIVI (``LlamaAttention_KIVI.forward``, residual length R = ``length``): keys are quantized each time R
    exact ones have gathered (the prompt's whole multiples of R at once), so 0 to R-1 stay exact; values older than the
    most recent R are quantized as they leave it, so R stay exact."""

    length: int
    group: int

    def __post_init__(self) -> None:
        if self.length % self.group:
            raise ValueError(f"KIVI's residual (buffer_length {self.length}) must be whole key groups of {self.group}")

    def __call__(self, held_k: int, held_v: int, new: int, first: bool) -> tuple[int, int]:
        return (held_k + new) // self.length * self.length, max(held_v + new - self.length, 0)


@dataclass(frozen=True)
class AtLeast:
    """llmx's earlier rule: at least ``length`` tokens exact; the prompt's excess at once, then ``chunk`` (at least a
    codec granule) at a time, in whole granules (a partial KIVI key group stays exact): ``length`` to
    ``length + chunk - 1`` exact."""

    length: int
    chunk: int
    granule: int = 1

    def __call__(self, held_k: int, held_v: int, new: int, first: bool) -> tuple[int, int]:
        excess = held_k + new - self.length
        if excess <= 0:
            return 0, 0
        n = excess if first else excess - excess % max(self.chunk, self.granule)
        n -= n % self.granule
        return n, n
