"""The baselines as programs of the evolved signature (minimisation; z = (incumbent - mu) / sigma): EI (the search's
seed), UCB (beta = 1, the lower bound mu - beta sigma minimised), PI, the posterior mean, and the OOD AF the notes
recall from a secondary summary of the paper (EI + beta sigma; unverified). Two baselines are policies, not programs:
random search (``bo.random_policy``) ignores the posterior, and MES (max-value entropy search, Wang & Jegelka 2017) is
BoTorch's ``qMaxValueEntropy`` on the same GP and grid (``botorch_check``).

``TEXTBOOK`` are the programs the ``scripted`` sampler proposes: textbook AFs written by hand as programs (EI and PI
with an improvement margin xi, lower confidence bounds mu - kappa beta sigma, the posterior variance), not found by
any model."""

from __future__ import annotations

from pathlib import Path

from llmx.errors import UsageError

_HEAD = ('def acquisition_function(predictive_mean, predictive_var, incumbent, beta=1.0):\n'
         '  """Returns the index of the point to collect next."""\n')
_Z = "  sigma = np.sqrt(predictive_var)\n  z = (incumbent - predictive_mean) / sigma\n"
SOURCES = {
    "ei": _HEAD + _Z + "  ei = (incumbent - predictive_mean) * norm.cdf(z) + sigma * norm.pdf(z)\n  return np.argmax(ei)\n",
    "ucb": _HEAD + "  return np.argmax(-(predictive_mean - beta * np.sqrt(predictive_var)))\n",
    "pi": _HEAD + _Z + "  return np.argmax(norm.cdf(z))\n",
    "mean": _HEAD + "  return np.argmin(predictive_mean)\n",
    "ood-paper": _HEAD + _Z + "  ei = (incumbent - predictive_mean) * norm.cdf(z) + sigma * norm.pdf(z)\n"
                 "  return np.argmax(ei + beta * sigma)\n",
}
POLICIES = ("random", "mes")
BASELINES = (*SOURCES, *POLICIES)


def _margin(xi: float, score: str) -> str:
    """EI or PI with the improvement margin ``xi`` (Lizotte 2008): z = (incumbent - mu - xi) / sigma."""
    gap = f"  gap = incumbent - predictive_mean - {xi}\n  sigma = np.sqrt(predictive_var)\n  z = gap / sigma\n"
    return _HEAD + gap + f"  return np.argmax({score})\n"


TEXTBOOK = {
    **{f"ei-xi{xi}": _margin(xi, "gap * norm.cdf(z) + sigma * norm.pdf(z)") for xi in (0.01, 0.1)},
    **{f"pi-xi{xi}": _margin(xi, "norm.cdf(z)") for xi in (0.01, 0.1)},
    **{f"lcb-kappa{k}": _HEAD + f"  return np.argmin(predictive_mean - {k} * beta * np.sqrt(predictive_var))\n"
       for k in (0.5, 2.0, 3.0)},
    "ucb": SOURCES["ucb"], "pi": SOURCES["pi"], "mean": SOURCES["mean"],
    "variance": _HEAD + "  return np.argmax(predictive_var)\n",
}


def load(ref: str) -> str | None:
    """A baseline's source (None for a policy: random search, MES) or an AF file's text; UsageError for anything
    else."""
    if ref in SOURCES:
        return SOURCES[ref]
    if ref in POLICIES:
        return None
    path = Path(ref)
    if path.suffix == ".py" and path.is_file():
        return path.read_text()
    import difflib

    close = difflib.get_close_matches(ref, BASELINES, n=1)
    hint = f"; did you mean '{close[0]}'?" if close else f" (baselines: {', '.join(BASELINES)}, or a .py file)"
    raise UsageError(f"af '{ref}' is neither a baseline nor an existing .py file{hint}")
