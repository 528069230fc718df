"""The BO evaluator of an acquisition function (notes §2.2 steps 4-5): a fixed GP on a Sobol grid of the unit cube,
the worst grid point first, T trials each at the AF's chosen grid index, and FunBO's score

    [1 - (y_found - y*) / (y_init - y*)] + [1 - t_found / T]

with y* the grid's minimum (the best a grid search can reach). ``time_term: optimum`` (default) takes t_found as the
trial that hit y*, T when none did (the notes: "the fraction of budget left when the optimum was hit"); ``found`` as
the trial that first reached y_found, which rewards an AF that stops improving early."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from llmx.plugins.funbo import functions as F
from llmx.plugins.funbo.gp import Kernel, fit, posterior

Policy = Callable[[np.ndarray, np.ndarray, float, float], object]
VAR_FLOOR = 1e-12  # the latent variance handed to an AF is floored here (a numerically zero variance would give 0/0)


class AFError(Exception):
    """An acquisition function that failed on a problem: the message is the reason it is scored with."""


def grid_points(dim: int, points: int | None) -> int:
    """The paper's grid: 1,000 points in 1-D, 2,048 above."""
    return points or (1000 if dim == 1 else 2048)


def function(name: str) -> F.Function:
    """A registered function, or its seeded scale/shift instance for ``name#seed``."""
    base, _, seed = name.partition("#")
    f = F.get(base)
    return f.instance(int(seed)) if seed else f


def sobol(dim: int, points: int, seed: int) -> np.ndarray:
    from scipy.stats import qmc

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 1,000 is not a power of two: the paper's size, balance properties aside
        return qmc.Sobol(dim, scramble=True, seed=seed).random(points)


@dataclass(frozen=True)
class ProblemSpec:
    """What a child process needs to rebuild a problem exactly: the function, the grid and the fitted kernel."""

    function: str
    points: int
    grid_seed: int
    kernel: Kernel

    def as_dict(self) -> dict:
        return {"function": self.function, "points": self.points, "grid_seed": self.grid_seed,
                "kernel": self.kernel.as_dict()}

    @classmethod
    def from_dict(cls, d: dict) -> ProblemSpec:
        return cls(d["function"], int(d["points"]), int(d["grid_seed"]), Kernel(**d["kernel"]))


@lru_cache(maxsize=512)
def spec(name: str, points: int | None = None, grid_seed: int = 0, fit_points: int = 128) -> ProblemSpec:
    """The problem of ``name``: its grid and the kernel of its base function (an instance's scale vanishes in the
    standardisation and its shift keeps the smoothness), fitted offline on a seeded subset of the grid, outputs
    standardised by the grid's mean and standard deviation (a fixed transform of the function)."""
    base = name.partition("#")[0]
    n = grid_points(function(base).dim, points)
    return ProblemSpec(name, n, grid_seed, _kernel(base, n, grid_seed, fit_points))


@lru_cache(maxsize=128)
def _kernel(base: str, points: int, grid_seed: int, fit_points: int) -> Kernel:
    f = function(base)
    grid = sobol(f.dim, points, grid_seed)
    z = _standardise(f.on_unit(grid))
    sub = np.random.default_rng(grid_seed).choice(points, size=min(fit_points, points), replace=False)
    return fit(grid[sub], z[sub], seed=grid_seed)


def _standardise(y: np.ndarray) -> np.ndarray:
    return (y - y.mean()) / (y.std() or 1.0)


@dataclass
class Problem:
    spec: ProblemSpec
    grid: np.ndarray = field(repr=False)
    y: np.ndarray = field(repr=False)
    z: np.ndarray = field(repr=False)
    gram: np.ndarray = field(repr=False)

    @classmethod
    def build(cls, s: ProblemSpec) -> Problem:
        grid = sobol(function(s.function).dim, s.points, s.grid_seed)
        y = grid_values(s)
        return cls(s, grid, y, _standardise(y), s.kernel(grid, grid))

    @property
    def init(self) -> int:
        return int(np.argmax(self.y))

    @property
    def y_star(self) -> float:
        return float(self.y.min())

    def posterior(self, observed: list[int]) -> tuple[np.ndarray, np.ndarray]:
        k = self.spec.kernel
        return posterior(self.gram[np.ix_(observed, observed)], self.gram[observed], k.variance, k.noise,
                         self.z[observed])


def check_index(value: object, size: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise AFError(f"returned {type(value).__name__} {str(value)[:40]}, not an integer grid index")
    if not 0 <= int(value) < size:
        raise AFError(f"returned index {int(value)} outside the grid's 0..{size - 1}")
    return int(value)


def run(problem: Problem, policy: Policy, trials: int = 30, beta: float = 1.0, indices: bool = False) -> list:
    """Best value found after each trial, the initial (worst) point first: ``trials + 1`` values (with ``indices``:
    the grid indices queried instead)."""
    observed = [problem.init]
    for _ in range(trials):
        mean, var = problem.posterior(observed)
        incumbent = float(problem.z[observed].min())
        with np.errstate(all="ignore"):
            chosen = policy(mean, np.maximum(var, VAR_FLOOR), incumbent, beta)
        observed.append(check_index(chosen, len(problem.y)))
    return observed if indices else best_so_far(problem.y, observed)


def best_so_far(y: np.ndarray, observed: list[int]) -> list[float]:
    return np.minimum.accumulate(y[observed]).astype(float).tolist()


@lru_cache(maxsize=1024)
def grid_values(s: ProblemSpec) -> np.ndarray:
    """The function on the problem's grid (what the parent needs to score a child's queries)."""
    f = function(s.function)
    y = f.on_unit(sobol(f.dim, s.points, s.grid_seed)).astype(np.float64)
    y.setflags(write=False)
    return y


def regret(best: list[float], problem: Problem | np.ndarray) -> list[float]:
    """Normalised simple regret per trial: (best_t - y*) / (y_init - y*), y_init the grid's worst value."""
    y = problem.y if isinstance(problem, Problem) else problem
    low, span = float(y.min()), float(y.max() - y.min())
    return [(b - low) / span if span > 0 else 0.0 for b in best]


def score(best: list[float], problem: Problem | np.ndarray, time_term: str = "optimum") -> float:
    y = problem.y if isinstance(problem, Problem) else problem
    trials = len(best) - 1
    r = regret(best, y)[-1]
    target = best[-1] if time_term == "found" else float(y.min())
    hit = next((t for t, b in enumerate(best) if b <= target), trials)
    return (1.0 - r) + (1.0 - hit / trials)


def random_policy(seed: int) -> Policy:
    """Random search: a uniform grid index each trial, whatever the posterior."""
    rng = np.random.default_rng(seed)
    return lambda mean, var, incumbent, beta: int(rng.integers(len(mean)))
