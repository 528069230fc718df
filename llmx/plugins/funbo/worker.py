"""The sandbox's child: reads one request (a program and problem specs) on stdin, runs the BO loop of each problem
with the program as its acquisition function, and writes one JSON line to the stdout it was started with. The
program's own output goes nowhere; any exception becomes the reason it is scored with."""

from __future__ import annotations

import json
import os
import sys


def evaluate(request: dict) -> dict:
    from llmx.plugins.funbo import bo
    from llmx.plugins.funbo.program import ProgramError, compile_program

    try:
        af = compile_program(request["source"])
    except ProgramError as e:
        return {"ok": False, "reason": str(e)}
    scores, curves = [], []
    for s in request["problems"]:
        problem = bo.Problem.build(bo.ProblemSpec.from_dict(s))
        try:
            best = bo.run(problem, af, request["trials"], request["beta"])
        except bo.AFError as e:
            return {"ok": False, "reason": f"{s['function']}: {e}"}
        except BaseException as e:  # noqa: BLE001 -- untrusted code: anything it raises is its failure
            return {"ok": False, "reason": f"{s['function']}: {type(e).__name__}: {str(e)[:200]}"}
        scores.append(bo.score(best, problem, request["time_term"]))
        curves.append(bo.regret(best, problem))
    return {"ok": True, "scores": scores, "curves": curves}


def main() -> None:
    out = os.fdopen(os.dup(1), "w")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 -- lives as long as the process
    result = evaluate(json.loads(sys.stdin.read()))
    out.write(json.dumps(result) + "\n")
    out.flush()


if __name__ == "__main__":
    main()
