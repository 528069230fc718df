"""Global-optimisation test functions for FunBO, in numpy, minimisation convention.

Definitions and domains follow BoTorch's ``botorch.test_functions.synthetic`` and the SFU library
(Surjanovic & Bingham, https://www.sfu.ca/~ssurjano/optimization.html). Schwefel, Goldstein-Price and Sphere are missing
from BoTorch and are written by hand from the SFU formulas; Weierstrass (in neither) is the CEC benchmarks' form, a=0.5,
b=3, kmax=20, shifted so its minimum is 0. Every formula is defined on all of R^d, so shifted instances may evaluate
outside the domain. An instance's scale leaves the BO protocol unchanged (outputs are standardised on the grid and
regret is normalised): only its shift makes it a new problem.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from llmx.errors import UsageError


@dataclass(frozen=True)
class Function:
    """A test function on a box; ``argmins`` are known global minimisers inside the box (may be empty)."""

    name: str
    dim: int
    lower: tuple[float, ...]
    upper: tuple[float, ...]
    optimum: float
    base: Callable[[np.ndarray], np.ndarray]
    scale: float = 1.0
    shift: tuple[float, ...] = ()
    argmins: tuple[tuple[float, ...], ...] = ()

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """Values at ``x`` (n, dim) in the original domain -> (n,) float64."""
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(f"{self.name}: expected points of shape (n, {self.dim}), got {x.shape}")
        if self.shift:
            x = x - np.asarray(self.shift) * self._width
        return self.scale * np.asarray(self.base(x), dtype=np.float64)

    def on_unit(self, u: np.ndarray) -> np.ndarray:
        """Values at ``u`` in [0, 1]^dim, mapped linearly onto the domain."""
        return self(np.asarray(self.lower) + np.asarray(u, dtype=np.float64) * self._width)

    def instance(self, seed: int) -> Function:
        """Scaled and shifted copy (MetaBO style): s ~ U[0.9, 1.1], t ~ U[-0.1, 0.1]^dim in unit-cube units,
        f(x) = s * base(x - t * (upper - lower)); its optimum is s * f* if a shifted minimiser stays in the domain, else nan."""
        if self.scale != 1.0 or self.shift:
            raise ValueError(f"{self.name} is already an instance; call instance() on the registered function")
        rng = np.random.default_rng(seed)
        scale = float(rng.uniform(0.9, 1.1))
        shift = rng.uniform(-0.1, 0.1, self.dim)
        lo, hi = np.asarray(self.lower), np.asarray(self.upper)
        moved = [np.asarray(a) + shift * self._width for a in self.argmins]
        inside = tuple(tuple(float(v) for v in a) for a in moved if np.all((a >= lo) & (a <= hi)))
        return replace(self, name=f"{self.name}#{seed}", scale=scale, shift=tuple(float(v) for v in shift),
                       optimum=scale * self.optimum if inside else math.nan, argmins=inside)

    @property
    def _width(self) -> np.ndarray:
        return np.asarray(self.upper) - np.asarray(self.lower)


def _box(name: str, dim: int, lo: float, hi: float, optimum: float, base, argmin: tuple[float, ...] | None) -> Function:
    return Function(name, dim, (lo,) * dim, (hi,) * dim, optimum, base, argmins=(argmin,) if argmin else ())


def ackley(d: int) -> Function:
    """Ackley (a=20, b=0.2, c=2π) on [-32.768, 32.768]^d; min 0 at 0."""

    def f(x):
        return (-20.0 * np.exp(-0.2 * np.sqrt(np.mean(x**2, axis=1))) - np.exp(np.mean(np.cos(2 * np.pi * x), axis=1))
                + 20.0 + math.e)

    return _box(f"ackley-{d}d", d, -32.768, 32.768, 0.0, f, (0.0,) * d)


def levy(d: int) -> Function:
    """Levy on [-10, 10]^d; min 0 at 1."""

    def f(x):
        w = 1.0 + (x - 1.0) / 4.0
        head = np.sin(np.pi * w[:, 0]) ** 2
        mid = np.sum((w[:, :-1] - 1) ** 2 * (1 + 10 * np.sin(np.pi * w[:, :-1] + 1) ** 2), axis=1)
        tail = (w[:, -1] - 1) ** 2 * (1 + np.sin(2 * np.pi * w[:, -1]) ** 2)
        return head + mid + tail

    return _box(f"levy-{d}d", d, -10.0, 10.0, 0.0, f, (1.0,) * d)


def schwefel(d: int) -> Function:
    """Schwefel, 418.9829 d - Σ x_i sin(√|x_i|), on [-500, 500]^d; min ≈ 0 (1.3e-5 d) at 420.9687."""

    def f(x):
        return 418.9829 * d - np.sum(x * np.sin(np.sqrt(np.abs(x))), axis=1)

    return _box(f"schwefel-{d}d", d, -500.0, 500.0, 0.0, f, (420.9687,) * d)


def rosenbrock(d: int) -> Function:
    """Rosenbrock on [-5, 10]^d; min 0 at 1. For d=1 (FunBO's OOD-Bench "1-D Rosenbrock", whose definition the paper
    does not give) this is a reconstruction: (1 - x)^2, the only term of the sum that needs no successor coordinate."""

    def f(x):
        if d == 1:
            return (1.0 - x[:, 0]) ** 2
        return np.sum(100.0 * (x[:, 1:] - x[:, :-1] ** 2) ** 2 + (x[:, :-1] - 1) ** 2, axis=1)

    return _box(f"rosenbrock-{d}d", d, -5.0, 10.0, 0.0, f, (1.0,) * d)


def rastrigin(d: int) -> Function:
    """Rastrigin on [-5.12, 5.12]^d; min 0 at 0."""

    def f(x):
        return 10.0 * d + np.sum(x**2 - 10.0 * np.cos(2 * np.pi * x), axis=1)

    return _box(f"rastrigin-{d}d", d, -5.12, 5.12, 0.0, f, (0.0,) * d)


def sphere(d: int) -> Function:
    """Sphere, Σ x_i^2, on [-5.12, 5.12]^d; min 0 at 0."""
    return _box(f"sphere-{d}d", d, -5.12, 5.12, 0.0, lambda x: np.sum(x**2, axis=1), (0.0,) * d)


def styblinski_tang(d: int) -> Function:
    """Styblinski-Tang, ½ Σ (x_i^4 - 16 x_i^2 + 5 x_i), on [-5, 5]^d; min -39.16617 d at -2.903534."""

    def f(x):
        return 0.5 * np.sum(x**4 - 16 * x**2 + 5 * x, axis=1)

    return _box(f"styblinski-tang-{d}d", d, -5.0, 5.0, -39.16616570377142 * d, f, (-2.9035340276126953,) * d)


def weierstrass(d: int, a: float = 0.5, b: float = 3.0, kmax: int = 20) -> Function:
    """Weierstrass, Σ_i Σ_k a^k cos(2π b^k (x_i + ½)) - d Σ_k a^k cos(π b^k), k = 0..kmax, on [-0.5, 0.5]^d; min 0 at 0."""
    ak, bk = a ** np.arange(kmax + 1), b ** np.arange(kmax + 1)
    const = d * np.sum(ak * np.cos(np.pi * bk))

    def f(x):
        return np.sum(ak * np.cos(2 * np.pi * bk * (x[..., None] + 0.5)), axis=(1, 2)) - const

    return _box(f"weierstrass-{d}d", d, -0.5, 0.5, 0.0, f, (0.0,) * d)


_MICHALEWICZ = {2: (-1.8013034100985537, (2.2029055201726, 1.5707963267949)), 5: (-4.687658, None), 10: (-9.66015, None)}


def michalewicz(d: int, m: int = 10) -> Function:
    """Michalewicz, -Σ sin(x_i) sin^{2m}(i x_i^2 / π) with m=10, on [0, π]^d; optimum known for d = 2, 5, 10 (else nan)."""
    i = np.arange(1, d + 1)

    def f(x):
        return -np.sum(np.sin(x) * np.sin(i * x**2 / np.pi) ** (2 * m), axis=1)

    optimum, argmin = _MICHALEWICZ.get(d, (math.nan, None))
    return _box(f"michalewicz-{d}d", d, 0.0, math.pi, optimum, f, argmin)


def _beale(x):
    x1, x2 = x[:, 0], x[:, 1]
    return (1.5 - x1 + x1 * x2) ** 2 + (2.25 - x1 + x1 * x2**2) ** 2 + (2.625 - x1 + x1 * x2**3) ** 2


def _branin(x):
    x1, x2 = x[:, 0], x[:, 1]
    return (x2 - 5.1 / (4 * np.pi**2) * x1**2 + 5 / np.pi * x1 - 6) ** 2 + 10 * (1 - 1 / (8 * np.pi)) * np.cos(x1) + 10


def _goldstein_price(x):
    x1, x2 = x[:, 0], x[:, 1]
    a = 1 + (x1 + x2 + 1) ** 2 * (19 - 14 * x1 + 3 * x1**2 - 14 * x2 + 6 * x1 * x2 + 3 * x2**2)
    b = 30 + (2 * x1 - 3 * x2) ** 2 * (18 - 32 * x1 + 12 * x1**2 + 48 * x2 - 36 * x1 * x2 + 27 * x2**2)
    return a * b


_HARTMANN_ALPHA = np.array([1.0, 1.2, 3.0, 3.2])
_HARTMANN = {
    3: (np.array([[3.0, 10, 30], [0.1, 10, 35], [3.0, 10, 30], [0.1, 10, 35]]),
        1e-4 * np.array([[3689, 1170, 2673], [4699, 4387, 7470], [1091, 8732, 5547], [381, 5743, 8828]]),
        -3.8627797873326615, (0.1145888571, 0.5556488891, 0.8525469840)),
    6: (np.array([[10, 3, 17, 3.5, 1.7, 8], [0.05, 10, 17, 0.1, 8, 14], [3, 3.5, 1.7, 10, 17, 8], [17, 8, 0.05, 10, 0.1, 14]]),
        1e-4 * np.array([[1312, 1696, 5569, 124, 8283, 5886], [2329, 4135, 8307, 3736, 1004, 9991],
                         [2348, 1451, 3522, 2883, 3047, 6650], [4047, 8828, 8732, 5743, 1091, 381]]),
        -3.3223680114155147, (0.2016895, 0.1500107, 0.476874, 0.2753324, 0.3116516, 0.6573005)),
}


def hartmann(d: int) -> Function:
    """Hartmann-3 or -6 on [0, 1]^d; min -3.86278 (d=3) or -3.32237 (d=6), refined numerically to float64."""
    A, P, optimum, argmin = _HARTMANN[d]

    def f(x):
        return -np.sum(_HARTMANN_ALPHA * np.exp(-np.sum(A * (x[:, None, :] - P) ** 2, axis=2)), axis=1)

    return _box(f"hartmann-{d}", d, 0.0, 1.0, optimum, f, argmin)


_REGISTRY: dict[str, Function] = {f.name: f for f in (
    ackley(1), ackley(2), levy(1), schwefel(1), rastrigin(1), rosenbrock(1), rosenbrock(2), sphere(2),
    styblinski_tang(2), weierstrass(2), michalewicz(2), hartmann(3), hartmann(6),
    Function("beale", 2, (-4.5, -4.5), (4.5, 4.5), 0.0, _beale, argmins=((3.0, 0.5),)),
    Function("branin", 2, (-5.0, 0.0), (10.0, 15.0), 10 / (8 * math.pi), _branin,
             argmins=((-math.pi, 12.275), (math.pi, 2.275), (3 * math.pi, 2.475))),
    Function("goldstein-price", 2, (-2.0, -2.0), (2.0, 2.0), 3.0, _goldstein_price, argmins=((0.0, -1.0),)),
)}
NAMES: tuple[str, ...] = tuple(_REGISTRY)


def get(name: str) -> Function:
    """The registered function ``name``."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    close = difflib.get_close_matches(name, NAMES, n=1)
    hint = f"did you mean '{close[0]}'?" if close else f"known: {', '.join(NAMES)}"
    raise UsageError(f"unknown function '{name}'; {hint}")


def parse_set(spec: str | list[str]) -> list[Function]:
    """Functions named in a comma-separated string or a list of names."""
    parts = spec.split(",") if isinstance(spec, str) else [p for s in spec for p in s.split(",")]
    names = [p.strip() for p in parts if p.strip()]
    if not names:
        raise UsageError(f"no function names in {spec!r}; known: {', '.join(NAMES)}")
    return [get(n) for n in names]
