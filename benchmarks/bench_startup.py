"""CLI startup: ``llmx --help`` against ``python -c pass`` in the same session, median of fresh processes.

    python benchmarks/bench_startup.py [--repeats 15]

Writes benchmarks/results/startup.json. Also records which heavy modules the help path imported (none should be).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, write  # noqa: E402

HEAVY = ("torch", "transformers", "pydantic", "yaml", "llmx.core.config")
PROBE = ("import sys\nfrom llmx.cli.app import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
         f"print([m for m in {HEAVY!r} if m in sys.modules], file=sys.stderr)")


def median_seconds(cmd: list[str], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    llmx = [sys.executable, "-m", "llmx", "--help"]
    median_seconds(llmx, 2)  # warm the file cache
    rows = {"python -c pass": median_seconds([sys.executable, "-c", "pass"], args.repeats),
            "llmx --help": median_seconds(llmx, args.repeats),
            "llmx methods": median_seconds([sys.executable, "-m", "llmx", "methods"], args.repeats)}
    imported = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True).stderr.strip()
    out = {"benchmark": "startup", "repeats": args.repeats, "median_seconds": {k: round(v, 4) for k, v in rows.items()},
           "help_path_heavy_imports": imported, "goal_seconds": 0.2, "machine": machine()}
    print(out)
    write("startup", out)


if __name__ == "__main__":
    main()
