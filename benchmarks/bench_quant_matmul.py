"""Packed layers against float on the CPU, at real layer shapes, side by side in one run.

    python benchmarks/bench_quant_matmul.py [--threads 1]

Each row times one layer's forward (medians of repeats after a warm-up): an fp32 and a bf16 ``nn.Linear``, and
QuantLinear as W4A16 group 128 through torch's packed-int4 kernel and through the exact float path
(``LLMX_CPU_KERNELS=0``: unpack and dequantize every call), W8A16 per channel through the int8 kernel, W8A8 through
the integer matmul. Writes benchmarks/results/quant_matmul.json and .md.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import publish, timed  # noqa: E402

SHAPES = [(1, 4096, 4096), (1, 4096, 11008), (1, 11008, 4096), (16, 4096, 4096), (128, 4096, 11008)]


def layer(lin: torch.nn.Linear, bits: int, group: int | None, act: int):
    from llmx.core.quant.formats import IntFormat, quantize
    from llmx.core.quant.qlinear import QuantLinear

    fmt = IntFormat(bits, group, True, full_range=True)
    return QuantLinear.from_codes(lin, *quantize(lin.weight, fmt), fmt, act_bits=act)


def exact(q, x):
    os.environ["LLMX_CPU_KERNELS"] = "0"
    try:
        return q(x)
    finally:
        del os.environ["LLMX_CPU_KERNELS"]


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1])
    args = ap.parse_args()
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for m, k, n in SHAPES:
            torch.manual_seed(0)
            lin = torch.nn.Linear(k, n, bias=False)
            x = torch.randn(m, k)
            w4, w8, w8a8 = layer(lin, 4, 128, 16), layer(lin, 8, None, 16), layer(lin, 8, None, 8)
            ref = lin(x)
            row = {"threads": threads, "tokens": m, "in": k, "out": n,
                   "fp32_ms": 1e3 * timed(lin, x),
                   "bf16_ms": 1e3 * timed(copy.deepcopy(lin).to(torch.bfloat16), x.to(torch.bfloat16)),
                   "w4a16_kernel_ms": 1e3 * timed(w4, x),
                   "w4a16_exact_ms": 1e3 * timed(exact, w4, x, repeats=3),
                   "w8a16_kernel_ms": 1e3 * timed(w8, x),
                   "w8a8_int_mm_ms": 1e3 * timed(w8a8, x)}
            row["w4a16_kernel_vs_fp32"] = row["fp32_ms"] / row["w4a16_kernel_ms"]
            row["w4a16_kernel_vs_bf16"] = row["bf16_ms"] / row["w4a16_kernel_ms"]
            row["w8a16_kernel_vs_fp32"] = row["fp32_ms"] / row["w8a16_kernel_ms"]
            row["w8a8_vs_fp32"] = row["fp32_ms"] / row["w8a8_int_mm_ms"]
            # the kernel's bf16 rounding, next to the quantization error itself (both against the fp32 layer)
            row["w4a16_kernel_rel_err"] = float((w4(x) - ref).norm() / ref.norm())
            row["w4a16_exact_rel_err"] = float((exact(w4, x) - ref).norm() / ref.norm())
            rows.append(row)
            print(row, flush=True)
    publish("quant_matmul", rows)


if __name__ == "__main__":
    main()
