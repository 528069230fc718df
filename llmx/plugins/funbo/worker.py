"""The harness that runs inside the sandbox's child: the BO loop of each problem with the program as its
acquisition function, replying with the grid indices it chose (the parent scores them). Any exception the program
raises becomes the reason it is scored with."""

from __future__ import annotations


def evaluate(request: dict) -> dict:
    from llmx.plugins.funbo import bo
    from llmx.plugins.funbo.program import ProgramError, compile_program

    try:
        af = compile_program(request["source"])
    except ProgramError as e:
        return {"ok": False, "reason": str(e)}
    chosen = []
    for s in request["problems"]:
        problem = bo.Problem.build(bo.ProblemSpec.from_dict(s))
        try:
            indices = bo.run(problem, af, request["trials"], request["beta"], indices=True)
        except bo.AFError as e:
            return {"ok": False, "reason": f"{s['function']}: {e}"}
        except Exception as e:  # noqa: BLE001 -- untrusted code: anything it raises is its failure
            return {"ok": False, "reason": f"{s['function']}: {type(e).__name__}: {str(e)[:200]}"}
        chosen.append(indices)
    return {"ok": True, "indices": chosen}
