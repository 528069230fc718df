"""W8A8 on the CPU: integer matmul (torch._int_mm, int32 accumulation) against fp32 at real layer shapes.

    python benchmarks/bench_int8_matmul.py

Times the bare matmuls and the whole QuantLinear W8A8 forward (per-token activation quantization included) against
an fp32 nn.Linear; medians of repeats after a warm-up. Writes benchmarks/results/int8_matmul.json and .md.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, markdown, timed, write  # noqa: E402

SHAPES = [  # (tokens, in, out): decode and prefill at Llama-7B and reference-model widths
    (1, 4096, 4096), (1, 4096, 11008), (16, 4096, 4096), (128, 4096, 4096), (128, 4096, 11008), (512, 256, 704),
]


@torch.inference_mode()
def main() -> None:
    from llmx.core.quant.formats import IntFormat, quantize
    from llmx.core.quant.qlinear import QuantLinear

    rows = []
    for threads in (1, torch.get_num_threads()):
        torch.set_num_threads(threads)
        for m, k, n in SHAPES:
            lin = torch.nn.Linear(k, n)
            fmt = IntFormat(8, None)
            q = QuantLinear.from_codes(lin, *quantize(lin.weight, fmt), fmt, act_bits=8)
            x = torch.randn(m, k)
            xi = torch.randint(-127, 127, (m, k), dtype=torch.int8)
            wt = q.qweight.t()
            wf = lin.weight.t().contiguous()
            row = {"threads": threads, "tokens": m, "in": k, "out": n,
                   "fp32_matmul_ms": 1e3 * timed(torch.matmul, x, wf),
                   "int_mm_ms": 1e3 * timed(torch._int_mm, xi, wt),
                   "fp32_linear_ms": 1e3 * timed(lin, x),
                   "w8a8_linear_ms": 1e3 * timed(q, x)}
            row["int_mm_speedup"] = row["fp32_matmul_ms"] / row["int_mm_ms"]
            row["w8a8_linear_speedup"] = row["fp32_linear_ms"] / row["w8a8_linear_ms"]
            rows.append(row)
            print(row, flush=True)
    columns = list(rows[0])
    write("int8_matmul", {"benchmark": "int8_matmul", "machine": machine(), "rows": rows})
    table = markdown(columns, rows)
    (Path(__file__).resolve().parent / "results" / "int8_matmul.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
