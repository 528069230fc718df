"""CLOVER vs vanilla head-dimension pruning, before and after the same fine-tuning budget.

    python benchmarks/bench_clover.py [--models ref:opt ref:llama] [--ratios 0.25 0.5 0.7 0.875] [--steps 100]

ref:opt has learned positions, so both Q-K and V-O are pruned; ref:llama has RoPE (and GQA), so only V-O is.
For each ratio and criterion: held-out NLL right after pruning and after fine-tuning (CLOVER: a core between the
frozen singular vectors; vanilla: the same-size core on its raw vectors), parameters and KV bytes per token.
Writes benchmarks/results/clover_<model>.json and .md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, markdown, run_pipeline, write  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["ref:opt", "ref:llama"])
    ap.add_argument("--ratios", nargs="+", type=float, default=[0.25, 0.5, 0.7, 0.875])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--max-tokens", type=int, default=16384)
    args = ap.parse_args()
    ppl = {"method": "perplexity", "params": {"max_tokens": args.max_tokens, "seq_len": 256, "stride": 128}}
    for model in args.models:
        base = run_pipeline(model, [ppl], threads=1)[0]["nll"]
        rows = []
        for ratio in args.ratios:
            for criterion in ("vanilla", "clover"):
                basis = "svd" if criterion == "clover" else "raw"
                stages = [{"method": "clover", "stage": "prune", "params": {"ratio": ratio, "criterion": criterion,
                                                                              "save": False}}, ppl,
                          {"method": "clover", "stage": "train",
                           "params": {"basis": basis, "steps": args.steps, "save": False}}, ppl]
                prune, pruned, tune, tuned = run_pipeline(model, stages, threads=1)
                rows.append({"ratio": ratio, "criterion": criterion, "targets": prune["targets"],
                             "qk_dim": prune["qk_dim"], "vo_dim": prune["vo_dim"],
                             "nll_increase_pruned": pruned["nll"] - base, "nll_increase_finetuned": tuned["nll"] - base,
                             "params": prune["params_after"], "params_before": prune["params_before"],
                             "kv_bytes_per_token": prune["kv_bytes_per_token_after"],
                             "kv_bytes_per_token_before": prune["kv_bytes_per_token_before"],
                             "trainable_params": tune["trainable_params"]})
                print(rows[-1], flush=True)
        name = model.replace(":", "_")
        columns = ["ratio", "criterion", "targets", "qk_dim", "vo_dim", "nll_increase_pruned", "nll_increase_finetuned",
                   "params", "kv_bytes_per_token", "trainable_params"]
        table = markdown(columns, rows)
        write(f"clover_{name}", {"benchmark": "clover", "model": model, "base_nll": base, "eval_tokens": args.max_tokens,
                                 "finetune_steps": args.steps, "machine": machine(), "rows": rows})
        (Path(__file__).resolve().parent / "results" / f"clover_{name}.md").write_text(
            f"base NLL {base:.4f}\n\n{table}\n")
        print(table)


if __name__ == "__main__":
    main()
