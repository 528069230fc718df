"""Fitting ``L = E + exp(Φ θ)`` in log space: the upcycling law (Liew et al. §3, the form recalled in the notes and
kept an option) and the from-scratch power laws share this shape.

    interaction  L = E + A · d1^(−α1) · d2^(−α2 + α3 ln d1)    Φ = [1, −ln d1, −ln d2, ln d1 · ln d2]
    separable    the same with α3 = 0                            Φ = [1, −ln d1, −ln d2]
    scratch      L = E + B · d^(−β)                              Φ = [1, −ln d]

with ``d = D / unit`` (token counts normalised: raw counts make E and A nearly unidentifiable, notes §2.4). The
solver is SciPy's bounded ``least_squares`` on ``ln L̂ − ln L`` with a Huber loss, from a multi-start grid: E at
fractions of the smallest loss (E is bounded below it), θ by linear least squares of ``ln(L − E)`` on Φ and two
rescalings of its exponents.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

FORMS = {
    "interaction": ("log_A", "alpha1", "alpha2", "alpha3"),
    "separable": ("log_A", "alpha1", "alpha2"),
    "scratch": ("log_B", "beta"),
}
BOUNDS = {"log_A": (-200.0, 200.0), "log_B": (-200.0, 200.0), "alpha1": (-2.0, 5.0), "alpha2": (-2.0, 5.0),
          "alpha3": (-1.0, 1.0), "beta": (-2.0, 5.0)}
E_FRACTIONS = (0.0, 0.25, 0.5, 0.75, 0.9, 0.97)
EXPONENT_SCALES = (1.0, 0.5, 2.0)


def design(form: str, d1: np.ndarray, d2: np.ndarray | None = None) -> np.ndarray:
    """Φ for normalised token counts (``d1`` is ``d`` for the scratch form)."""
    l1 = np.log(d1)
    if form == "scratch":
        return np.stack([np.ones_like(l1), -l1], axis=1)
    l2 = np.log(d2)
    cols = [np.ones_like(l1), -l1, -l2] + ([l1 * l2] if form == "interaction" else [])
    return np.stack(cols, axis=1)


@dataclass
class Fit:
    form: str
    unit: float
    x: np.ndarray  # [E, *theta]
    cost: float
    residuals: np.ndarray
    jacobian: np.ndarray
    e_max: float = float("inf")  # E's upper bound: just under the smallest loss fitted
    names: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        self.names = ("E", *FORMS[self.form])

    @property
    def params(self) -> dict[str, float]:
        return dict(zip(self.names, map(float, self.x), strict=True))

    def predict(self, d1: np.ndarray, d2: np.ndarray | None = None) -> np.ndarray:
        """Loss at raw token counts."""
        d1 = np.asarray(d1, float) / self.unit
        d2 = None if d2 is None else np.asarray(d2, float) / self.unit
        return self.x[0] + np.exp(design(self.form, d1, d2) @ self.x[1:])

    def log_rmse(self) -> float:
        return float(np.sqrt(np.mean(self.residuals ** 2)))

    def at_bounds(self) -> list[str]:
        """Parameters the solver left on a bound (E at 0 or at the smallest loss, say): their intervals mean little."""
        lo, hi = bounds(self.form, self.e_max)
        return [k for k, v, a, b in zip(self.names, self.x, lo, hi, strict=True)
                if min(v - a, b - v) <= 1e-6 * (b - a)]

    def intervals(self, level: float) -> dict[str, tuple[float, float]]:
        """Asymptotic intervals: σ² (JᵀJ)⁻¹ with σ² the residual variance on n − p degrees of freedom."""
        from scipy.stats import norm

        n, p = self.jacobian.shape
        sigma2 = float(np.sum(self.residuals ** 2)) / max(n - p, 1)
        cov = sigma2 * np.linalg.pinv(self.jacobian.T @ self.jacobian)
        z = float(norm.ppf(0.5 + level / 2))
        se = np.sqrt(np.clip(np.diag(cov), 0.0, None))
        return {k: (float(v - z * s), float(v + z * s)) for k, v, s in zip(self.names, self.x, se, strict=True)}


def _residuals(x: np.ndarray, phi: np.ndarray, log_loss: np.ndarray) -> np.ndarray:
    return np.log(x[0] + np.exp(phi @ x[1:])) - log_loss


def _jacobian(x: np.ndarray, phi: np.ndarray, log_loss: np.ndarray) -> np.ndarray:
    reducible = np.exp(phi @ x[1:])
    pred = x[0] + reducible
    return np.concatenate([(1.0 / pred)[:, None], (reducible / pred)[:, None] * phi], axis=1)


def bounds(form: str, e_max: float) -> tuple[list[float], list[float]]:
    return [0.0] + [BOUNDS[k][0] for k in FORMS[form]], [e_max] + [BOUNDS[k][1] for k in FORMS[form]]


def identifiable(form: str, d1: np.ndarray, d2: np.ndarray | None, unit: float) -> str | None:
    """Why the grid cannot pin the form's parameters, or None: more distinct points than parameters and a design
    of full column rank (so at least two values of D1 and of D2, and three D2 per D1 pattern for the interaction)."""
    pts = np.unique(np.stack([d1, d1 if d2 is None else d2], axis=1), axis=0)
    p = 1 + len(FORMS[form])
    if len(pts) <= p:
        return f"{len(pts)} distinct points; the {form} law has {p} parameters and needs more points than that"
    phi = design(form, pts[:, 0] / unit, None if d2 is None else pts[:, 1] / unit)
    if np.linalg.matrix_rank(phi) < phi.shape[1]:
        return (f"the points cannot separate the {form} law's exponents (its design has rank "
                f"{np.linalg.matrix_rank(phi)} of {phi.shape[1]}): vary both D1 and D2")
    return None


def starts(phi: np.ndarray, loss: np.ndarray, e_max: float,
           scales: tuple[float, ...] = EXPONENT_SCALES) -> list[np.ndarray]:
    """The multi-start grid (module docstring): 6 values of E times 3 exponent scalings."""
    out = []
    for frac in E_FRACTIONS:
        e = frac * e_max
        theta, *_ = np.linalg.lstsq(phi, np.log(loss - e), rcond=None)
        for scale in scales:
            t = theta.copy()
            t[1:] *= scale
            t[0] = float(np.mean(np.log(loss - e) - phi[:, 1:] @ t[1:]))  # the intercept that fits the mean
            out.append(np.concatenate([[e], t]))
    return out


def fit(form: str, loss: np.ndarray, d1: np.ndarray, d2: np.ndarray | None = None, unit: float = 1.0,
        f_scale: float = 1e-3, extra_starts: list[np.ndarray] = (),
        scales: tuple[float, ...] = EXPONENT_SCALES) -> Fit:
    """The best of the multi-start fits (lowest Huber cost) of ``form`` to losses at raw token counts;
    ``extra_starts`` join the grid, whose exponent ``scales`` may be cut (refits near a known solution)."""
    from scipy.optimize import least_squares

    loss = np.asarray(loss, float)
    phi = design(form, np.asarray(d1, float) / unit, None if d2 is None else np.asarray(d2, float) / unit)
    log_loss = np.log(loss)
    e_max = (1.0 - 1e-6) * float(loss.min())
    lo, hi = bounds(form, e_max)
    best = None
    for x0 in [*starts(phi, loss, e_max, scales), *extra_starts]:
        x0 = np.clip(x0, lo, hi)
        r = least_squares(_residuals, x0, jac=_jacobian, bounds=(lo, hi), loss="huber", f_scale=f_scale,
                          args=(phi, log_loss), x_scale="jac", max_nfev=2000)
        if best is None or r.cost < best.cost:
            best = r
    return Fit(form, unit, best.x, float(best.cost), best.fun, _jacobian(best.x, phi, log_loss), e_max)


def auto_unit(tokens: np.ndarray) -> float:
    """A power of ten near the median token count."""
    return float(10.0 ** math.floor(math.log10(float(np.median(tokens)))))


WEBB = np.array([-np.sqrt(1.5), -1.0, -np.sqrt(0.5), np.sqrt(0.5), 1.0, np.sqrt(1.5)])  # Webb's six-point weights


def robust_scale(fit_: Fit) -> float:
    """Huber's tuning 1.345 sigma, sigma from the residuals' median absolute deviation (``huber_scale: auto``),
    floored at 1e-4."""
    r = fit_.residuals
    return max(float(1.345 * 1.4826 * np.median(np.abs(r - np.median(r)))), 1e-4)


def bootstrap(form: str, loss: np.ndarray, d1: np.ndarray, d2: np.ndarray | None, unit: float, f_scale: float,
              draws: int, level: float, seed: int, start: Fit, groups: np.ndarray | None = None
              ) -> dict[str, tuple[float, float]]:
    """Percentile intervals from refits, each from the full fit's solution and the grid's E values.

    ``groups`` (one label a row: the run it came from): a wild cluster bootstrap, since a run's checkpoints share
    its noise and a grid has few runs: the design stays fixed and each run's log residuals are multiplied by one
    Webb weight. None: rows resampled with replacement (resamples the law cannot be identified on are redrawn)."""
    from llmx.errors import UsageError

    rng = np.random.default_rng(seed)
    samples = []
    if groups is not None:
        _, run = np.unique(np.asarray(groups), return_inverse=True)
        fitted = np.log(start.predict(d1, d2))
        for _ in range(draws):
            weights = rng.choice(WEBB, run.max() + 1)[run]
            boot = np.exp(fitted - weights * start.residuals)  # residuals are log fit - log loss
            samples.append(fit(form, boot, d1, d2, unit, f_scale, [start.x], scales=(1.0,)).x)
    tries = 0
    while len(samples) < draws:
        tries += 1
        if tries > 50 * draws:
            raise UsageError(f"upcycling-law: too few points to bootstrap the {form} law by rows; set bootstrap: 0")
        idx = rng.integers(0, len(loss), len(loss))
        sub = (d1[idx], None if d2 is None else d2[idx])
        if identifiable(form, *sub, unit):
            continue
        samples.append(fit(form, loss[idx], *sub, unit, f_scale, [start.x], scales=(1.0,)).x)
    arr = np.array(samples)
    q = ((1 - level) / 2, (1 + level) / 2)
    return {k: tuple(float(v) for v in np.quantile(arr[:, j], q)) for j, k in enumerate(start.names)}
