"""Running an untrusted program (notes §6): the AST allow-list first (``program.check``), then a child process in
a fresh empty folder with limits on CPU seconds, address space, file size (0: it can write no byte to any file) and
new processes, a wall-clock kill of its whole process group, and a reply checked for shape and range. A failure is a
result with its reason, never an exception in the search. Not a container: it cannot cut the network (the program
has no import and no module that reaches one) and root ignores the process limit; the README says so."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from llmx.plugins.funbo.bo import ProblemSpec
from llmx.plugins.funbo.program import ProgramError, check

ROOT = str(Path(__file__).resolve().parents[3])
REPLY_LIMIT = 4 << 20


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 30.0
    memory_mb: int = 2048
    cpu_s: int | None = None  # default: the wall-clock limit, rounded up


@dataclass
class Outcome:
    ok: bool
    scores: list[float] = field(default_factory=list)
    curves: list[list[float]] = field(default_factory=list)
    reason: str = ""


def _limit(limits: Limits):
    def apply() -> None:
        import resource

        cpu = limits.cpu_s or math.ceil(limits.timeout_s)
        memory = limits.memory_mb << 20
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C reaches the search, which kills its children
    return apply


def evaluate(source: str, problems: list[ProblemSpec], trials: int = 30, beta: float = 1.0,
             time_term: str = "found", limits: Limits = Limits()) -> Outcome:
    try:
        check(source)
    except ProgramError as e:
        return Outcome(False, reason=str(e))
    request = json.dumps({"source": source, "problems": [p.as_dict() for p in problems], "trials": trials,
                          "beta": beta, "time_term": time_term})
    env = {"PATH": os.environ.get("PATH", ""), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    code = f"import sys; sys.path.insert(0, {ROOT!r}); from llmx.plugins.funbo.worker import main; main()"
    with tempfile.TemporaryDirectory(prefix="funbo-") as folder:
        proc = subprocess.Popen([sys.executable, "-I", "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, cwd=folder, env=env, preexec_fn=_limit(limits),
                                start_new_session=True, text=True)
        try:
            out, _ = proc.communicate(request, timeout=limits.timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return Outcome(False, reason=f"timed out after {limits.timeout_s:g} s")
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        left = os.listdir(folder)
    if proc.returncode != 0:
        name = signal.Signals(-proc.returncode).name if proc.returncode < 0 else f"exit {proc.returncode}"
        return Outcome(False, reason=f"the child died ({name}; CPU or memory limit)")
    if left:
        return Outcome(False, reason=f"it wrote into its folder: {', '.join(sorted(left))[:80]}")
    return _reply(out, len(problems), trials)


def _reply(out: str, problems: int, trials: int) -> Outcome:
    try:
        reply = json.loads(out[:REPLY_LIMIT])
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
