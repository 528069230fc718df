"""Learning-rate schedules: linear warmup, then cosine, linear, constant or warmup-stable-decay (WSD).

WSD (Hu et al. 2024, MiniCPM; Hägele et al. 2024) holds the peak rate after warmup and decays over the last
``decay_steps`` steps, so any step of the stable phase can branch a short cooldown (``core.train.lm``).
"""

from __future__ import annotations

import math
from typing import Literal

Schedule = Literal["cosine", "linear", "constant", "wsd"]
DecayShape = Literal["linear", "cosine", "sqrt"]


def decay(frac: float, shape: DecayShape) -> float:
    """1 at ``frac`` = 0, 0 at ``frac`` = 1: linear, half-cosine, or 1 - sqrt (Hägele et al. 2024, eq. 1)."""
    frac = min(max(frac, 0.0), 1.0)
    if shape == "cosine":
        return 0.5 * (1 + math.cos(math.pi * frac))
    if shape == "sqrt":
        return 1 - math.sqrt(frac)
    return 1 - frac


def lr_at(step: int, *, lr: float, steps: int, warmup: int = 0, schedule: Schedule = "cosine",
          min_lr_ratio: float = 0.1, decay_steps: int = 0, decay_shape: DecayShape = "linear") -> float:
    """The rate for optimizer step ``step`` (0-based). Warmup ramps to ``lr`` over ``warmup`` steps; the decaying
    schedules end at ``min_lr_ratio * lr``; WSD decays over the last ``decay_steps`` steps with ``decay_shape``."""
    if step < warmup:
        return lr * (step + 1) / warmup
    if schedule == "constant":
        return lr
    if schedule == "wsd":
        start = steps - decay_steps
        if step < start or decay_steps <= 0:
            return lr
        shape = decay((step - start + 1) / decay_steps, decay_shape)
    else:
        frac = min((step - warmup) / max(steps - warmup, 1), 1.0)
        shape = decay(frac, "cosine" if schedule == "cosine" else "linear")
    return lr * (min_lr_ratio + (1 - min_lr_ratio) * shape)
