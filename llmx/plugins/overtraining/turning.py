"""Turning points: the budget T* after which a loss stops improving with T (its minimum over the series), or None
when the loss still falls at the last checkpoint; with its spread over draws or seeds."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any


def turning_point(tokens: Sequence[int], losses: Sequence[float]) -> int | None:
    """T at the minimum of ``losses`` (first of ties); None when it is the last checkpoint (monotone so far)."""
    best = min(range(len(losses)), key=lambda i: (losses[i], i))
    return None if best == len(losses) - 1 else tokens[best]


def summary(tokens: Sequence[int], curves: Sequence[Sequence[float]]) -> dict[str, Any]:
    """T* of the mean curve and of each curve (one per draw or seed)."""
    mean = [statistics.fmean(c[i] for c in curves) for i in range(len(tokens))]
    return {"T_star": turning_point(tokens, mean), "T_star_each": [turning_point(tokens, c) for c in curves]}


def turning_points(tokens: list[int], sensitivity: list[dict], finetune: list[dict]) -> list[dict[str, Any]]:
    """Rows for the perturbed loss per gamma (curves over draws) and the post-FT losses per lr (curves over seeds)."""
    rows = []
    for gamma in dict.fromkeys(r["gamma"] for r in sensitivity):
        by_t = {r["T"]: r for r in sensitivity if r["gamma"] == gamma}
        draws = len(by_t[tokens[0]]["draw_losses"])
        curves = [[by_t[t]["draw_losses"][k] for t in tokens] for k in range(draws)]
        rows.append({"curve": "perturbed_loss", "gamma": gamma, **summary(tokens, curves)})
    for lr in dict.fromkeys(r["lr"] for r in finetune):
        seeds = list(dict.fromkeys(r["seed"] for r in finetune if r["lr"] == lr))
        at = {(r["T"], r["seed"]): r for r in finetune if r["lr"] == lr}
        for key in ("L_pre_after", "target"):
            curves = [[at[t, s][key] for t in tokens] for s in seeds]
            rows.append({"curve": key, "lr": lr, **summary(tokens, curves)})
    return rows


def tuned(finetune: list[dict]) -> list[dict[str, Any]]:
    """Per (T, seed): the row of the rate with the lowest target loss (the per-checkpoint lr sweep of §3.4)."""
    best: dict[tuple, dict] = {}
    for r in finetune:
        key = (r["T"], r["seed"])
        if key not in best or r["target"] < best[key]["target"]:
            best[key] = r
    return [best[k] for k in sorted(best)]
