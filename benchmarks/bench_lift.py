"""LIFT against Full FT, LoRA and magnitude / random sparse FT on the tracing task, in the paper's small-data regime.

    python benchmarks/bench_lift.py [--model ref:llama-bench] [--seeds 0 1 2] [--workers 2]

2,000 tracing programs (``analyze --method tracing``), 3 epochs at batch 16 (375 steps), linear decay after a 3%
warmup (the official schedule), loss on the answer only. Every sparse method trains ``r(m + n)`` entries of each
decoder linear weight with r = 8, LoRA's parameter count at rank 8 (PEFT, alpha 16, all linear layers: the official
LoRA ratio); Full FT trains everything. The supports refresh every 100 steps (the official 400 over MATH10K's 1,875
steps is about five refreshes a run; 100 gives three). Each method's rate is the best of three on 500 validation
programs (greedy exact match, then validation loss), then 3 seeds at that rate are scored on 500 test programs.
Source retention: the standard-library held-out NLL (16k tokens) and the brackets task's preferred rate (100
prompts, 2 samples at T 1); the sweep records the stdlib NLL too (accuracy against forgetting at every rate).
``random-static`` keeps its first random support (SHiRA's static mask).

Diagnostics: the overlap of the LIFT (f 8) and magnitude supports on the base weights, and the share of Full FT's
update energy (seed 0) that each support of the base weights holds, against the top-k of |delta W| itself (the
ceiling; the density is the share a blind support holds): whether principal weights exist at this scale.
Writes benchmarks/results/lift_<model>.json and .md.

Not a comparison: ``llmx compare lift`` runs LIFT against magnitude, random and dense sparse fine-tuning at the rates
picked here, paired per test program; this script adds what a comparison cannot: the per-arm learning-rate sweep on
the validation split, LoRA and Full FT through the ``sft`` stage (whose rows must be a file before the run starts; a
comparison run generates its tracing rows inside the ``lift`` stage), retention (a second metric) and the support
diagnostics.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, markdown, perplexity, write  # noqa: E402

RANK = 8
SPARSE_LRS = [3e-3, 1e-2, 3e-2]
METHODS = {
    "full": {"method": "sft", "params": {}, "lrs": [1e-4, 3e-4, 1e-3]},
    "lora": {"method": "sft", "params": {"adapter": "lora", "lora": {"r": RANK, "alpha": 2 * RANK,
                                                                     "target_modules": "all-linear"}},
             "lrs": [1e-3, 3e-3, 1e-2]},
    **{f"lift-f{f}": {"method": "lift", "params": {"filter_rank": f}, "lrs": SPARSE_LRS} for f in (4, 8, 32)},
    "magnitude": {"method": "lift", "params": {"mask": "magnitude"}, "lrs": SPARSE_LRS},
    "random": {"method": "lift", "params": {"mask": "random"}, "lrs": SPARSE_LRS},
    "random-static": {"method": "lift", "params": {"mask": "random", "update_interval": 0}, "lrs": SPARSE_LRS},
}
EPOCHS, BATCH, ROWS = 3, 16, 2000


def child(spec: dict) -> None:
    from common import run_pipeline

    cfg = METHODS.get(spec["name"])
    stages = []
    if cfg is not None:
        steps = EPOCHS * ROWS // BATCH
        params = {"data": spec["data"] + "/train.jsonl", "eval_data": spec["data"] + "/validation.jsonl",
                  "steps": steps, "batch_size": BATCH, "warmup": round(0.03 * steps), "schedule": "linear",
                  "min_lr_ratio": 0.0, "lr": spec["lr"], "max_length": 64, "max_prompt_length": 60,
                  "save": spec.get("save", False), **cfg["params"]}
        if cfg["method"] == "lift":
            params = {"rank": RANK, "update_interval": 100, **params}
        stages.append({"method": cfg["method"], "params": params})
    stages += [{"method": "tracing", "stage": "eval", "params": {
        "split": spec["split"], "limit": 500, "resamples": 200}}, perplexity()]
    if spec["split"] == "test":
        stages.append({"method": "task", "stage": "eval", "params": {
            "task": "brackets", "limit": 100, "samples": 2, "resamples": 200}})
    metrics = run_pipeline(spec["model"], stages, output_dir=spec.get("out"), threads=1, seed=spec["seed"])
    test = spec["split"] == "test"
    out = {"eval": metrics[-3 if test else -2], "nll": metrics[-2 if test else -1]["nll"]}
    if cfg is not None:
        out["train"] = metrics[0]
    if test:
        out["brackets"] = metrics[-1]["score"]
    print(json.dumps(out, default=str))


def run(spec: dict) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True,
                         env=env)
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def diagnostics(model: str, tuned: str) -> dict:
    """Support overlap and the share of Full FT's update each support of the base weights holds."""
    import torch

    from llmx.core import models
    from llmx.core.train import sparse
    from llmx.plugins.lift.method import linear_weights

    base, _ = models.load(model)
    after = dict(models.load(tuned)[0].named_parameters())
    kinds = {"lift-f4": ("lift", 4), "lift-f8": ("lift", 8), "lift-f32": ("lift", 32), "magnitude": ("magnitude", 0),
             "random": ("random", 0), "top_delta_ceiling": ("delta", 0)}
    held = {k: 0.0 for k in kinds}
    total, overlap, count = 0.0, 0.0, 0
    for i, (name, w) in enumerate(linear_weights(base).items()):
        delta = (after[name] - w).detach().reshape(-1)
        k = sparse.budget(*w.shape, RANK)
        supports = {key: sparse.top_k(delta.abs(), k) if kind == "delta" else
                    sparse.select(w, k, kind, f or 1, generator=torch.Generator().manual_seed(i))
                    for key, (kind, f) in kinds.items()}
        for key, index in supports.items():
            held[key] += float(delta[index].square().sum())
        total += float(delta.square().sum())
        overlap += len(set(supports["lift-f8"].tolist()) & set(supports["magnitude"].tolist())) / k
        count += 1
    return {"support_overlap_lift_f8_magnitude": overlap / count,
            "full_ft_update_share": {k: v / total for k, v in held.items()}}


