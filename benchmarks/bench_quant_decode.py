"""CPU decode speed of packed models against FP, side by side and interleaved in one run, one thread, batch 1.

Script-only (not a comparison): decode speed in interleaved rounds, not a metric per item; the formats' perplexity at
matched bits is ``llmx compare quant``.

    python benchmarks/bench_quant_decode.py [--model ref:llama-bench] [--data stdlib] [--rounds 5] [--new-tokens 64]

Every configuration is quantized once in memory; then each round times greedy decoding of ``--new-tokens`` tokens
after a 64-token prompt for every configuration in turn (so load on the machine hits all of them alike), and the
table reports the median and range over rounds. ``w4a16 exact`` is the same RTN model with ``LLMX_CPU_KERNELS=0``
(the float path that unpacks every call). Writes benchmarks/results/quant_decode.json and .md.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import add_target_args, data_config, publish, result_name, splitting, targets  # noqa: E402

CONFIGS = [("fp", None, {}), ("rtn", "w4a16 g128", {"bits": "w4a16"}), ("gptq", "w4a16 g128", {"bits": "w4a16"}),
           ("rtn", "w4a16 per-channel", {"bits": "w4a16", "group_size": -1}),
           ("rtn", "w8a16 per-channel", {"bits": "w8a16", "group_size": -1}), ("rtn", "w8a8", {"bits": "w8a8"}),
           ("rtn", "w3a16 g128", {"bits": "w3a16"}), ("bnb", "nf4", {"bits": "w4a16", "quant_type": "nf4"})]


def decode_rate(model, ids: torch.Tensor, new_tokens: int, exact: bool) -> float:
    if exact:
        os.environ["LLMX_CPU_KERNELS"] = "0"
    try:
        with torch.inference_mode():
            model.generate(input_ids=ids, max_new_tokens=2, do_sample=False)
            t0 = time.perf_counter()
            model.generate(input_ids=ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
            return new_tokens / (time.perf_counter() - t0)
    finally:
        os.environ.pop("LLMX_CPU_KERNELS", None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_target_args(ap, ["ref:llama-bench"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--new-tokens", type=int, default=64)
    args = ap.parse_args()
    if len(args.models) != 1:
        ap.error("one --model: the rounds interleave its configurations")
    import llmx
    from llmx.core.data import token_stream

    torch.set_num_threads(1)
    label, model_path = targets(args)[0]
    base, tok = llmx.load(model_path)
    models = {}
    for method, fmt, params in CONFIGS:
        name = "fp" if method == "fp" else f"{method} {fmt}"
        models[name] = base if method == "fp" else llmx.quantize(copy.deepcopy(base), tokenizer=tok, method=method,
                                                                  save=False, data=data_config(args), **params)[0]
    runs = [(name, model, False) for name, model in models.items()]
    runs.insert(2, ("rtn w4a16 g128 exact", models["rtn w4a16 g128"], True))
    ids = token_stream(tok, args.data, "validation", 64, splitting(args))[None]  # a 64-token prompt of held-out text
    rates: dict[str, list[float]] = {name: [] for name, _, _ in runs}
    for _ in range(args.rounds):
        for name, model, exact in runs:
            rates[name].append(decode_rate(model, ids, args.new_tokens, exact))
    fp = statistics.median(rates["fp"])
    rows = [{"config": name, "decode_tok_s": statistics.median(r), "min": min(r), "max": max(r),
             "vs_fp": statistics.median(r) / fp} for name, r in rates.items()]
    for row in rows:
        print(row, flush=True)
    publish(result_name("quant_decode", args), rows, model=label, data=args.data,
            rounds=args.rounds, new_tokens=args.new_tokens, rates=rates)


if __name__ == "__main__":
    main()
