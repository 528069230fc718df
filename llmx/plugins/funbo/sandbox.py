"""Running an untrusted program (notes §6): the AST allow-list first (``program.check``, before any process starts),
then the shared sandbox (``core.eval.sandbox``: kernel namespaces, a read-only root, CPU, memory, file-size and
process limits, a wall-clock kill of everything it started), where only the program lives: the BO loop runs here
and calls its ``acquisition_function`` through plain values (the posterior mean and variance as arrays in, a grid
index out), so the program never sees the objective and its scores are computed here. A failure is a result with
its reason, never an exception in the search."""

from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache

from llmx.core.eval import sandbox as core
from llmx.plugins.funbo import bo
from llmx.plugins.funbo import program as program_module
from llmx.plugins.funbo.bo import ProblemSpec
from llmx.plugins.funbo.program import NAME, ProgramError, check

PACKAGES = ("numpy", "scipy")  # all the child may import: ``program``'s own source travels with the program


def driver(source: str) -> str:
    """The child's module: ``program`` (the restricted namespace and its checks) and then the checked program,
    executed with only a numpy subset, ``norm`` and safe builtins in scope; llmx itself is not in the sandbox."""
    return f"{inspect.getsource(program_module)}\n{NAME} = compile_program({source!r})\n"


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 30.0
    memory_mb: int = 2048
    unconfined: bool = False  # the user's explicit choice where the kernel cannot confine the program (unsafe)


@dataclass
class Outcome:
    ok: bool
    scores: list[float] = field(default_factory=list)
    curves: list[list[float]] = field(default_factory=list)
    reason: str = ""


@lru_cache(maxsize=12)  # a 2-D problem's Gram matrix is 32 MB
def _problem(spec: ProblemSpec) -> bo.Problem:
    return bo.Problem.build(spec)


@contextlib.contextmanager
def sandboxed(source: str, limits: Limits, wall_seconds: float | None = None) -> Iterator[Callable]:
    """The checked program's function, living in the sandbox for the block: plain values in, a plain value out.
    ``wall_seconds`` (default ``limits.timeout_s``) bounds the block, the caller's own work included; the program's
    CPU time is bounded by ``limits.timeout_s`` either way."""
    check(source)
    box = core.Limits(wall_seconds=wall_seconds or limits.timeout_s, cpu_seconds=math.ceil(limits.timeout_s),
                      memory_mb=limits.memory_mb, file_mb=16, reply_mb=1)  # a reply is one grid index
    with core.session(driver(source), box, packages=PACKAGES, unsafe=limits.unconfined) as s:
        yield s.function(NAME)


def evaluate(source: str, problems: list[ProblemSpec], trials: int = 30, beta: float = 1.0,
             time_term: str = "optimum", limits: Limits = Limits()) -> Outcome:
    try:
        check(source)
    except ProgramError as e:
        return Outcome(False, reason=str(e))
    scores, curves, where = [], [], ""
    try:
        with sandboxed(source, limits) as af:
            for spec in problems:
                where, problem = spec.function, _problem(spec)
                best = bo.best_so_far(problem.y, bo.run(problem, af, trials, beta, indices=True))
                scores.append(bo.score(best, problem.y, time_term))
                curves.append(bo.regret(best, problem.y))
    except core.Ended as e:
        return Outcome(False, reason=str(e)[:300])
    except (core.Raised, bo.AFError) as e:
        return Outcome(False, reason=f"{where}: {e}"[:300])
    return Outcome(True, scores, curves)


def evaluate_many(sources: list[str], problems: list[ProblemSpec], workers: int = 1, **kw) -> list[Outcome]:
    """Each source in its own child, ``workers`` at a time, in order."""
    if workers <= 1 or len(sources) <= 1:
        return [evaluate(s, problems, **kw) for s in sources]
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda s: evaluate(s, problems, **kw), sources))
