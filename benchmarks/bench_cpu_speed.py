"""Packed layers on the CPU against float32, in one process, interleaved rounds, one thread, with the CPU named.

Script-only (not a comparison): kernel and decode timings of one configuration against another in interleaved rounds,
which no arm-and-item comparison measures.

    python benchmarks/bench_cpu_speed.py [--rounds 7] [--new-tokens 32] [--only linear overhead decode]
    python benchmarks/bench_cpu_speed.py --emulate avx2     # the same in a child under an AVX2 CPU's kernels

Three tables, each round running every configuration once in turn (so load on the machine hits all alike; medians
and ranges over rounds):

* ``linear``: one layer's forward at 4096x4096 and 4096x11008, batch 1 and 8: ``nn.Linear`` in fp32, QuantLinear
  W4A16 group 128 and W8A16 per channel (torch's int4 / int8 kernels) and W8A8 on the path its plan chose for this
  CPU (``w8a8``), with two W8A8 references: ``torch._int_mm`` as before plans (``w8a8_int_mm``: the exact path), and
  ``_int_mm`` with oneDNN off (``w8a8_int_mm_loop``: the scalar loop that ``_int_mm`` is on a CPU without AVX-512
  VNNI, whatever ``--emulate`` says; batch 1 only, it takes seconds at 8).
* ``overhead``: a hidden-256 W4A16 layer's call at batch 1 (``ref:llama-bench``'s shapes) against the bare int4
  kernel call on a ready bf16 input, a module doing only the kernel and the casts and views no forward can skip
  (``kernel_module``: what is left is QuantLinear's own bookkeeping), and ``nn.Linear`` in fp32.
* ``decode``: greedy decoding through ``generate`` of Llamas with random weights at hidden 256 (``ref:llama-bench``'s
  shape: 4 layers, vocabulary 2048) and hidden 2048 (4 layers), FP against RTN W4A16 g128 and W8A8, after a 64-token
  prompt: tokens/s end to end and for the decode steps alone (the prompt's time, a one-token generate, subtracted).

``--emulate avx2`` runs the whole script again in a child with ``ATEN_CPU_CAPABILITY=avx2`` (torch's AVX2 kernels)
and ``ONEDNN_MAX_CPU_ISA=AVX2`` (oneDNN's); both are read at startup. The CPU's AVX-512 VNNI stays visible to
``torch._int_mm`` (it asks the CPU, not either variable), so under emulation ``w8a8_int_mm`` runs oneDNN's AVX2 int8
code, not the scalar loop a real AVX2 CPU gets (``w8a8_int_mm_loop`` shows that one), and that code's sums saturate
(19% relative error on random codes): its time is shown, its results are wrong, and the plan never takes it. Writes
benchmarks/results/cpu_speed[_avx2].json and .md (``--name`` for another file name).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, machine, markdown, write  # noqa: E402

LINEAR_SHAPES = [(4096, 4096), (4096, 11008)]
BATCHES = (1, 8)
OVERHEAD_SHAPES = [(256, 256), (256, 704), (704, 256)]
DECODE_WIDTHS = (256, 2048)
EMULATE = {"avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}}


def layer(lin: torch.nn.Linear, bits: int, group: int | None, act: int):
    from llmx.core.quant.formats import IntFormat, quantize
    from llmx.core.quant.qlinear import QuantLinear

    fmt = IntFormat(bits, group, True, full_range=True)
    return QuantLinear.from_codes(lin, *quantize(lin.weight.data, fmt), fmt, act_bits=act)


def exact(fn):
    """``fn`` on the exact path (what every W8A8 forward ran before plans: ``torch._int_mm``)."""
    from llmx.core.quant import cpu_kernels

    def run(*args):
        with cpu_kernels.exact():
            return fn(*args)
    return run


def without_onednn(fn):
    def run(*args):
        before = torch.backends.mkldnn.enabled
        torch.backends.mkldnn.enabled = False
        try:
            return fn(*args)
        finally:
            torch.backends.mkldnn.enabled = before
    return run


def interleaved(calls: dict, rounds: int, repeats: int = 1) -> dict[str, list[float]]:
    """Seconds per call of each ``name -> (fn, args)``, ``rounds`` rounds of every call in turn (one warm-up each)."""
    for fn, args in calls.values():
        fn(*args)
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, (fn, args) in calls.items():
            t0 = time.perf_counter()
            for _ in range(repeats):
                fn(*args)
            times[name].append((time.perf_counter() - t0) / repeats)
    return times


def median_ms(times: list[float]) -> float:
    return 1e3 * statistics.median(times)


@torch.inference_mode()
def linear_rows(rounds: int) -> list[dict]:
    rows = []
    for k, n in LINEAR_SHAPES:
        torch.manual_seed(0)
        lin = torch.nn.Linear(k, n, bias=False)
        w4, w8, w8a8 = layer(lin, 4, 128, 16), layer(lin, 8, None, 16), layer(lin, 8, None, 8)
        for m in BATCHES:
            x = torch.randn(m, k)
            calls = {"fp32": (lin, (x,)), "w4a16": (w4, (x,)), "w8a16": (w8, (x,)), "w8a8": (w8a8, (x,)),
                     "w8a8_int_mm": (exact(w8a8), (x,))}
            if m == 1:
                calls["w8a8_int_mm_loop"] = (without_onednn(exact(w8a8)), (x,))
            times = interleaved(calls, rounds)
            ref = lin(x)
            row = {"in": k, "out": n, "batch": m, "fp32_ms": median_ms(times["fp32"])}
            for name in calls:
                if name != "fp32":
                    row[f"{name}_ms"] = median_ms(times[name])
                    row[f"{name}_vs_fp32"] = row["fp32_ms"] / row[f"{name}_ms"]
            row["w8a8_path"] = w8a8._plan.path + (f" (<= {w8a8._plan.max_rows} rows)" if w8a8._plan.max_rows else "")
            row["w4a16_rel_err"] = float((w4(x) - ref).norm() / ref.norm())  # the kernel's bf16 and the int4 grid
            row["w8a8_rel_err"] = float((w8a8(x) - ref).norm() / ref.norm())
            # against exact int32 sums: the scalar loop (oneDNN capped below VNNI on a VNNI CPU saturates them)
            row["w8a8_vs_exact_rel"] = float((w8a8(x) - without_onednn(exact(w8a8))(x)).norm() / ref.norm())
            rows.append(row)
            print(row, flush=True)
    return rows


class Floor(torch.nn.Module):
    """The least a layer's call does around the int4 kernel: flatten, cast to bf16, the kernel, cast back, reshape,
    with ``nn.Module``'s call (what ``nn.Linear`` pays too) and no checks."""

    def __init__(self, packed: torch.Tensor, sz: torch.Tensor, group: int, k: int, n: int):
        super().__init__()
        self.packed, self.sz, self.group, self.k, self.n = packed, sz, group, k, n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch._weight_int4pack_mm_for_cpu(x.reshape(-1, self.k).bfloat16(), self.packed, self.group, self.sz)
        return out.float().view(1, 1, self.n)


