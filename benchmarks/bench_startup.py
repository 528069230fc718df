"""CLI startup: ``llmx --help`` and ``llmx methods`` against ``python -c pass``, CPU time of fresh processes.

Script-only (not a comparison): process start-up CPU time, a property of the CLI, not of a technique.

    python benchmarks/bench_startup.py [--rounds 21]

Each round runs the three commands once, in a rotating order (interleaved, so a slow spell of a shared machine
touches all three alike), one thread each, stdout piped (as `llmx methods | grep` is). A command's cost is its
process's user + system CPU time (``os.wait4``), not the wall clock; the medians and their ratios are the result
(target: ``llmx methods`` within 3x ``llmx --help``). Also records what each path imported: the help path no
torch, pydantic or config machinery; the methods path no torch and no method's parameter model.
Writes benchmarks/results/startup.json, with the machine (CPU model and torch's CPU capability included).
"""

from __future__ import annotations

import argparse
import ast
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, write  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {"python -c pass": ["-c", "pass"], "llmx --help": ["-m", "llmx", "--help"],
            "llmx methods": ["-m", "llmx", "methods"]}
HEAVY = ("torch", "transformers", "pydantic", "yaml", "llmx.core.config")
HELP_PROBE = ("import sys\nfrom llmx.cli.app import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
              f"print([m for m in {HEAVY!r} if m in sys.modules], file=sys.stderr)")
METHODS_PROBE = (
    "import io, sys, contextlib\nfrom llmx.cli.app import main\n"
    "with contextlib.redirect_stdout(io.StringIO()):\n    main(['methods'])\n"
    "from llmx.core.plugins import host\nfrom llmx.core.spec import Params\n"
    "refs = {s.config_name.partition(':')[0] for s in host().methods}\n"
    "def subs(c): return [x for k in c.__subclasses__() for x in (k, *subs(k))]\n"
    "print(sorted(m for m in sys.modules if m in refs or m.split('.')[0] in ('torch', 'transformers'))"
    " + [c.__name__ for c in subs(Params)], file=sys.stderr)"
)


def cpu_seconds(args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(user + system CPU seconds, wall seconds) of one fresh ``python ARGS`` process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                            cwd=ROOT)
    proc.stdout.read()  # a pipe, drained: `llmx methods` takes its piped path
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: keep Popen from waiting again
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} exited {proc.returncode}")
    return usage.ru_utime + usage.ru_stime, wall


def cpu_info() -> dict[str, str]:
    """The CPU's model name and the instruction set torch dispatches to on it (AVX2, AVX512, ...)."""
    import torch

    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "") if Path("/proc/cpuinfo").exists() else ""
    return {"cpu_model": model or os.uname().machine, "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", "--repeats", type=int, default=21, dest="rounds")
    args = ap.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    env = {k: v for k, v in env.items() if not k.startswith("LLMX_") or k == "LLMX_CACHE_DIR"}
    names = list(COMMANDS)
    for name in names:  # warm the file cache and the bytecode
        cpu_seconds(COMMANDS[name], env)
    cpu: dict[str, list[float]] = {n: [] for n in names}
    wall: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            c, w = cpu_seconds(COMMANDS[name], env)
            cpu[name].append(c)
            wall[name].append(w)
    med = {n: statistics.median(v) for n, v in cpu.items()}
    base, help_, methods = med["python -c pass"], med["llmx --help"], med["llmx methods"]
    ratios = {"llmx --help / python -c pass": help_ / base, "llmx methods / python -c pass": methods / base,
              "llmx methods / llmx --help": methods / help_,
              "llmx methods / llmx --help, python's own start-up subtracted": (methods - base) / (help_ - base)}
    probe = {name: ast.literal_eval(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                                   env=env, cwd=ROOT, check=True).stderr.strip().splitlines()[-1])
             for name, code in (("llmx --help", HELP_PROBE), ("llmx methods", METHODS_PROBE))}
    out = {"benchmark": "startup", "rounds": args.rounds, "measure": "median user+system CPU seconds per process",
           "median_cpu_seconds": {k: round(v, 4) for k, v in med.items()},
           "median_wall_seconds": {k: round(statistics.median(v), 4) for k, v in wall.items()},
           "ratios": {k: round(v, 2) for k, v in ratios.items()},
           "target": "llmx methods within 3x llmx --help", "met": ratios["llmx methods / llmx --help"] <= 3.0,
           "help_path_heavy_imports": probe["llmx --help"],
           "methods_path_configs_and_torch_imported": probe["llmx methods"],
           "machine": {**cpu_info(), **machine()}}
    for k, v in out.items():
        print(f"{k}: {v}")
    write("startup", out)


if __name__ == "__main__":
    main()
