"""Preference alignment side by side on the brackets task: DPO, KTO, SimPO, PIPA-M, PIPA-N and ConfPO, 3 seeds each.

    python benchmarks/bench_align.py [--model ref:llama] [--seeds 0 1 2] [--steps 100]

The preference data are the reference model's own samples on standard-library code, labelled by a program (the
completed line has balanced brackets). Every method trains from the same model on the same data with the same
steps, batch and learning rate; KTO and the unpaired PIPA rows use the unpaired labels of the same samples. Reported:
the rate of preferred completions sampled on held-out prompts, the KL from the reference on those samples, and
held-out preference accuracy. Writes benchmarks/results/align.json and .md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, markdown, run_pipeline, write  # noqa: E402

METHODS = [  # (label, method, data kind, params)
    ("DPO", "dpo", "paired", {}),
    ("KTO", "kto", "unpaired", {}),
    ("SimPO", "simpo", "paired", {}),
    ("PIPA-M", "pipa", "paired", {"variant": "m"}),
    ("PIPA-N", "pipa", "paired", {"variant": "n"}),  # beta 1 (the derivation); with beta 0.1 it is DPO exactly
    ("PIPA-M unpaired", "pipa", "unpaired", {"variant": "m"}),
    ("PIPA-N unpaired", "pipa", "unpaired", {"variant": "n"}),
    ("ConfPO (SimPO)", "confpo", "paired", {"base": "simpo", "beta": 2.0, "gamma": 0.5}),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="ref:llama")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--prompts", type=int, default=400)
    ap.add_argument("--eval-prompts", type=int, default=50)
    args = ap.parse_args()
    evaluate = {"method": "task", "stage": "eval",
                "params": {"task": "brackets", "limit": args.eval_prompts, "samples": 4, "kl": True}}
    with tempfile.TemporaryDirectory() as tmp:
        built = run_pipeline(args.model, [{"method": "task", "stage": "analyze",
                                           "params": {"task": "brackets",
                                                      "limit": {"train": args.prompts, "validation": 50}}}],
                             output_dir=tmp, threads=1)[0]
        print(built, flush=True)
        base = [run_pipeline(args.model, [evaluate], threads=1, seed=s)[0] for s in args.seeds]
        rows = [summarise("reference (no alignment)", base, [])]
        for label, method, kind, params in METHODS:
            runs, aligns = [], []
            for seed in args.seeds:
                stage = {"method": method, "stage": "align",
                         "params": {"data": str(Path(built["data_dir"]) / f"train_{kind}.jsonl"),
                                    "eval_data": str(Path(built["data_dir"]) / f"validation_{kind}.jsonl"),
                                    "steps": args.steps, "lr": args.lr, "batch_size": 8, "save": False, **params}}
                align, ev = run_pipeline(args.model, [stage, evaluate], threads=1, seed=seed)
                runs.append(ev)
                aligns.append(align)
            rows.append(summarise(label, runs, aligns))
            print(rows[-1], flush=True)
    columns = ["method", "preferred_rate", "preferred_rate_sd", "kl_from_reference", "heldout_pref_accuracy"]
    table = markdown(columns, rows)
    write("align", {"benchmark": "align", "model": args.model, "seeds": args.seeds, "steps": args.steps, "lr": args.lr,
                    "data": built, "machine": machine(), "rows": rows})
    (Path(__file__).resolve().parent / "results" / "align.md").write_text(table + "\n")
    print(table)


def summarise(label: str, evals: list[dict], aligns: list[dict]) -> dict:
    rates = [e["score"] for e in evals]
    return {"method": label, "preferred_rate": statistics.mean(rates),
            "preferred_rate_sd": statistics.stdev(rates) if len(rates) > 1 else 0.0,
            "kl_from_reference": statistics.mean(e["kl_from_reference"] for e in evals),
            "heldout_pref_accuracy": statistics.mean(a["heldout_pref_accuracy"] for a in aligns) if aligns else None,
            "per_seed_preferred_rate": rates}


if __name__ == "__main__":
    main()
