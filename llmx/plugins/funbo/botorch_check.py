"""BoTorch validation of the numpy evaluator (notes §6): the same fixed-hyperparameter GP as a ``SingleTaskGP``
(zero mean, no outcome transform), built-in EI / UCB / PI / posterior mean and any program as
``AnalyticAcquisitionFunction``s, maximised on the same Sobol grid by ``optimize_acqf_discrete``; the MES baseline,
which exists only here: Wang & Jegelka 2017's eq. 6, the expected entropy reduction of the minimum's value for
noiseless observations, in closed form over ``qMaxValueEntropy``'s min-value samples (the Gumbel approximation over
the grid, seeded per run, kept below the best observation as in the authors' code); and the paper's
re-check in a standard BoTorch loop (a random start, the GP refitted by ``fit_gpytorch_mll`` every trial, outcomes
standardised on what was observed so that a beta-sigma term stays scale-free). A program runs in the sandbox, as on
the numpy path: BoTorch's loop runs here and calls it with plain values."""

from __future__ import annotations

import contextlib
import functools
import math
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from llmx.plugins.funbo import bo
from llmx.plugins.funbo.sandbox import Limits, sandboxed

warnings.filterwarnings("ignore", message=".*ExpectedImprovement.*", module="botorch")


def _gp(x: np.ndarray, y: np.ndarray, kernel: bo.Kernel | None):
    from botorch.models import SingleTaskGP
    from gpytorch.constraints import GreaterThan
    from gpytorch.kernels import RBFKernel, ScaleKernel
    from gpytorch.likelihoods import GaussianLikelihood
    from gpytorch.means import ZeroMean

    X, Y = torch.as_tensor(x, dtype=torch.float64), torch.as_tensor(y, dtype=torch.float64).reshape(-1, 1)
    if kernel is None:
        return SingleTaskGP(X, Y, outcome_transform=None)
    covar = ScaleKernel(RBFKernel()).to(torch.float64)
    covar.base_kernel.lengthscale = kernel.lengthscale
    covar.outputscale = kernel.variance
    likelihood = GaussianLikelihood(noise_constraint=GreaterThan(1e-10)).to(torch.float64)
    likelihood.noise = kernel.noise
    gp = SingleTaskGP(X, Y, likelihood=likelihood, covar_module=covar, mean_module=ZeroMean(), outcome_transform=None)
    return gp.eval()


BUILTIN = ("ei", "ucb", "pi", "mean", "mes")
LOOP_SECONDS = 3600.0  # the wall-clock bound of a whole BoTorch loop; the program's CPU time has its own limit


@contextlib.contextmanager
def _af(af: str, limits: Limits) -> Iterator[str | Callable]:
    """BoTorch's own AF for ``mes`` or a baseline program's source (by its name), else the program, sandboxed, for
    the block."""
    name = _name(af)
    if name in BUILTIN:
        yield name
        return
    with sandboxed(af, limits, LOOP_SECONDS) as program:
        yield program


def acquisition(af: str | Callable, model, incumbent: float, beta: float, grid: torch.Tensor):
    """A built-in AF for a baseline's name (MES's min-value samples over ``grid``), else the program wrapped
    (one-hot at the index it returns)."""
    from botorch.acquisition import (
        AnalyticAcquisitionFunction,
        ExpectedImprovement,
        PosteriorMean,
        ProbabilityOfImprovement,
        UpperConfidenceBound,
    )
    from botorch.utils.transforms import t_batch_mode_transform

    builtin = {"ei": lambda: ExpectedImprovement(model, best_f=incumbent, maximize=False),
               "ucb": lambda: UpperConfidenceBound(model, beta=beta ** 2, maximize=False),
               "pi": lambda: ProbabilityOfImprovement(model, best_f=incumbent, maximize=False),
               "mean": lambda: PosteriorMean(model, maximize=False),
               "mes": lambda: _noiseless_mes()(model, candidate_set=grid, maximize=False)}
    if isinstance(af, str):
        return builtin[af]()
    program = af

    class Program(AnalyticAcquisitionFunction):
        @t_batch_mode_transform(expected_q=1)
        def forward(self, X: torch.Tensor) -> torch.Tensor:
            mean, sigma = self._mean_and_sigma(X)
            mean, var = mean.reshape(-1).detach().cpu().numpy(), (sigma ** 2).reshape(-1).detach().cpu().numpy()
            with np.errstate(all="ignore"):
                index = bo.check_index(program(mean, np.maximum(var, bo.VAR_FLOOR), incumbent, beta), len(mean))
            out = torch.zeros(len(mean), dtype=X.dtype, device=X.device)
            out[index] = 1.0
            return out

    return Program(model)


