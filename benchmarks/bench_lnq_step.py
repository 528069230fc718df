"""LNQ's pieces on one row group of a Qwen2-1.5B ``down_proj`` (input width 8960), before and after issue 67, one thread.

Script-only (not a comparison): a microbenchmark of the LNQ solver (``llmx/plugins/guidedquant/lnq.py``) against
its previous code and against the C step the issue proposed.

    python benchmarks/bench_lnq_step.py [--rows 384 --cols 8960 --bits 2 --c-rows 64 --threads 1] [--quick]

Issue 67 saw LNQ not finish that layer in 5 minutes and blamed the C step's dense one-hot product
(``O(rows k d^2)``). Measured here on one group of rows (1536 rows / ``num_groups`` 4 = 384) with a random SPD ``H``
(``A A^T / n`` plus 1% of its mean diagonal, a few outlier channels):

- the SqueezeLLM k-means seed, before (the code at ``BEFORE``, loaded from git) and after; same centroids and
  assignments;
- the C step as kept (one ``[rows k, d] x [d, d]`` product per chunk) against the issue's proposal, adding H's rows
  into each weight row's k sums with ``index_add_`` and its columns into the k x k system (same codebooks), on
  ``--c-rows`` rows: the product does k times the arithmetic but reads ``H`` once per chunk, the scatter reads it
  once per row;
- one P-step cycle, the objective and the Cholesky test, and LNQ's loop from the seed (3 iterations, 4 cycles),
  whose code the change left alone (timed once); the group's total is seed + loop, before and after.

Writes benchmarks/results/lnq_step.json and .md (``_w3``/``_w4`` at 3/4 bits, ``_quick`` with ``--quick``), with
the CPU model and torch's CPU capability. The previous code comes from this checkout's git history.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import publish  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BEFORE = "80893d9"  # the last commit before issue 67's LNQ changes


def old_lnq() -> types.ModuleType:
    src = subprocess.run(["git", "show", f"{BEFORE}:llmx/plugins/guidedquant/lnq.py"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    module = types.ModuleType("lnq_before_issue67")
    sys.modules[module.__name__] = module  # its dataclass looks its module up
    exec(compile(src, f"{BEFORE}:llmx/plugins/guidedquant/lnq.py", "exec"), module.__dict__)
    return module


def c_step_scatter(w: torch.Tensor, idx: torch.Tensor, h: torch.Tensor, k: int, ridge: float) -> torch.Tensor:
    """The issue's proposal, row by row: ``P^T H`` by adding H's rows (H is symmetric) into k sums, ``P^T H P`` by
    adding that one's columns."""
    eye = ridge * torch.eye(k, dtype=h.dtype)
    out = []
    for wr, ir in zip(w, idx, strict=True):
        ph = h.new_zeros(k, h.shape[0]).index_add_(0, ir, h)
        out.append(torch.linalg.solve(h.new_zeros(k, k).index_add_(1, ir, ph) + eye, ph @ wr))
    return torch.stack(out)


def problem(rows: int, cols: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(cols, 1024, generator=gen, dtype=torch.float64)
    a[: cols // 256] *= 8  # outlier input channels
    h = a @ a.T / a.shape[1]
    h.diagonal().add_(0.01 * float(h.diagonal().mean()))
    return torch.randn(rows, cols, generator=gen, dtype=torch.float64) * 0.02, h


def clock(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=384, help="One row group (Qwen2-1.5B down_proj: 1536 rows / 4).")
    ap.add_argument("--cols", type=int, default=8960)
    ap.add_argument("--bits", type=int, default=2)
    ap.add_argument("--c-rows", type=int, default=64, help="Rows of the C-step comparison (the step's chunk).")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="A small layer (a smoke run of this script).")
    args = ap.parse_args()
    if args.quick:
        args.rows, args.cols, args.c_rows = 64, 1024, 16
    torch.set_num_threads(args.threads)
    from llmx.plugins.guidedquant import lnq

    before, k, load_start = old_lnq(), 2**args.bits, os.getloadavg()
    w, h = problem(args.rows, args.cols)
    fisher = h.diagonal().expand_as(w)
    shape = f"{args.rows}x{args.cols} k={k}"
    print(f"{shape}: seed before ...", flush=True)
    t_old, (c_old, i_old) = clock(lambda: before.kmeans_1d(w, fisher, k))
    t_new, (c_new, i_new) = clock(lambda: lnq.kmeans_1d(w, fisher, k))
    same_seed = float((i_old == i_new).double().mean())
    rows = [{"piece": "k-means seed", "shape": shape, "first": f"before ({BEFORE})", "first_s": t_old,
             "second": "after", "second_s": t_new, "first_over_second": t_old / t_new,
             "same": f"{same_seed:.4%} assignments, max abs dc {float((c_old - c_new).abs().max()):.1e}"}]

    r = slice(0, args.c_rows)
    print("C step ...", flush=True)
    t_scatter, c_scatter = clock(lambda: c_step_scatter(w[r], i_new[r], h, k, 1e-7))
    t_dense, c_dense = clock(lambda: lnq.c_step(w[r], i_new[r], h, k, 1e-7))
    rows.append({"piece": "C step", "shape": f"{args.c_rows}x{args.cols} k={k}",
                 "first": "index_add_ of H's rows per row (proposed)", "first_s": t_scatter,
                 "second": "one-hot product (kept)", "second_s": t_dense, "first_over_second": t_scatter / t_dense,
                 "same": f"max rel dc {float(((c_scatter - c_dense).abs() / c_dense.abs().max()).max()):.1e}"})

    print("unchanged pieces ...", flush=True)
    unchanged = {"P step, one cycle": lambda: lnq.p_step(w, i_new, c_new, h, 1, 128),
                 "objective": lambda: lnq.objective(w, c_new.gather(1, i_new), h),
                 "Cholesky test (damped)": lambda: lnq.damped(h, 1e-5),
                 "LNQ loop from the seed (3 iterations, 4 cycles)": lambda: lnq.lnq(w, h, (c_new, i_new))}
    times = {name: clock(fn)[0] for name, fn in unchanged.items()}
    rows += [{"piece": name, "shape": shape, "first": None, "first_s": None, "second": "unchanged", "second_s": t,
              "first_over_second": None, "same": None} for name, t in times.items()]
    loop = times["LNQ loop from the seed (3 iterations, 4 cycles)"]
    rows.append({"piece": "one group: seed + LNQ loop", "shape": shape, "first": "before", "first_s": t_old + loop,
                 "second": "after", "second_s": t_new + loop, "first_over_second": (t_old + loop) / (t_new + loop),
                 "same": "loop timed once (unchanged code)"})
    name = "lnq_step" + (f"_w{args.bits}" if args.bits != 2 else "") + ("_quick" if args.quick else "")
    publish(name, rows, before_commit=BEFORE, load_average_start_end=[load_start, os.getloadavg()],
            note="one run per piece (seconds, wall clock) on one thread unless threads says otherwise, on a shared "
                 "machine (its 1/5/15-minute load averages at the start and the end); a whole down_proj layer is "
                 "num_groups (4) such groups")


if __name__ == "__main__":
    main()
