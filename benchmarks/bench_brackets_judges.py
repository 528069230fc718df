"""Can the brackets judge be made to need the content? Stricter program checks, scored on the reference model's own
samples and on constant completions.

Script-only (not a comparison): a study of the judge itself (which checks make the task need the content), not of a
technique.

    python benchmarks/bench_brackets_judges.py [--model ref:llama] [--prompts 200]

Each judge is the task's (the completed line balances its brackets and ends) plus one more check: the call has an
argument; the line parses as a Python statement; every name in the arguments occurs in the prompt (or is a builtin);
a name other than ``self`` does; the argument count equals the real line's. A judge that needs the content should
rate the model above every constant. Writes benchmarks/results/brackets_judges.json and .md.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import json
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, markdown, run_pipeline, write  # noqa: E402

BUILTINS = set(dir(builtins))
CONSTANTS = [")\n", "self)\n", "x)\n", "None)\n", "name)\n", "value)\n", "a, b)\n", "self, name)\n", "x, y, z)\n"]


def inner(body: str) -> str | None:
    """The text up to the bracket that closes the prompt's ``(`` (quotes skipped), or None."""
    depth, quote = 1, None
    for i, ch in enumerate(body):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                return body[:i]
    return None


def arity(args: str) -> int | None:
    """Positional plus keyword arguments of a call with these arguments, None when they do not parse."""
    try:
        call = ast.parse(f"f({args})", mode="eval").body
    except SyntaxError:
        return None
    return len(call.args) + len(call.keywords)


def parses(line: str) -> bool:
    s = line.strip()
    s = s + " pass" if s.endswith(":") else s
    s = "if 1: pass\n" + s if s.startswith(("elif ", "else")) else s
    s = "try: pass\n" + s if s.startswith(("except", "finally")) else s
    try:
        ast.parse(s)
    except SyntaxError:
        return False
    return True


def names(args: str) -> set[str] | None:
    try:
        tree = ast.parse(f"f({args})", mode="eval")
    except SyntaxError:
        return None
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} - {"f"}


def verdicts(row: dict, completion: str) -> dict[str, bool]:
    from llmx.plugins.tasks.brackets import judge

    base = judge(row, completion)
    body = completion.split("\n", 1)[0]
    args = inner(body)
    line = row["prompt"].rsplit("\n", 1)[-1] + body
    used = names(args) if args else None
    context = set(re.findall(r"[A-Za-z_]\w*", row["prompt"]))
    has_args = base and bool(args and args.strip())
    grounded = has_args and parses(line) and used is not None and bool(used) and used <= context | BUILTINS
    true_args = inner(row["reference"])
    return {"balanced (the task)": base, "+ an argument": has_args, "+ the line parses": has_args and parses(line),
            "+ argument names occur in the prompt": grounded,
            "+ a name other than self": grounded and bool((used or set()) - {"self"}),
            "+ argument count of the real line": base and args is not None and true_args is not None
            and arity(args) is not None and arity(args) == arity(true_args)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="ref:llama")
    ap.add_argument("--prompts", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run_pipeline(args.model, [{"method": "task", "stage": "eval", "params": {
            "task": "brackets", "limit": args.prompts, "samples": 4}}], output_dir=tmp, threads=1)
        (path,) = Path(tmp).glob("*/artifacts/*_task/rows.jsonl")
        records = [json.loads(line) for line in path.open()]
    from llmx.core.eval.tasks import rows as task_rows
    from llmx.core.plugins import host

    refs = {r["prompt"]: r for r in task_rows(host().task("brackets"), "validation", 0, args.prompts)}
    samples = [(refs[r["prompt"]], c) for r in records for c in r["completions"]]
    model = [verdicts(row, c) for row, c in samples]
    table = []
    for name in model[0]:
        constants = {c: sum(verdicts(row, c)[name] for row in refs.values()) / len(refs) for c in CONSTANTS}
        best = max(constants, key=constants.get)
        table.append({"judge": name, "model_rate": sum(v[name] for v in model) / len(model), "best_constant": repr(best),
                      "constant_rate": constants[best], "constants": constants})
        print(table[-1], flush=True)
    write("brackets_judges", {"benchmark": "brackets_judges", "model": args.model, "prompts": args.prompts,
                              "samples": len(samples), "rows": table, "machine": machine()})
    md = markdown(["judge", "model_rate", "best_constant", "constant_rate"], table)
    (Path(__file__).resolve().parent / "results" / "brackets_judges.md").write_text(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
