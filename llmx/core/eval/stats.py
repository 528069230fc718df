"""Statistics over prompts: the unbiased pass@k estimator, percentile-bootstrap intervals of a mean, and a paired
comparison of two models scored on the same prompts. Resampling is over prompts (the unit that varies), seeded."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass


def mean(values: Sequence[float]) -> float:
    """The mean; NaN for no values."""
    return sum(values) / len(values) if values else math.nan


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


def clustered(groups: Sequence[Sequence[float]], resamples: int = 2000, level: float = 0.95,
              seed: int = 0, crossed: bool | None = None) -> tuple[float, float, float]:
    """The mean of paired differences grouped by seed, and a percentile-bootstrap interval over seeds and items.
    Where every seed scored the same items (the usual case: one held-out set, one row per item in each seed), the
    items are crossed with the seeds: each resample draws seeds and one set of items applied to every drawn seed, so
    seeds that repeat each other (a deterministic arm) add no confidence. Seeds with items of their own (different
    lengths, or ``crossed=False`` where the caller knows the items differ) are nested: the items are drawn within each
    drawn seed. One seed reduces to the items' bootstrap."""
    import numpy as np

    arrays = [np.asarray(g, dtype=np.float64) for g in groups if len(g)]
    if not arrays:
        return math.nan, math.nan, math.nan
    rng = np.random.default_rng(seed)
    crossed = len({len(a) for a in arrays}) == 1 and crossed is not False
    table = np.stack(arrays) if crossed else None
    means = np.empty(resamples)
    for r in range(resamples):
        seeds = rng.integers(len(arrays), size=len(arrays))
        if crossed:
            means[r] = table[np.ix_(seeds, rng.integers(table.shape[1], size=table.shape[1]))].mean()
        else:
            means[r] = np.concatenate([arrays[i][rng.integers(len(arrays[i]), size=len(arrays[i]))]
                                       for i in seeds]).mean()
    tail = (1 - level) / 2
    total = float(np.concatenate(arrays).mean())
    return total, float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))


T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
       2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
# Student t's 97.5% quantile for 1-30 degrees of freedom (beyond: 2.0, a little above the normal's 1.96)


def widened(mean: float, low: float, high: float, per_seed: Sequence[float]) -> tuple[float, float, float]:
    """A bootstrap interval ``(low, high)`` around ``mean`` widened to the t-interval on the per-seed values where
    that is wider: with few seeds a two-level bootstrap has few distinct draws and under-covers."""
    if len(per_seed) >= 2:
        t = T95[len(per_seed) - 2] if len(per_seed) - 1 <= len(T95) else 2.0
        m = sum(per_seed) / len(per_seed)
        half = t * math.sqrt(sum((x - m) ** 2 for x in per_seed) / (len(per_seed) - 1) / len(per_seed))
        low, high = min(low, mean - half), max(high, mean + half)
    return mean, low, high


def binary_kl(q: float, p: float) -> float:
    """KL(Bernoulli(q) || Bernoulli(p)) in nats."""
    return sum(a * math.log(a / b) for a, b in ((q, p), (1 - q, 1 - p)) if a > 0)


def tilted(p: float, strength: float) -> float:
    """A prompt's success probability under the KL-regularised optimum ``pi* ~ pi_ref exp(r / beta)`` for a reward of
    1 on success and 0 otherwise (Rafailov et al. 2023, eq. 4), with ``strength = 1 / beta``."""
    return 1.0 / (1.0 + math.exp(-(math.log(p / (1 - p)) + strength)))  # logit q = logit p + 1 / beta


def frontier_kl(p: Sequence[float], rate: float, hi: float = 50.0) -> float:
    """The least mean KL at which any policy reaches mean success ``rate`` (the inverse of :func:`frontier_rate`);
    infinite when ``rate`` is beyond the tilt ``hi``."""
    def mean_rate(t: float) -> float:
        return sum(tilted(x, t) for x in p) / len(p)

    if rate <= mean_rate(0.0):
        return 0.0
    if rate > mean_rate(hi):
        return math.inf
    lo, top = 0.0, hi
    for _ in range(100):
        mid = (lo + top) / 2
        lo, top = (mid, top) if mean_rate(mid) < rate else (lo, mid)
    return sum(binary_kl(tilted(x, top), x) for x in p) / len(p)


def frontier_rate(p: Sequence[float], kl: float, hi: float = 50.0) -> float:
    """The best mean success rate any policy reaches at mean KL ``kl`` from the reference (sequence level, per prompt
    averaged), given each prompt's success probability ``p`` under the reference (in (0, 1)): the optimum tilts
    every prompt by one common ``1 / beta`` (a Lagrangian over the prompts' shared budget), found by bisection."""
    def mean_kl(t: float) -> float:
        return sum(binary_kl(tilted(x, t), x) for x in p) / len(p)

    if kl <= 0:
        return sum(p) / len(p)
    lo, top = 0.0, hi
    if mean_kl(top) <= kl:
        return sum(tilted(x, top) for x in p) / len(p)
    for _ in range(100):
        mid = (lo + top) / 2
        lo, top = (mid, top) if mean_kl(mid) < kl else (lo, mid)
    return sum(tilted(x, lo) for x in p) / len(p)
