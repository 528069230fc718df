"""The kernel sandbox's cost per program against the audit-hook sandbox it replaced (script-only: it times two
implementations, one of them loaded from git history).

    python benchmarks/bench_sandbox.py [--baseline fe0634a] [--rounds 40]

Arms, in interleaved rounds in one process: a trivial program (``x = 1``) through each ``run``; and the canonical
HumanEval solutions, through the old harness (one program with its tests) and the new judge (the completion's module
in a session, the tests here), one worker. Figures are wall-clock medians per program and the ratio new / old (the
issue's target: within 2x). Writes benchmarks/results/sandbox.json and .md with the CPU it ran on.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import publish  # noqa: E402

from llmx.core.eval import sandbox  # noqa: E402
from llmx.plugins.tasks import humaneval  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def baseline(rev: str, folder: Path):
    """The old ``sandbox`` module, its child beside it, loaded from ``rev``."""
    for name in ("sandbox.py", "sandbox_child.py"):
        text = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:llmx/core/eval/{name}"], check=True,
                              capture_output=True, text=True).stdout
        (folder / name).write_text(text)
    spec = importlib.util.spec_from_file_location("old_sandbox", folder / "sandbox.py")
    module = sys.modules["old_sandbox"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", default="fe0634a")
    ap.add_argument("--rounds", type=int, default=40)
    args = ap.parse_args()
    problems = humaneval.rows("test", 0)
    with tempfile.TemporaryDirectory() as folder:
        old = baseline(args.baseline, Path(folder))
        times: dict[str, list[float]] = {"old trivial": [], "new trivial": [], "old humaneval": [], "new humaneval": []}
        passed = {"old": 0, "new": 0}
        for r in range(args.rounds):
            p = problems[r % len(problems)]
            arms = [("old trivial", lambda: old.run("x = 1").passed),
                    ("new trivial", lambda: sandbox.run("x = 1").completed),
                    ("old humaneval", lambda p=p: old.run(f"{p['prompt']}{p['reference']}\n{p['test']}\n"
                                                          f"check({p['entry_point']})\n", old.Limits(10.0, 3),
                                                          module_name=humaneval.MODULE).passed),
                    ("new humaneval", lambda p=p: humaneval.judge(p, p["reference"])[0])]
            for name, arm in arms if r % 2 == 0 else arms[::-1]:  # interleaved, alternating order
                t0 = time.perf_counter()
                ok = arm()
                times[name].append(time.perf_counter() - t0)
                assert ok, name
                if "humaneval" in name:
                    passed[name.split()[0]] += 1
    rows = []
    for what in ("trivial", "humaneval"):
        o, n = statistics.median(times[f"old {what}"]), statistics.median(times[f"new {what}"])
        rows.append({"program": what, "old_ms": round(1000 * o, 1), "new_ms": round(1000 * n, 1),
                     "new_over_old": round(n / o, 2), "rounds": args.rounds})
    publish("sandbox", rows, baseline=args.baseline, humaneval_passed=passed,
            confinement="kernel namespaces" if sandbox.run("x = 1").confined else "none")


if __name__ == "__main__":
    main()
