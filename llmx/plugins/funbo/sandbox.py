"""Running an untrusted program (notes §6): the AST allow-list first (``program.check``, before any process starts),
then the shared sandbox (``core.eval.sandbox``: a fresh interpreter in an empty folder, CPU, memory and file-size
limits, a wall-clock kill of its process group, its own network namespace where the kernel allows it, an audit hook
on forks, sockets, ctypes and writes outside its folder) running the harness (``worker``) with the program as its
acquisition function; the child replies with the grid indices it queried, which are checked and scored here. A
failure is a result with its reason, never an exception in the search."""

from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from llmx.core.eval import sandbox as core
from llmx.plugins.funbo import bo
from llmx.plugins.funbo.bo import ProblemSpec
from llmx.plugins.funbo.program import ProgramError, check

ROOT = str(Path(__file__).resolve().parents[3])
REPLY = "reply.json"
# The libraries the harness (bo, gp, program) imports, imported before the audit hook: their import-time work is not
# the program's (numpy 1.25 to 2.1.1 spawn ``lscpu`` when scipy 1.10's stats and optimize import numpy.testing).
PRELOAD = ("numpy", "scipy.linalg", "scipy.optimize", "scipy.special", "scipy.stats")
DRIVER = """import json, sys
sys.path.insert(0, {root!r})
from llmx.plugins.funbo.worker import evaluate
reply = json.dumps(evaluate(json.loads({request!r})))
with open({reply!r}, "w") as f:
    f.write(reply)
"""


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 30.0
    memory_mb: int = 2048


@dataclass
class Outcome:
    ok: bool
    scores: list[float] = field(default_factory=list)
    curves: list[list[float]] = field(default_factory=list)
    reason: str = ""


def evaluate(source: str, problems: list[ProblemSpec], trials: int = 30, beta: float = 1.0,
             time_term: str = "optimum", limits: Limits = Limits()) -> Outcome:
    try:
        check(source)
    except ProgramError as e:
        return Outcome(False, reason=str(e))
    request = json.dumps({"source": source, "problems": [p.as_dict() for p in problems], "trials": trials,
                          "beta": beta})
    driver = DRIVER.format(root=ROOT, request=request, reply=REPLY)
    out = core.run(driver, core.Limits(wall_seconds=limits.timeout_s, cpu_seconds=math.ceil(limits.timeout_s),
                                       memory_mb=limits.memory_mb, file_mb=16), collect=REPLY, preload=PRELOAD)
    if not out.passed:
        return Outcome(False, reason=f"{out.status}: {out.reason}"[:300])
    return _reply(out.collected, problems, trials, time_term)


def _reply(text: str, problems: list[ProblemSpec], trials: int, time_term: str) -> Outcome:
    """Scores computed here from the queries the child reports, each checked: the worst grid point first, then
    ``trials`` indices inside the grid (a child cannot hand back a score)."""
    try:
        reply = json.loads(text)
    except ValueError:
        return Outcome(False, reason="no readable reply from the child")
    if not reply.get("ok"):
        return Outcome(False, reason=str(reply.get("reason", "failed"))[:300])
    chosen = reply.get("indices")
    if not isinstance(chosen, list) or len(chosen) != len(problems):
        return Outcome(False, reason="a malformed reply (not one query list per problem)")
    scores, curves = [], []
    for spec, indices in zip(problems, chosen, strict=True):
        y = bo.grid_values(spec)
        if (not isinstance(indices, list) or len(indices) != trials + 1 or indices[0] != int(np.argmax(y))
                or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < len(y) for i in indices)):
            return Outcome(False, reason=f"{spec.function}: a malformed reply (queries out of the protocol)")
        best = bo.best_so_far(y, indices)
        scores.append(bo.score(best, y, time_term))
        curves.append(bo.regret(best, y))
    return Outcome(True, scores, curves)


def evaluate_many(sources: list[str], problems: list[ProblemSpec], workers: int = 1, **kw) -> list[Outcome]:
    """Each source in its own child, ``workers`` at a time, in order."""
    if workers <= 1 or len(sources) <= 1:
        return [evaluate(s, problems, **kw) for s in sources]
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda s: evaluate(s, problems, **kw), sources))
