"""``llmx analyze --method upcycling-law``: fit the upcycling law with and without the D1·D2 interaction on a grid of
runs, intervals for its constants, held-out error, a power check for alpha3, and budget guidance against MoE and
dense models trained from scratch."""

from __future__ import annotations

from typing import Any

import numpy as np

from llmx.core.context import RunContext
from llmx.errors import UsageError
from llmx.plugins.upcycling import grid as grids
from llmx.plugins.upcycling import guidance, law
from llmx.plugins.upcycling.config import LawParams


def _rmse(f: law.Fit, g: grids.Grid, mask: np.ndarray) -> float | None:
    if not mask.any():
        return None
    return float(np.sqrt(np.mean((np.log(f.predict(g.d1[mask], g.d2[mask])) - np.log(g.loss[mask])) ** 2)))


def _detections(f: law.Fit, d1: np.ndarray, d2: np.ndarray, alpha3: float, sigma: float, sims: int, level: float,
                rng: np.random.Generator, f_scale: float) -> float:
    """The share of synthetic grids (this grid's points, the fitted law with ``alpha3``, log-normal noise ``sigma``)
    whose asymptotic interval for alpha3 lies above 0."""
    x = np.concatenate([f.x[:4], [alpha3]])
    truth = law.Fit("interaction", f.unit, x, 0.0, np.zeros(0), np.zeros((0, 5))).predict(d1, d2)
    hits = 0
    for _ in range(sims):
        noisy = truth * np.exp(rng.normal(0.0, sigma, len(d1)))
        hits += law.fit("interaction", noisy, d1, d2, f.unit, f_scale, [x], scales=(1.0,)).intervals(level)[
            "alpha3"][0] > 0
    return hits / sims


def power(f: law.Fit, d1: np.ndarray, d2: np.ndarray, alpha3: float, sims: int, level: float, seed: int,
          f_scale: float, noise: float | None = None) -> dict[str, Any]:
    """Would a grid like this one detect ``alpha3``? Synthetic grids from the fitted law at log-noise ``noise`` (by
    default the fit's residual sd, which also holds any lack of fit), independent per point, scored by the
    asymptotic interval (not the bootstrap the verdict uses: a bootstrap per simulation costs too much); the same
    rule at alpha3 = 0 gives its false-positive rate."""
    n, p = len(d1), len(f.x)
    sigma = noise or float(np.sqrt(np.sum(f.residuals ** 2) / max(n - p, 1)))
    rng = np.random.default_rng(seed)
    return {"alpha3": alpha3, "noise_log_sd": sigma, "noise_from": "given" if noise else "fit residuals",
            "sims": sims, "interval": "asymptotic",
            "power": _detections(f, d1, d2, alpha3, sigma, sims, level, rng, f_scale),
            "false_positive_rate": _detections(f, d1, d2, 0.0, sigma, sims, level, rng, f_scale)}


def _fit(p: LawParams, form: str, loss: np.ndarray, d1: np.ndarray, d2: np.ndarray | None, unit: float,
         extra: list[np.ndarray] = ()) -> tuple[law.Fit, float]:
    """A fit at ``huber_scale`` (``extra`` starts join the grid); ``auto`` refits at the first fit's robust scale."""
    scale = 1e-3 if p.huber_scale == "auto" else p.huber_scale
    f = law.fit(form, loss, d1, d2, unit, scale, extra)
    if p.huber_scale == "auto":
        scale = law.robust_scale(f)
        f = law.fit(form, loss, d1, d2, unit, scale, [*extra, f.x])
    return f, scale


def _per_d1(f: law.Fit, g: grids.Grid) -> list[dict[str, Any]]:
    """Per dense budget: the law's effective D2 exponent and the measured log-log slope of loss in D2."""
    a = f.params
    out = []
    for d1 in np.unique(g.d1):
        m = g.d1 == d1
        slope = float(np.polyfit(np.log(g.d2[m]), np.log(g.loss[m]), 1)[0]) if len(np.unique(g.d2[m])) > 1 else None
        effective = a["alpha2"] - a.get("alpha3", 0.0) * float(np.log(d1 / f.unit))
        out.append({"D1": float(d1), "effective_alpha2": effective, "measured_log_slope": slope,
                    "points": int(m.sum()), "flat_or_rising": effective <= 0})
    return out


