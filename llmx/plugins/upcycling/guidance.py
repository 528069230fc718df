"""Budget guidance (notes §2.5, derived): at a compute ``C`` with ``C = 6·N·D`` per phase, the predicted loss of
upcycling (dense for D1 at N_dense, then D2 at the MoE's active N) against the MoE and the dense model trained from
scratch on all of C, and the budgets where upcycling and MoE-from-scratch cross.

``sunk_dense: true`` takes the dense model as already paid for (C buys D2 only, D1 fixed), as the paper's Figure 1
frames it ("efficiency of upcycling diminishes with sunk cost"); ``false`` charges D1 too and picks the best D1 within
the grid's measured range (the law is not extrapolated in D1). ``crossover_tokens`` is that figure's curve: per sunk
D1, the additional tokens D2* above which the MoE from scratch on the same compute is ahead (the paper's Eq. 13,
solved numerically here; its closed form is not in the notes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llmx.plugins.upcycling.law import Fit


@dataclass(frozen=True)
class Costs:
    dense: float  # N of the dense model (and of dense from scratch)
    moe: float  # active N of the upcycled MoE (and of the MoE from scratch)


def upcycled(law: Fit, c: float, costs: Costs, d1_range: tuple[float, float], sunk: bool,
             dense_tokens: float) -> dict[str, float] | None:
    """The best upcycling split at compute ``c``, or None when ``c`` cannot pay for any D2."""
    if sunk:
        d1 = np.array([dense_tokens])
        d2 = np.array([c / (6 * costs.moe)])
    else:
        d1 = np.geomspace(*d1_range, 64)
        d2 = (c - 6 * costs.dense * d1) / (6 * costs.moe)
        d1, d2 = d1[d2 > 0], d2[d2 > 0]
        if not len(d1):
            return None
    loss = law.predict(d1, d2)
    i = int(np.argmin(loss))
    return {"loss": float(loss[i]), "D1": float(d1[i]), "D2": float(d2[i])}


def compare(c: float, law: Fit, scratch: dict[str, tuple[Fit, float]], costs: Costs, d1_range: tuple[float, float],
            sunk: bool, dense_tokens: float) -> dict[str, object]:
    """One budget: upcycling's best split and each from-scratch model (its own fit and parameter count). With the
    dense phase sunk, the dense baseline is that model continued (``dense_tokens`` + C / 6N), not a new one."""
    row: dict[str, object] = {"compute": c, "upcycled": upcycled(law, c, costs, d1_range, sunk, dense_tokens)}
    for kind, (f, n) in scratch.items():
        d = c / (6 * n) + (dense_tokens if sunk and kind == "dense" else 0.0)
        row[kind] = {"loss": float(f.predict(np.array([d]))[0]), "tokens": d}
    return row


def crossovers(law: Fit, moe: tuple[Fit, float], costs: Costs, d1_range: tuple[float, float], sunk: bool,
               dense_tokens: float, lo: float, hi: float, points: int = 400) -> list[dict[str, object]]:
    """Budgets in ``[lo, hi]`` where upcycling's predicted loss crosses the MoE-from-scratch's (bisection on a
    log grid), each with the side upcycling leads on below it."""
    from scipy.optimize import brentq

    def gap(log_c: float) -> float:
        up = upcycled(law, float(np.exp(log_c)), costs, d1_range, sunk, dense_tokens)
        scratch = float(moe[0].predict(np.array([np.exp(log_c) / (6 * moe[1])]))[0])
        return (up["loss"] if up else np.inf) - scratch

    grid = np.linspace(np.log(lo), np.log(hi), points)
    values = [gap(g) for g in grid]
    out = []
    for a, b, ga, gb in zip(grid, grid[1:], values, values[1:], strict=False):
        if np.isfinite(ga) and np.isfinite(gb) and ga * gb < 0:
            c = float(np.exp(brentq(gap, a, b)))
            out.append({"compute": c, "upcycling_ahead": "below" if ga < 0 else "above"})
    return out


def crossover_tokens(law: Fit, moe: tuple[Fit, float], costs: Costs, d1: float, lo: float,
                     hi: float) -> dict[str, object]:
    """For a dense model of ``d1`` tokens already paid for: the first D2 (and its compute) in ``[lo, hi]`` FLOPs
    where the MoE from scratch on the same compute catches up (``upcycling_ahead: below``; ``above`` when the
    only crossing goes the other way); without one, whether upcycling is ahead throughout (``always``) or behind
    (``never``)."""
    found = crossovers(law, moe, costs, (d1, d1), True, d1, lo, hi)
    if found:
        first = next((c for c in found if c["upcycling_ahead"] == "below"), found[0])
        return {"D2": first["compute"] / (6 * costs.moe), "compute": first["compute"],
                "upcycling_ahead": first["upcycling_ahead"]}
    up = upcycled(law, lo, costs, (d1, d1), True, d1)
    ahead = up["loss"] < float(moe[0].predict(np.array([lo / (6 * moe[1])]))[0])
    return {"D2": None, "compute": None, "upcycling_ahead": "always" if ahead else "never"}
