"""Running an untrusted program (notes §6): the AST allow-list first (``program.check``, before any process starts),
then the shared sandbox (``core.eval.sandbox``: a fresh interpreter in an empty folder, CPU, memory and file-size
limits, a wall-clock kill of its process group, its own network namespace where the kernel allows it, an audit hook
on forks, sockets, ctypes and writes outside its folder) running the harness (``worker``) with the program as its
acquisition function, and a reply checked for shape and range. A failure is a result with its reason, never an
exception in the search."""

from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from llmx.core.eval import sandbox as core
from llmx.plugins.funbo.bo import ProblemSpec
from llmx.plugins.funbo.program import ProgramError, check

ROOT = str(Path(__file__).resolve().parents[3])
REPLY = "reply.json"
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
             time_term: str = "found", limits: Limits = Limits()) -> Outcome:
    try:
        check(source)
    except ProgramError as e:
        return Outcome(False, reason=str(e))
    request = json.dumps({"source": source, "problems": [p.as_dict() for p in problems], "trials": trials,
                          "beta": beta, "time_term": time_term})
    driver = DRIVER.format(root=ROOT, request=request, reply=REPLY)
    out = core.run(driver, core.Limits(wall_seconds=limits.timeout_s, cpu_seconds=math.ceil(limits.timeout_s),
                                       memory_mb=limits.memory_mb, file_mb=16), collect=REPLY)
    if not out.passed:
        return Outcome(False, reason=f"{out.status}: {out.reason}"[:300])
    return _reply(out.collected, len(problems), trials)


def _reply(text: str, problems: int, trials: int) -> Outcome:
    try:
        reply = json.loads(text)
    except ValueError:
        return Outcome(False, reason="no readable reply from the child")
    if not reply.get("ok"):
        return Outcome(False, reason=str(reply.get("reason", "failed"))[:300])
    scores, curves = reply.get("scores"), reply.get("curves")
    shaped = (isinstance(scores, list) and len(scores) == problems and isinstance(curves, list)
              and all(isinstance(c, list) and len(c) == trials + 1 for c in curves))
    if not shaped or not all(isinstance(s, (int, float)) and math.isfinite(s) and 0.0 <= s <= 2.0 for s in scores):
        return Outcome(False, reason="a malformed reply (scores outside [0, 2] or curves of the wrong length)")
    return Outcome(True, [float(s) for s in scores], curves)


def evaluate_many(sources: list[str], problems: list[ProblemSpec], workers: int = 1, **kw) -> list[Outcome]:
    """Each source in its own child, ``workers`` at a time, in order."""
    if workers <= 1 or len(sources) <= 1:
        return [evaluate(s, problems, **kw) for s in sources]
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda s: evaluate(s, problems, **kw), sources))