def _guidance(p: LawParams, f: law.Fit, g: grids.Grid, unit: float) -> dict[str, Any]:
    scratch = {}
    for kind, (tokens, loss, n) in g.scratch.items():
        if len(tokens) > 3:
            scratch[kind] = (_fit(p, "scratch", loss, tokens, None, unit)[0], n)
    costs = guidance.Costs(dense=g.dense, moe=g.active)
    d1_range = (float(g.d1.min()), float(g.d1.max()))
    dense_tokens = p.dense_tokens or d1_range[1]
    spent = 6 * g.active * g.d2 + (0.0 if p.sunk_dense else 6 * g.dense * g.d1)
    budgets = p.budgets or list(np.geomspace(spent.min(), 100 * spent.max(), 8))
    rows = [{**guidance.compare(c, f, scratch, costs, d1_range, p.sunk_dense, dense_tokens),
             "extrapolated": bool(c > spent.max())} for c in budgets]
    out: dict[str, Any] = {"sunk_dense": p.sunk_dense, "dense_tokens": dense_tokens if p.sunk_dense else None,
                           "budgets": rows, "scratch_fits": {k: {"params": s.params, "log_rmse": s.log_rmse(),
                                                                 "points": len(g.scratch[k][0]), "active_params": n}
                                                             for k, (s, n) in scratch.items()}}
    if "moe" in scratch:
        lo, hi = min(budgets) / 10, max(budgets) * 10
        out["crossovers"] = [{**c, "extrapolated": bool(c["compute"] > spent.max())} for c in guidance.crossovers(
            f, scratch["moe"], costs, d1_range, p.sunk_dense, dense_tokens, lo, hi)]
        out["crossover_range"] = [lo, hi]
        by_d1 = [{"D1": float(d1), **guidance.crossover_tokens(f, scratch["moe"], costs, d1, lo, hi)}
                 for d1 in np.unique(g.d1)]
        out["crossover_d2_by_d1"] = [{**c, "extrapolated": bool(c["D2"] is not None and c["D2"] > g.d2.max())}
                                     for c in by_d1]
    return out


def run(ctx: RunContext, p: LawParams) -> dict[str, Any]:
    g = grids.read(p.runs)
    tokens = np.concatenate([g.d1, g.d2, *[t for t, _, _ in g.scratch.values()]])
    unit = law.auto_unit(tokens) if p.token_unit == "auto" else float(p.token_unit)
    fitted = g.d2 < g.d2.max() if p.holdout == "largest_d2" else np.ones(len(g.loss), bool)
    problem = law.identifiable("interaction", g.d1[fitted], g.d2[fitted], unit)
    if problem:
        where = " below the largest D2" if p.holdout == "largest_d2" else ""
        raise UsageError(f"upcycling-law: {p.runs}: the {int(fitted.sum())} rows to fit{where}: {problem}")
    held = ~fitted
    forms: dict[str, Any] = {}
    fits: dict[str, law.Fit] = {}
    scales: dict[str, float] = {}
    for form in ("separable", "interaction"):
        extra = [np.concatenate([fits["separable"].x, [0.0]])] if form == "interaction" else []
        args = (form, g.loss[fitted], g.d1[fitted], g.d2[fitted], unit)
        f, scale = _fit(p, *args, extra=extra)
        fits[form], scales[form] = f, scale
        entry: dict[str, Any] = {"params": f.params, "intervals": f.intervals(p.level), "huber_scale": scale,
                                 "at_bounds": f.at_bounds(), "log_rmse_fit": _rmse(f, g, fitted),
                                 "log_rmse_heldout": _rmse(f, g, held)}
        if p.bootstrap:
            groups = g.run[fitted] if p.bootstrap_unit == "run" else None
            entry["bootstrap"] = law.bootstrap(*args, scale, p.bootstrap, p.level, ctx.config.seed, f, groups)
        if held.any():
            entry["heldout"] = [{"D1": float(a), "D2": float(b), "loss": float(c), "predicted": float(d)}
                                for a, b, c, d in zip(g.d1[held], g.d2[held], g.loss[held],
                                                      f.predict(g.d1[held], g.d2[held]), strict=True)]
        forms[form] = entry
        ctx.log.info("upcycling-law: %s fit %s", form, f.params)
    inter = forms["interaction"]
    a3 = inter.get("bootstrap", inter["intervals"])["alpha3"]
    asym = inter["intervals"]["alpha3"]
    out: dict[str, Any] = {
        "rows": int(len(g.loss)), "fitted_rows": int(fitted.sum()), "heldout_rows": int(held.sum()),
        "token_unit": unit, "level": p.level, "fits": forms,
        "alpha3": {"estimate": inter["params"]["alpha3"], "interval": list(a3),
                   "interval_kind": f"bootstrap over {p.bootstrap_unit}s" if p.bootstrap else "asymptotic",
                   "excludes_zero": bool(a3[0] > 0 or a3[1] < 0), "asymptotic_interval": list(asym),
                   "asymptotic_excludes_zero": bool(asym[0] > 0 or asym[1] < 0)},
        "rmse_ratio_fit": forms["separable"]["log_rmse_fit"] / max(inter["log_rmse_fit"], 1e-300),
        "per_d1": _per_d1(fits[p.form], g)}
    if held.any():
        out["rmse_ratio_heldout"] = forms["separable"]["log_rmse_heldout"] / max(inter["log_rmse_heldout"], 1e-300)
    if p.power_alpha3 is not None:
        out["power"] = power(fits["interaction"], g.d1[fitted], g.d2[fitted], p.power_alpha3, p.power_sims, p.level,
                             ctx.config.seed, scales["interaction"], p.power_noise)
    out["guidance"] = _guidance(p, fits[p.form], g, unit)
    return out
