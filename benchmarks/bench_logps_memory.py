"""Peak memory of label log-probs, forward + backward: ``log_softmax(logits.float()).gather`` against the chunked
``selective_log_softmax`` (``llmx.core.logprobs``), for fp32 and bf16 logits.

Script-only (not a comparison): peak memory of one op under two implementations.

    python benchmarks/bench_logps_memory.py [--batch 4] [--seq 256] [--vocab 32000] [--rows 0 128]

Each arm starts from leaf logits ``[B, T, V]`` (allocated before the measured section, so their bytes are not in
the peak; their gradient is) and runs the log-probs of ``input_ids[:, 1:]`` and a backward of a weighted sum.
Figures: the peak bytes held above the section's start (``PeakMemory``: the CPU profiler's allocation log), the
bytes autograd saved for the backward (``saved_tensors_hooks``; the chunked arm's are the logits it was given),
both also as a multiple of one float32 ``[B, T, V]`` tensor, and the largest difference from the full computation.
``--rows 0`` is the default chunk (64 MiB of float32). Writes benchmarks/results/logps_memory.json and .md, with the
CPU (its model, ``platform.processor()`` and torch's CPU capability).
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_model, publish  # noqa: E402

from llmx.core.logprobs import CHUNK_ELEMENTS, selective_log_softmax  # noqa: E402
from llmx.core.memory import PeakMemory  # noqa: E402


def full(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def chunked(rows: int | None):
    def fn(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        labels = torch.cat([ids[:, 1:], ids[:, :1]], dim=1)  # as token_logps: the last position is dropped
        return selective_log_softmax(logits, labels, rows)[:, :-1]
    return fn


def measure(fn, shape: tuple[int, int, int], dtype: torch.dtype, seed: int = 0):
    """(peak bytes, saved bytes, values, gradient) of one forward + backward."""
    g = torch.Generator().manual_seed(seed)
    saved: dict[int, int] = {}  # by storage: log_softmax and gather save the same tensor

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with PeakMemory("cpu") as pm:
        logits = (torch.randn(shape, generator=g) * 3).to(dtype).requires_grad_()
        ids = torch.randint(shape[2], shape[:2], generator=g)
        weight = torch.randn(shape[0], shape[1] - 1, generator=g)
        with pm.section():
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = fn(logits, ids)
            (out * weight).sum().backward()
    return pm.peak_bytes, sum(saved.values()), out.detach(), logits.grad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--rows", type=int, nargs="+", default=[0, 128], help="Rows per chunk (0: the default).")
    args = ap.parse_args()
    torch.set_num_threads(1)
    shape = (args.batch, args.seq, args.vocab)
    unit = args.batch * args.seq * args.vocab * 4  # one float32 [B, T, V]
    cpu = cpu_model()
    default = CHUNK_ELEMENTS // args.vocab
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        _, _, want, want_grad = measure(full, shape, dtype)
        arms = [("full log_softmax", full)] + [(f"chunked ({r or f'{default}, the default,'} rows)", chunked(r or None))
                                               for r in args.rows]
        for name, fn in arms:
            peak, saved, out, grad = measure(fn, shape, dtype)
            rows.append({"logits": str(dtype).removeprefix("torch."), "method": name,
                         "peak_MiB": peak / 2**20, "peak_x_fp32_BTV": peak / unit,
                         "saved_MiB": saved / 2**20, "saved_x_fp32_BTV": saved / unit,
                         "max_value_diff": float((out - want).abs().max()),
                         "max_grad_diff": float((grad.float() - want_grad.float()).abs().max()),
                         "cpu": cpu["cpu_model"], "processor": platform.processor() or None,
                         "cpu_capability": torch.backends.cpu.get_cpu_capability()})
    publish("logps_memory", rows, shape={"batch": args.batch, "seq": args.seq, "vocab": args.vocab},
            fp32_BTV_MiB=unit / 2**20)


if __name__ == "__main__":
    main()
