"""Statistics over prompts: the unbiased pass@k estimator, percentile-bootstrap intervals of a mean, and a paired
comparison of two models scored on the same prompts. Resampling is over prompts (the unit that varies), seeded."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chen et al. (2021), eq. 1: ``1 - C(n-c, k) / C(n, k)``, the chance that at least one of ``k`` completions drawn
    without replacement from ``n`` (``c`` of them correct) passes."""
    if not 0 <= c <= n or not 0 < k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 0 < k <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def bootstrap_ci(values: Sequence[float], resamples: int = 1000, level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap interval of the mean of ``values`` (empty: NaN, NaN)."""
    if not values:
        return math.nan, math.nan
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(rng.choices(values, k=n)) / n for _ in range(resamples))
    tail = (1.0 - level) / 2
    return means[int(tail * (resamples - 1))], means[int(math.ceil((1.0 - tail) * (resamples - 1)))]


@dataclass(frozen=True)
class Paired:
    """``b - a`` on the same prompts: the mean difference, its bootstrap interval and the win / loss / tie counts."""

    diff: float
    low: float
    high: float
    wins: int
    losses: int
    ties: int

    def as_dict(self, prefix: str = "diff") -> dict[str, float | int]:
        return {prefix: self.diff, f"{prefix}_ci_low": self.low, f"{prefix}_ci_high": self.high,
                "wins": self.wins, "losses": self.losses, "ties": self.ties}


def paired(a: Sequence[float], b: Sequence[float], resamples: int = 1000, level: float = 0.95, seed: int = 0) -> Paired:
    """Compare per-prompt scores ``b`` against ``a`` (same prompts, same order)."""
    if len(a) != len(b):
        raise ValueError(f"paired comparison needs the same prompts ({len(a)} vs {len(b)} scores)")
    d = [y - x for x, y in zip(a, b, strict=True)]
    low, high = bootstrap_ci(d, resamples, level, seed)
    return Paired(sum(d) / max(len(d), 1), low, high, sum(x > 0 for x in d), sum(x < 0 for x in d),
                  sum(x == 0 for x in d))