@torch.inference_mode()
def overhead_rows(rounds: int, calls_per_round: int = 2000) -> list[dict]:
    rows = []
    for k, n in OVERHEAD_SHAPES:
        torch.manual_seed(0)
        lin = torch.nn.Linear(k, n, bias=False)
        q = layer(lin, 4, 128, 16)
        x = torch.randn(1, 1, k)
        q(x)  # the plan (and the kernel layout)
        packed, sz, group = q._buffers["qweight"], q._buffers["_kernel_sz"], q._kernel_group
        xb = x.reshape(1, k).to(torch.bfloat16)

        def bare(xb=xb, packed=packed, group=group, sz=sz):
            return torch._weight_int4pack_mm_for_cpu(xb, packed, group, sz)

        floor = Floor(packed, sz, group, k, n)
        times = interleaved({"quantlinear": (q, (x,)), "bare_kernel": (bare, ()), "kernel_module": (floor, (x,)),
                             "fp32_linear": (lin, (x,))}, rounds, calls_per_round)
        row = {"in": k, "out": n, **{f"{name}_us": 1e6 * statistics.median(t) for name, t in times.items()}}
        row["vs_bare_kernel"] = row["quantlinear_us"] / row["bare_kernel_us"]
        row["vs_kernel_module"] = row["quantlinear_us"] / row["kernel_module_us"]
        row["vs_fp32_linear"] = row["quantlinear_us"] / row["fp32_linear_us"]
        rows.append(row)
        print(row, flush=True)
    return rows


def decode_models(hidden: int):
    """FP, W4A16 g128 and W8A8 (both RTN, dynamic per-token activations) of one random-weight Llama."""
    from transformers import LlamaForCausalLM

    import llmx
    from llmx.core.models.archs import config
    from llmx.core.tokenizer import byte_tokenizer

    tok = byte_tokenizer()
    torch.manual_seed(0)
    cfg = config("llama", vocab_size=2048, hidden=hidden, layers=4, heads=4 if hidden == 256 else 16,
                 max_positions=256)
    base = LlamaForCausalLM(cfg).eval()
    models = {"fp": base}
    for name, bits in (("w4a16", "w4a16"), ("w8a8", "w8a8")):
        models[name] = llmx.quantize(copy.deepcopy(base), tokenizer=tok, method="rtn", bits=bits, save=False)[0]
    return models


