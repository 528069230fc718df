"""Weight quantization baselines side by side: FP, RTN, GPTQ and bitsandbytes at 8/4/3 bits, group 128 and per channel
(full-range symmetric grid; the restricted grid as extra rows).

    python benchmarks/bench_quant.py [--models ref:llama-bench ref:mamba2-bench] [--max-tokens 16384] [--quick]

For each model: held-out perplexity on standard-library code, bytes of the saved weights (packed files, measured on
disk, against the FP model's fp32 files; embeddings and lm_head stay in float), the quantized layers' bytes against
their fp16 size, and CPU decode tokens/s (one thread, batch 1). Writes
benchmarks/results/quant_<model>.json and .md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, markdown, run_pipeline, write  # noqa: E402

GRANULARITY = {"g128": 128, "per-channel": -1}


def configs(quick: bool) -> list[tuple[str, str, dict]]:
    rows = [("fp", "-", {})]
    bits = ["w4a16"] if quick else ["w8a16", "w4a16", "w3a16"]
    for method in ("rtn", "gptq"):
        for b in bits:
            for gran, g in GRANULARITY.items():
                rows.append((method, f"{b} {gran}", {"bits": b, "group_size": g}))
    if not quick:  # the older symmetric grid, which leaves -2^(b-1) unused, on the same model
        for method in ("rtn", "gptq"):
            for b in ("w4a16", "w3a16"):
                rows.append((method, f"{b} g128 restricted grid", {"bits": b, "group_size": 128, "grid": "restricted"}))
    rows.append(("bnb", "nf4 (block 64)", {"bits": "w4a16", "quant_type": "nf4", "blocksize": 64}))
    if not quick:
        rows.append(("bnb", "nf4 (block 128)", {"bits": "w4a16", "quant_type": "nf4", "blocksize": 128}))
        rows.append(("bnb", "llm.int8 w8a8", {"bits": "w8a8"}))
        rows.append(("rtn", "w8a8 int8 matmul", {"bits": "w8a8"}))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["ref:llama-bench", "ref:mamba2-bench"])
    ap.add_argument("--max-tokens", type=int, default=16384)
    ap.add_argument("--quick", action="store_true", help="A few rows only (a smoke run of this script).")
    args = ap.parse_args()
    from llmx.core import zoo
    from llmx.core.models import load
    from llmx.core.models.storage import weight_file_bytes

    for model in args.models:
        fp_params = sum(p.numel() for p in load(model)[0].parameters())
        fp_bytes = weight_file_bytes(zoo.locate(model))  # the fp32 files
        evals = [{"method": "perplexity", "params": {"max_tokens": args.max_tokens, "seq_len": 256, "stride": 128}},
                 {"method": "speed", "params": {"prompt_len": 64, "new_tokens": 32, "repeats": 3}}]
        rows = []
        for method, label, params in configs(args.quick):
            quant = [] if method == "fp" else [{"method": method, "params": params}]
            metrics = run_pipeline(model, quant + evals, threads=1)
            q = metrics[0] if quant else {}
            ppl, speed = metrics[-2], metrics[-1]
            stored = q.get("stored_weight_bytes", fp_bytes)
            rows.append({"method": method, "format": label, "perplexity": ppl["perplexity"],
                         "stored_weight_bytes": stored, "vs_fp_files": stored / fp_bytes,
                         "quantized_vs_fp16": q.get("quantized_bytes_vs_fp16"),
                         "gptq_objective_vs_rtn": q.get("objective_vs_rtn_mean"),
                         "decode_tok_s": speed["decode_tokens_per_s"], "prefill_tok_s": speed["prefill_tokens_per_s"]})
            print(rows[-1], flush=True)
        fp = rows[0]["perplexity"]
        for r in rows:
            r["ppl_increase_pct"] = 100 * (r["perplexity"] / fp - 1)
        name = model.replace(":", "_")
        columns = ["method", "format", "perplexity", "ppl_increase_pct", "stored_weight_bytes", "vs_fp_files",
                   "quantized_vs_fp16", "gptq_objective_vs_rtn", "decode_tok_s"]
        table = markdown(columns, rows)
        write(f"quant_{name}", {"benchmark": "quant", "model": model, "params": fp_params, "eval_tokens": args.max_tokens,
                                "machine": machine(), "rows": rows})
        (Path(__file__).resolve().parent / "results" / f"quant_{name}.md").write_text(table + "\n")
        print(table)


if __name__ == "__main__":
    main()