@functools.cache
def _noiseless_mes() -> type:
    """``qMaxValueEntropy`` with its information gain in Wang & Jegelka's closed form (eq. 6): with gamma = (y* - mu)
    / sigma per max-value sample y*, the mean of gamma psi(gamma) / (2 Psi(gamma)) - log Psi(gamma). As in the
    authors' code, a sample is lifted to at least the best observation plus 5 noise deviations (a max-value below
    what was observed makes the gain at an observed point grow without bound, and the loop re-queries it). BoTorch's
    own gain is the noisy-observation form, a Monte Carlo estimate over 128 draws of y; the protocol observes the
    function exactly (its GP's noise is a fitted nugget), and the closed form takes about half the time."""
    from botorch.acquisition import qMaxValueEntropy

    class NoiselessMES(qMaxValueEntropy):
        def _sample_max_values(self, num_samples, X_pending=None):
            super()._sample_max_values(num_samples, X_pending)
            best = (self.weight * self.model.train_targets).max()
            floor = (best + 5 * self.model.likelihood.noise.sqrt().reshape(())).detach()
            self.posterior_max_values = self.posterior_max_values.clamp_min(floor)

        def _compute_information_gain(self, X, mean_M, variance_M, covar_mM):
            samples = self.posterior_max_values  # num_mv_samples x num_fantasies, in the maximising sign
            y_star = samples.view(samples.shape[0], *[1] * (mean_M.ndim - 1), samples.shape[-1])
            gamma = (y_star - mean_M) / variance_M.sqrt()
            log_cdf = torch.special.log_ndtr(gamma)
            log_pdf = -0.5 * gamma ** 2 - 0.5 * math.log(2 * math.pi)
            ig = (0.5 * gamma * torch.exp(log_pdf - log_cdf) - log_cdf).mean(dim=0)  # batch_shape x num_fantasies
            return ig.permute(-1, *range(ig.ndim - 1))

    return NoiselessMES


def _argmax(acqf, grid: torch.Tensor) -> int:
    from botorch.optim import optimize_acqf_discrete

    x, _ = optimize_acqf_discrete(acqf, q=1, choices=grid, max_batch_size=len(grid), unique=False)
    return int(torch.cdist(x, grid).argmin())


def _name(af: str) -> str:
    """A baseline program's name where ``af`` is its source, else ``af`` itself."""
    from llmx.plugins.funbo.afs import SOURCES

    return next((k for k, v in SOURCES.items() if v == af and k in BUILTIN), af)


def run_fixed(af: str | None, problem: bo.Problem, trials: int, beta: float, seed: int = 0,
              limits: Limits = Limits(), indices: bool = False) -> list:
    """The numpy protocol through BoTorch: fixed kernel, worst grid point first; ``af`` a program's source, ``mes``,
    or None (random search). Best value after each trial (``indices``: the grid indices queried); ``seed`` draws
    random search's queries and MES's samples."""
    grid = torch.as_tensor(problem.grid, dtype=torch.float64)
    rng = np.random.default_rng(seed)
    observed = [problem.init]
    with contextlib.nullcontext() if af is None else _af(af, limits) as policy, torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for _ in range(trials):
            if policy is None:
                index = int(rng.integers(len(problem.y)))
            else:
                model = _gp(problem.grid[observed], problem.z[observed], problem.spec.kernel)
                index = _argmax(acquisition(policy, model, float(problem.z[observed].min()), beta, grid), grid)
            observed.append(index)
    return observed if indices else bo.best_so_far(problem.y, observed)


def score(af: str | None, spec: bo.ProblemSpec, p: Any, seed: int = 0) -> dict:
    """One problem's score and regret curve (``af`` as ``run_fixed``'s)."""
    problem = bo.Problem.build(spec)
    best = run_fixed(af, problem, p.trials, p.beta, seed, Limits(p.timeout_s, p.memory_mb, p.unsafe_unconfined))
    return {"score": bo.score(best, problem, p.time_term), "regret": bo.regret(best, problem)}


def standard(source: str, spec: bo.ProblemSpec, trials: int, beta: float, seed: int,
             limits: Limits = Limits()) -> list[float]:
    """A standard BoTorch loop after the paper's re-check: a random first point, the GP (BoTorch's default priors)
    refitted by marginal likelihood every trial; normalised regret after each trial against the grid's range. The AF
    is still maximised on the grid: the paper optimises it numerically, which an index-returning program does not
    allow."""
    if source is None:
        raise ValueError("the standard loop needs a program; random search has no acquisition function")
    from botorch.fit import fit_gpytorch_mll
    from gpytorch.mlls import ExactMarginalLogLikelihood

    problem = bo.Problem.build(spec)
    grid = torch.as_tensor(problem.grid, dtype=torch.float64)
    observed = [int(np.random.default_rng(seed).integers(len(problem.y)))]
    best = [float(problem.y[observed[0]])]
    with _af(source, limits) as af:
        for _ in range(trials):
            y = problem.y[observed]
            z = (y - y.mean()) / (y.std(ddof=1) if len(y) > 1 and y.std() > 0 else 1.0)  # as BoTorch's check measures
            model = _gp(problem.grid[observed], z, None)
            fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
            model.eval()
            index = _argmax(acquisition(af, model, float(z.min()), beta, grid), grid)
            observed.append(index)
            best.append(min(best[-1], float(problem.y[index])))
    return bo.regret(best, problem)