def summary(name: str, lr: float, runs: list[dict]) -> dict:
    acc = [r["eval"]["score"] for r in runs]
    train = runs[0]["train"] if "train" in runs[0] else {}
    return {"method": name, "lr": lr, "test_exact_match": statistics.mean(acc), "em_min": min(acc), "em_max": max(acc),
            "stdlib_nll": statistics.mean(r["nll"] for r in runs), "brackets": statistics.mean(r["brackets"] for r in runs),
            "trainable_params": train.get("trainable_params"),
            "optimizer_mb": train["optimizer_bytes"] / 2**20 if train else None,
            "train_s": statistics.median(r["train"]["train_seconds"] for r in runs) if train else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="ref:llama-bench")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--only", nargs="+", choices=list(METHODS))
    ap.add_argument("--child")
    args = ap.parse_args()
    if args.child:
        return child(json.loads(args.child))
    from common import run_pipeline

    names = args.only or list(METHODS)
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.workers) as pool:
        data = run_pipeline("tiny:llama", [{"method": "tracing", "stage": "analyze", "params": {
            "train": ROWS, "validation": 500, "test": 500}}], output_dir=tmp)[0]["data_dir"]
        base = {"model": args.model, "data": data}
        jobs = {(n, lr): pool.submit(run, {**base, "name": n, "lr": lr, "split": "validation", "seed": args.seeds[0]})
                for n in names for lr in METHODS[n]["lrs"]}
        sweeps = {n: {lr: {**jobs[n, lr].result()["eval"], "nll": jobs[n, lr].result()["nll"]}
                      for lr in METHODS[n]["lrs"]} for n in names}
        best = {n: max(s, key=lambda lr: (s[lr]["score"], -s[lr]["reference_nll_per_token"])) for n, s in sweeps.items()}
        print({n: (lr, sweeps[n][lr]["score"]) for n, lr in best.items()}, flush=True)
        finals = {(n, s): pool.submit(run, {**base, "name": n, "lr": best[n], "split": "test", "seed": s,
                                            **({"save": True, "out": f"{tmp}/full"} if (n, s) == ("full", 0) else {})})
                  for n in names for s in args.seeds}
        finals[("base", 0)] = pool.submit(run, {**base, "name": "base", "lr": 0, "split": "test", "seed": 0})
        rows = [summary("base", 0, [finals["base", 0].result()])]
        rows += [summary(n, best[n], [finals[n, s].result() for s in args.seeds]) for n in names]
        full = finals.get(("full", args.seeds[0]))
        diag = diagnostics(args.model, full.result()["train"]["model_dir"]) if full else {}
    for r in rows:
        print(r, flush=True)
    columns = list(rows[1])
    table = markdown(columns, rows)
    slug = args.model.replace(":", "_")
    write(f"lift_{slug}", {"model": args.model, "rank": RANK, "epochs": EPOCHS, "rows_train": ROWS, "batch": BATCH,
                           "seeds": args.seeds, "machine": machine(), "diagnostics": diag,
                           "lr_sweeps_validation": {n: {f"{lr:g}": {"exact_match": e["score"],
                                                                   "loss": e["reference_nll_per_token"],
                                                                   "stdlib_nll": e["nll"]}
                                                        for lr, e in s.items()} for n, s in sweeps.items()},
                           "rows": rows})
    (Path(__file__).parent / "results" / f"lift_{slug}.md").write_text(
        table + "\n\n" + json.dumps(diag, indent=1) + "\n")
    print(table)
    print(json.dumps(diag, indent=1))


if __name__ == "__main__":
    main()
