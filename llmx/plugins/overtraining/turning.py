"""Turning points: the budget T* after which a loss stops improving with T. The candidate is the curve's minimum over
the series; it counts only when the loss after it rises by more than the noise: ``k`` standard errors of the paired
per-draw (or per-seed) rise, and ``rtol`` of the loss. Status: ``improving`` (the minimum is the last checkpoint),
``turns`` (T* inside the series), ``rising_from_start`` (T* at or before the first checkpoint) or ``flat`` (a later
rise within the noise)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any


def turning_point(tokens: Sequence[int], curves: Sequence[Sequence[float]], k: float = 2.0,
                  rtol: float = 1e-3) -> dict[str, Any]:
    """T*, the status, and the rise after the minimum of the mean curve (with its standard error over curves)."""
    n = len(tokens)
    mean = [statistics.fmean(c[i] for c in curves) for i in range(n)]
    best = min(range(n), key=lambda i: (mean[i], i))
    if best == n - 1:
        return {"T_star": None, "status": "improving", "rise": 0.0, "rise_se": 0.0}
    worst = max(range(best + 1, n), key=lambda i: mean[i])
    rises = [c[worst] - c[best] for c in curves]
    rise = statistics.fmean(rises)
    se = statistics.stdev(rises) / len(rises) ** 0.5 if len(rises) > 1 else 0.0
    if rise <= k * se or rise <= rtol * abs(mean[best]):
        return {"T_star": None, "status": "flat", "rise": rise, "rise_se": se}
    return {"T_star": tokens[best], "status": "rising_from_start" if best == 0 else "turns", "rise": rise,
            "rise_se": se}


def summary(tokens: Sequence[int], curves: Sequence[Sequence[float]], k: float, rtol: float) -> dict[str, Any]:
    """The mean curve's turning point, and each curve's T* alone (its spread)."""
    return {**turning_point(tokens, curves, k, rtol),
            "T_star_each": [turning_point(tokens, [c], k, rtol)["T_star"] for c in curves]}


def turning_points(tokens: list[int], l_pre: list[float], sensitivity: list[dict], finetune: list[dict],
                   k: float = 2.0, rtol: float = 1e-3) -> list[dict[str, Any]]:
    """Rows for L_pre itself (the control: a base loss that turns is overfitting, not overtraining), the perturbed
    loss per gamma (curves over draws) and the post-FT losses per lr (curves over seeds)."""
    rows = [{"curve": "L_pre", **summary(tokens, [l_pre], k, rtol)}] if l_pre else []
    for gamma in dict.fromkeys(r["gamma"] for r in sensitivity):
        by_t = {r["T"]: r for r in sensitivity if r["gamma"] == gamma}
        draws = len(by_t[tokens[0]]["draw_losses"])
        curves = [[by_t[t]["draw_losses"][d] for t in tokens] for d in range(draws)]
        rows.append({"curve": "perturbed_loss", "gamma": gamma, **summary(tokens, curves, k, rtol)})
    for lr in dict.fromkeys(r["lr"] for r in finetune):
        seeds = list(dict.fromkeys(r["seed"] for r in finetune if r["lr"] == lr))
        at = {(r["T"], r["seed"]): r for r in finetune if r["lr"] == lr}
        for key in ("L_pre_after", "target"):
            curves = [[at[t, s][key] for t in tokens] for s in seeds]
            rows.append({"curve": key, "lr": lr, **summary(tokens, curves, k, rtol)})
    return rows


def tuned(finetune: list[dict], lrs: list[float]) -> list[dict[str, Any]]:
    """Per (T, seed): the row of the rate with the lowest target loss (the per-checkpoint lr sweep of §3.4), chosen
    on the reported target windows as the paper's sweep does; ``lr_at_edge`` marks a best rate at the grid's end,
    where a wider grid might still change the picture."""
    best: dict[tuple, dict] = {}
    for r in finetune:
        key = (r["T"], r["seed"])
        if key not in best or r["target"] < best[key]["target"]:
            best[key] = r
    return [{**best[key], "lr_at_edge": best[key]["lr"] in (min(lrs), max(lrs))} for key in sorted(best)]
