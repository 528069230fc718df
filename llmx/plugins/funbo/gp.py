"""The zero-mean GP with a fixed RBF kernel that every acquisition function sees (notes §2.2 step 4): hyperparameters
are fitted once per function by maximum marginal likelihood on a seeded design, then fixed for the whole search."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class Kernel:
    """k(a, b) = variance * exp(-|a - b|^2 / (2 lengthscale^2)), plus ``noise`` on the training diagonal."""

    lengthscale: float
    variance: float
    noise: float

    def __call__(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        sq = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * a @ b.T
        return self.variance * np.exp(-0.5 * np.maximum(sq, 0.0) / self.lengthscale ** 2)

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def posterior(k_obs: np.ndarray, k_cross: np.ndarray, prior_var: float, noise: float,
              y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Latent mean and variance at m points from n observations: ``k_obs`` (n, n) without noise, ``k_cross`` (n, m)."""
    chol = np.linalg.cholesky(k_obs + noise * np.eye(len(k_obs)))
    alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, y))
    v = np.linalg.solve(chol, k_cross)
    return k_cross.T @ alpha, np.maximum(prior_var - (v * v).sum(0), 0.0)


def log_marginal_likelihood(kernel: Kernel, x: np.ndarray, y: np.ndarray) -> float:
    chol = np.linalg.cholesky(kernel(x, x) + kernel.noise * np.eye(len(x)))
    alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, y))
    return float(-0.5 * y @ alpha - np.log(np.diag(chol)).sum() - 0.5 * len(x) * np.log(2 * np.pi))


def _nll_and_grad(theta: np.ndarray, sq: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """Minus the log marginal likelihood in (log lengthscale, log variance, log noise) and its exact gradient,
    0.5 tr((K^-1 - alpha alpha^T) dK/dtheta)."""
    from scipy.linalg import cho_factor, cho_solve

    lengthscale, variance, noise = np.exp(theta)
    base = np.exp(-0.5 * sq / lengthscale ** 2)
    kf = variance * base
    try:
        factor = cho_factor(kf + noise * np.eye(len(y)), lower=True)
    except np.linalg.LinAlgError:
        return 1e10, np.zeros(3)
    alpha = cho_solve(factor, y)
    nll = 0.5 * y @ alpha + np.log(np.diag(factor[0])).sum() + 0.5 * len(y) * np.log(2 * np.pi)
    inner = cho_solve(factor, np.eye(len(y))) - np.outer(alpha, alpha)
    grads = (kf * sq / lengthscale ** 2, kf, noise * np.eye(len(y)))
    return float(nll), np.array([0.5 * np.sum(inner * g) for g in grads])


def fit(x: np.ndarray, y: np.ndarray, seed: int = 0, starts: int = 8) -> Kernel:
    """Maximum marginal likelihood over log lengthscale, variance and noise (L-BFGS-B with the exact gradient, seeded
    multi-start, bounded so that the noise stays a jitter-scale term and the lengthscale within the unit cube's
    scales)."""
    from scipy.optimize import minimize

    bounds = [(np.log(1e-3), np.log(2.0)), (np.log(1e-2), np.log(1e2)), (np.log(1e-6), np.log(1e-1))]
    rng = np.random.default_rng(seed)
    sq = np.maximum((x * x).sum(1)[:, None] + (x * x).sum(1)[None, :] - 2.0 * x @ x.T, 0.0)
    best = None
    for _ in range(starts):
        start = np.array([rng.uniform(lo, hi) for lo, hi in bounds])
        res = minimize(_nll_and_grad, start, args=(sq, y), jac=True, method="L-BFGS-B", bounds=bounds)
        if best is None or res.fun < best.fun:
            best = res
    return Kernel(*(float(v) for v in np.exp(best.x)))
