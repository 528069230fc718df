"""Weight quantization baselines side by side: FP, RTN, GPTQ and bitsandbytes at 8/4/3 bits, group 128 and per channel
(full-range symmetric grid; the restricted grid as extra rows), GPTQ over calibration seeds.

Kept as a script: decode and prefill tokens/s per format (a speed stage beside the perplexity), the saved files' bytes
on disk, GPTQ's layer objective against RTN's and the grid of widths x granularities on a Llama and a Mamba2; the
paired perplexity comparisons at matched bits are ``llmx compare quant`` (4 bits: GPTQ, RTN, NF4) and ``llmx compare
gptq`` (3 bits).

    python benchmarks/bench_quant.py [--models ref:llama-bench ref:mamba2-bench] [--data stdlib] [--seeds 0 1 2]
    python benchmarks/bench_quant.py --data notes.txt --models ref:llama-bench   # the presets trained on notes.txt

For each model: held-out perplexity (`llmx eval --method perplexity`'s defaults: 16k tokens in windows of 128 with
stride 64), bytes of the saved weights (packed files, measured on disk, against the FP model's fp32 files;
embeddings and lm_head stay in float), the quantized layers' bytes against their fp16 size, and CPU decode tokens/s
(one thread, batch 1; first seed only). GPTQ draws its 128 calibration windows per seed; RTN and bitsandbytes have
no randomness and run once. Writes benchmarks/results/quant_<model>.json and .md: a row per run, and per format
the mean and range over seeds with GPTQ-vs-RTN judged against the range.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    EVAL,
    RESULTS,
    add_target_args,
    data_config,
    file_label,
    machine,
    markdown,
    model_folder,
    perplexity,
    result_name,
    run_pipeline,
    spread,
    targets,
    verdict,
    write,
)

GRANULARITY = {"g128": 128, "per-channel": -1}
SEEDED = {"gptq"}  # methods with a random part (calibration windows)
OBJECTIVES = {"gptq": {"log_objectives": True}}  # the gptq_objective_vs_rtn column (a diagnostic, off by default)


def configs(quick: bool) -> list[tuple[str, str, dict]]:
    rows = [("fp", "-", {})]
    bits = ["w4a16"] if quick else ["w8a16", "w4a16", "w3a16"]
    for method in ("rtn", "gptq"):
        for b in bits:
            for gran, g in GRANULARITY.items():
                rows.append((method, f"{b} {gran}", {"bits": b, "group_size": g, **OBJECTIVES.get(method, {})}))
    if not quick:  # the older symmetric grid, which leaves -2^(b-1) unused, on the same model
        for method in ("rtn", "gptq"):
            for b in ("w4a16", "w3a16"):
                rows.append((method, f"{b} g128 restricted grid", {"bits": b, "group_size": 128, "grid": "restricted",
                                                                   **OBJECTIVES.get(method, {})}))
    rows.append(("bnb", "nf4 (block 64)", {"bits": "w4a16", "quant_type": "nf4", "blocksize": 64}))
    if not quick:
        rows.append(("bnb", "nf4 (block 128)", {"bits": "w4a16", "quant_type": "nf4", "blocksize": 128}))
        rows.append(("bnb", "llm.int8 w8a8", {"bits": "w8a8"}))
        rows.append(("rtn", "w8a8 int8 matmul", {"bits": "w8a8"}))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_target_args(ap, ["ref:llama-bench", "ref:mamba2-bench"], seeds=[0, 1, 2])
    ap.add_argument("--max-tokens", type=int, default=EVAL["max_tokens"])
    ap.add_argument("--quick", action="store_true", help="A few rows only (a smoke run of this script).")
    args = ap.parse_args()
    from llmx.core.models import load
    from llmx.core.models.storage import weight_file_bytes

    for label, model in targets(args):
        fp_params = sum(p.numel() for p in load(model)[0].parameters())
        fp_bytes = weight_file_bytes(model_folder(model))
        speed = {"method": "speed", "params": {"prompt_len": 64, "new_tokens": 32, "repeats": 3}}
        rows = []
        for method, fmt, params in configs(args.quick):
            for seed in args.seeds if method in SEEDED else args.seeds[:1]:
                quant = [] if method == "fp" else [{"method": method, "params": params}]
                evals = [perplexity(max_tokens=args.max_tokens)] + ([speed] if seed == args.seeds[0] else [])
                metrics = run_pipeline(model, quant + evals, threads=1, seed=seed, data=data_config(args))
                q = metrics[0] if quant else {}
                ppl = metrics[len(quant)]
                stored = q.get("stored_weight_bytes", fp_bytes)
                rows.append({"method": method, "format": fmt, "seed": seed if method in SEEDED else None,
                             "perplexity": ppl["perplexity"], "stored_weight_bytes": stored,
                             "vs_fp_files": stored / fp_bytes, "quantized_vs_fp16": q.get("quantized_bytes_vs_fp16"),
                             "gptq_objective_vs_rtn": q.get("objective_vs_rtn_mean"),
                             **speed_figures(metrics, len(quant))})
                print(rows[-1], flush=True)
        fp = rows[0]["perplexity"]
        for r in rows:
            r["ppl_increase_pct"] = 100 * (r["perplexity"] / fp - 1)
        summary = summarise(rows)
        name = result_name(f"quant_{file_label(label)}", args, names_model=True)
        write(name, {"benchmark": "quant", "model": label, "model_path": model, "data": args.data,
                     "params": fp_params, "eval": {**EVAL, "max_tokens": args.max_tokens}, "seeds": args.seeds,
                     "machine": machine(), "rows": rows, "summary": summary})
        columns = ["method", "format", "seed", "perplexity", "ppl_increase_pct", "stored_weight_bytes", "vs_fp_files",
                   "quantized_vs_fp16", "gptq_objective_vs_rtn", "decode_tok_s", "prefill_tok_s"]
        text = (f"{label} on {args.data}: FP perplexity {fp:.4g} (windows of {EVAL['seq_len']}, stride "
                f"{EVAL['stride']}, {args.max_tokens} tokens); GPTQ seeds {args.seeds}\n\n"
                + markdown(["method", "format", "runs", "increase_mean_pct", "increase_min_pct", "increase_max_pct",
                            "gptq_vs_rtn"], summary) + "\n\nEvery run:\n\n" + markdown(columns, rows))
        (RESULTS / f"{name}.md").write_text(text + "\n")
        print(text)


def speed_figures(metrics: list[dict], n_quant: int) -> dict:
    """Decode and prefill tokens/s where the speed stage ran (the first seed), else None."""
    ran = len(metrics) > n_quant + 1
    return {"decode_tok_s": metrics[-1]["decode_tokens_per_s"] if ran else None,
            "prefill_tok_s": metrics[-1]["prefill_tokens_per_s"] if ran else None}


def summarise(rows: list[dict]) -> list[dict]:
    """Per (method, format): the perplexity increase over seeds, and for GPTQ whether it is ahead of RTN at the same
    format beyond the seed range (RTN has one run: GPTQ is ahead when every seed is below it)."""
    groups: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        groups.setdefault((r["method"], r["format"]), []).append(r["ppl_increase_pct"])
    out = []
    for (method, fmt), values in groups.items():
        s = spread(values)
        rtn = groups.get(("rtn", fmt)) if method == "gptq" else None
        out.append({"method": method, "format": fmt, "runs": s["n"], "increase_mean_pct": s["mean"],
                    "increase_min_pct": s["min"], "increase_max_pct": s["max"],
                    "gptq_vs_rtn": verdict(values, rtn, ("GPTQ", "RTN")) if rtn else None})
    return out


if __name__ == "__main__":
    main()