def generate(model, ids: torch.Tensor, tokens: int) -> None:
    model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens, min_new_tokens=tokens,
                   do_sample=False, pad_token_id=0)


@torch.inference_mode()
def decode_rows(rounds: int, new_tokens: int) -> list[dict]:
    rows = []
    ids = torch.randint(3, 2048, (1, 64), generator=torch.Generator().manual_seed(0))
    for hidden in DECODE_WIDTHS:
        models = decode_models(hidden)
        calls = {}
        for name, model in models.items():
            calls[f"{name} prompt"] = (generate, (model, ids, 1))
            calls[f"{name} all"] = (generate, (model, ids, new_tokens))
        times = interleaved(calls, rounds)
        fp_all = statistics.median(times["fp all"])
        fp_steps = statistics.median([a - p for a, p in zip(times["fp all"], times["fp prompt"], strict=True)])
        for name in models:
            all_s = times[f"{name} all"]
            steps = [a - p for a, p in zip(all_s, times[f"{name} prompt"], strict=True)]
            row = {"hidden": hidden, "config": name,
                   "tok_s": new_tokens / statistics.median(all_s),
                   "tok_s_min": new_tokens / max(all_s), "tok_s_max": new_tokens / min(all_s),
                   "vs_fp": fp_all / statistics.median(all_s),
                   "decode_tok_s": (new_tokens - 1) / statistics.median(steps),
                   "decode_vs_fp": fp_steps / statistics.median(steps),
                   "prompt_ms": median_ms(times[f"{name} prompt"])}
            rows.append(row)
            print(row, flush=True)
    return rows


def plans() -> dict:
    """What this process's CPU picks (the dispatch table's row for it)."""
    from llmx.core.quant import cpu_kernels

    if not hasattr(cpu_kernels, "capability"):  # llmx before plans (a --only overhead run for the before figures)
        return {}
    cap = cpu_kernels.capability()
    return {"capability": cap.torch, "avx512_vnni_usable": cap.vnni, "onednn_isa": cap.onednn_isa,
            "w4a16": "int4 kernel (_weight_int4pack_mm_for_cpu, bf16)", "w8a16": "int8 kernel (_weight_int8pack_mm)",
            "w8a8_4096x4096": "{}, max rows {}".format(*cpu_kernels.w8a8_path(4096, 4096, cap))}


def llmx_tree() -> dict:
    """Which llmx ran (a run with another tree on PYTHONPATH, e.g. the commit before plans, says so)."""
    import llmx

    folder = Path(llmx.__file__).resolve().parent
    commit = subprocess.run(["git", "-C", str(folder), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return {"path": str(folder), "commit": commit.stdout.strip() or None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--only", nargs="+", choices=["linear", "overhead", "decode"],
                    default=["linear", "overhead", "decode"])
    ap.add_argument("--emulate", choices=sorted(EMULATE), help="Run in a child under this CPU's kernels.")
    ap.add_argument("--name", help="Result file name (default cpu_speed, cpu_speed_<emulated>).")
    args = ap.parse_args()
    if args.emulate:
        argv = [a for a in sys.argv[1:] if a not in ("--emulate", args.emulate)]
        name = args.name or f"cpu_speed_{args.emulate}"
        env = {**os.environ, **EMULATE[args.emulate], "OMP_NUM_THREADS": "1"}
        raise SystemExit(subprocess.run([sys.executable, __file__, *argv, "--name", name], env=env).returncode)
    torch.set_num_threads(1)
    tables = {}
    if "linear" in args.only:
        tables["linear"] = linear_rows(args.rounds)
    if "overhead" in args.only:
        tables["overhead"] = overhead_rows(args.rounds)
    if "decode" in args.only:
        tables["decode"] = decode_rows(args.rounds, args.new_tokens)
    name = args.name or "cpu_speed"
    info = machine()
    write(name, {"benchmark": name, "rounds": args.rounds, "new_tokens": args.new_tokens, "plans": plans(),
                 "llmx": llmx_tree(), "machine": info, "tables": tables})
    cpu = (f"CPU: {info['cpu_model']}, torch capability {info['torch_cpu_capability']}"
           + (f", emulated {info['emulated']}" if "emulated" in info else "") + f", {info['threads']} thread")
    text = [cpu, ""]
    for table, rows in tables.items():
        text += [f"**{table}**", "", markdown(list(rows[0]), rows), ""]
    (RESULTS / f"{name}.md").write_text("\n".join(text))
    print("\n".join(text))


if __name__ == "__main__":
    main()
