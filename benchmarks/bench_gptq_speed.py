"""GPTQ's CPU cost before and after issue 65, in one process, interleaved rounds, one thread.

Script-only (not a comparison): a microbenchmark of the GPTQ solver's time and memory against its previous code (same
outputs), not a technique beside its baselines.

    python benchmarks/bench_gptq_speed.py [--rows 4096 --cols 11008 --group 128 --rounds 3 --threads 1] [--quick]

Three pieces of what ``--method gptq`` spends per layer, each against the code before issue 65:

- the solver (``core/quant/gptq.py``) on one ``[rows, cols]`` layer: before, every group start concatenated the
  whole remaining weight to read the group's range (about ``rows * cols^2 / (2 g)`` floats copied: 7.8 GB at
  4096 x 11008, g128) and gathered ``W``, ``Q`` and the codes through the identity order without act-order; now only
  the group's columns are read. The previous solver is loaded from git (``BEFORE``, the commit before the change)
  and both must return the same codes, scales and weights (``torch.equal``).
- the per-layer objectives ``tr(dW H dW^T)`` of GPTQ and of RTN that the method computed only to log them (two
  ``[rows, cols] x [cols, cols]`` products); now only with ``log_objectives: true``.
- the calibration re-forward of a quantized layer (W4 g128 QuantLinear, exact path) over the default calibration
  (64 windows of 256 tokens, chunks of 8 windows): before, unpacked and dequantized on every chunk; now once
  (``calibration.dequantized_once``), same outputs (``torch.equal``).

Times are medians over ``--rounds`` rounds whose order alternates. Memory, from separate untimed calls per
variant: the peak is the rise of the process's peak resident set (``VmHWM``, reset through ``/proc/self/clear_refs``
before the call, freed heap returned with ``malloc_trim`` first; tracemalloc does not see torch's allocations), and
``alloc`` the bytes torch allocated during the call (the profiler's per-op allocations: the memory traffic of new
tensors, which the whole-weight copies dominated; the solver's peak is its Cholesky step's, which did not change).
Writes benchmarks/results/gptq_speed.json and .md, with the CPU model and torch's CPU capability. Linux only (it
reads /proc); the previous solver comes from this checkout's git history.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import re
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import publish  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BEFORE = "e480104"  # the last commit before issue 65's GPTQ changes


def cpu() -> dict:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "unknown")
    return {"cpu_model": model, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads()}


def old_solver() -> types.ModuleType:
    src = subprocess.run(["git", "show", f"{BEFORE}:llmx/core/quant/gptq.py"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    module = types.ModuleType("gptq_before_issue65")
    exec(compile(src, f"{BEFORE}:llmx/core/quant/gptq.py", "exec"), module.__dict__)
    return module


def _status(key: str) -> int:
    return int(re.search(rf"{key}:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1)) * 1024


def peak_rise(fn) -> int:
    """Bytes the peak resident set rose above its level at the start of ``fn()``."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")
    start = _status("VmRSS")
    fn()
    return _status("VmHWM") - start


def allocated(fn) -> int:
    """Bytes torch allocated during ``fn()`` (the profiler's positive self allocations per op: the memory traffic
    of new tensors, a temporary freed inside the op that made it not counted)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return sum(max(e.self_cpu_memory_usage, 0) for e in prof.events() if e.name != "[memory]")


def problem(rows: int, cols: int, tokens: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, cols, generator=gen)
    x[:, : cols // 64] *= 8  # a few outlier channels
    return torch.randn(rows, cols, generator=gen) * 0.02, x.T @ x


def interleaved(variants: dict, rounds: int) -> dict[str, float]:
    times: dict[str, list[float]] = {k: [] for k in variants}
    names = list(variants)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            t0 = time.perf_counter()
            variants[name]()
            times[name].append(time.perf_counter() - t0)
            print(f"round {r} {name}: {times[name][-1]:.2f} s", flush=True)
    return {k: statistics.median(v) for k, v in times.items()}


def measured(variants: dict, rounds: int) -> tuple[dict, dict, dict]:
    """Median seconds over interleaved rounds, then peak rise (MiB) and torch allocations (GiB) per variant."""
    t = interleaved(variants, rounds)
    return (t, {k: peak_rise(fn) / 2**20 for k, fn in variants.items()},
            {k: allocated(fn) / 2**30 for k, fn in variants.items()})


def solver_rows(args) -> list[dict]:
    from llmx.core.quant.formats import IntFormat, fake_quantize
    from llmx.core.quant.gptq import gptq, layer_objective

    before, fmt = old_solver(), IntFormat(4, args.group)
    w, h = problem(args.rows, args.cols, args.tokens)
    new, old = gptq(w, h, fmt), before.gptq(w, h, fmt)
    same = all(torch.equal(getattr(new, f), getattr(old, f)) for f in ("codes", "scale", "zero", "weight"))
    assert same, "the solver's results changed"

    def objectives():
        layer_objective(w, new.weight, h)
        layer_objective(w, fake_quantize(w, fmt), h)

    sb, sa, ob = "solver before", "solver after", "objectives (before: every layer)"
    t, mem, alloc = measured({sb: lambda: before.gptq(w, h, fmt), sa: lambda: gptq(w, h, fmt), ob: objectives},
                             args.rounds)
    shape = f"{args.rows}x{args.cols} g{args.group}"
    return [{"piece": "solver", "shape": shape, "before_s": t[sb], "after_s": t[sa], "speedup": t[sb] / t[sa],
             "before_peak_mib": mem[sb], "after_peak_mib": mem[sa], "before_alloc_gib": alloc[sb],
             "after_alloc_gib": alloc[sa], "identical": same},
            {"piece": "per-layer objectives (now opt-in)", "shape": shape, "before_s": t[ob], "after_s": 0.0,
             "speedup": None, "before_peak_mib": mem[ob], "after_peak_mib": 0.0, "before_alloc_gib": alloc[ob],
             "after_alloc_gib": 0.0, "identical": True},
            {"piece": "method per layer (solver + objectives)", "shape": shape, "before_s": t[sb] + t[ob],
             "after_s": t[sa], "speedup": (t[sb] + t[ob]) / t[sa], "before_peak_mib": max(mem[sb], mem[ob]),
             "after_peak_mib": mem[sa], "before_alloc_gib": alloc[sb] + alloc[ob], "after_alloc_gib": alloc[sa],
             "identical": same}]


def reforward_rows(args, width_in: int, width_out: int) -> dict:
    from llmx.core.quant.calibration import dequantized_once
    from llmx.core.quant.cpu_kernels import exact
    from llmx.core.quant.formats import IntFormat, quantize
    from llmx.core.quant.qlinear import QuantLinear

    fmt = IntFormat(4, args.group)
    lin = torch.nn.Linear(width_in, width_out, bias=False)
    q = QuantLinear.from_codes(lin, *quantize(lin.weight.data, fmt), fmt)
    xs = [torch.randn(8, args.seq_len, width_in) for _ in range(-(-args.windows // 8))]  # chunks of 8 windows

    def reforward(once: bool):
        with torch.no_grad(), exact(), dequantized_once(q) if once else contextlib.nullcontext():
            return [q(x) for x in xs]

    identical = all(torch.equal(a, b) for a, b in zip(reforward(True), reforward(False), strict=True))
    assert identical, "the re-forward's outputs changed"
    t, mem, alloc = measured({"before": lambda: reforward(False), "after": lambda: reforward(True)}, args.rounds)
    return {"piece": f"re-forward, {args.windows} x {args.seq_len} tokens",
            "shape": f"{width_in}->{width_out} w4 g{args.group}", "before_s": t["before"], "after_s": t["after"],
            "speedup": t["before"] / t["after"], "before_peak_mib": mem["before"], "after_peak_mib": mem["after"],
            "before_alloc_gib": alloc["before"], "after_alloc_gib": alloc["after"], "identical": identical}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=11008)
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=4096, help="Calibration tokens behind the solver's Hessian.")
    ap.add_argument("--windows", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="A small layer (a smoke run of this script).")
    args = ap.parse_args()
    if args.quick:
        args.rows, args.cols, args.tokens, args.windows, args.seq_len, args.rounds = 256, 704, 512, 16, 64, 1
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    rows = solver_rows(args)
    rows += [reforward_rows(args, args.rows, args.cols), reforward_rows(args, args.cols, args.rows)]  # both FFN ways
    publish("gptq_speed" + ("_quick" if args.quick else ""), rows, **cpu(), before_commit=BEFORE,
            note="one thread unless threads says otherwise; medians of interleaved rounds; peak = rise of VmHWM "
                 "over the call's start, alloc = bytes torch allocated (profiler), each from an untimed call")


if __name__ == "__main__":
    main()
