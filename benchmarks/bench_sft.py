"""SFT of a trained reference model on a generated task: full fine-tuning against LoRA (r 8 and 16, PEFT).

    python benchmarks/bench_sft.py [--model ref:llama] [--steps 200] [--seeds 0 1 2]

The task: three Python-expression completions the reference model (trained on standard-library code) has never
been taught: ``"word".upper() ==`` -> ``"WORD"``, ``sorted([..]) ==`` -> the sorted list, ``len("..") ==`` -> the
length; 2000 training rows, 200 held-out, loss on the completion only. Each configuration gets the same steps and
batch and its own learning rate (a sweep on seed 0, best held-out loss, extended upward while the best is the
largest tried), then runs on every seed. Each run is its
own process, so its peak RSS is its own. Reported: trainable parameters, optimiser bytes (measured on the AdamW
state), peak RSS, seconds per step, held-out completion loss (mean and min-max over seeds).
Writes benchmarks/results/sft_<model>.json and .md.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, markdown, write  # noqa: E402

WORDS = ("value", "result", "name", "path", "index", "count", "buffer", "token", "module", "header", "parser",
         "config", "socket", "thread", "record", "stream", "format", "object", "number", "string", "window", "cursor")
CONFIGS = {"full": {"adapter": "none", "lrs": [1e-4, 3e-4, 1e-3]},
           "lora-r8": {"adapter": "lora", "r": 8, "lrs": [1e-3, 3e-3, 1e-2]},
           "lora-r16": {"adapter": "lora", "r": 16, "lrs": [1e-3, 3e-3, 1e-2]}}


def task_rows(n: int, seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        kind = i % 3
        if kind == 0:
            w = rng.choice(WORDS) + rng.choice(["", "_" + rng.choice(WORDS)])
            rows.append({"prompt": f'"{w}".upper() ==', "completion": f' "{w.upper()}"'})
        elif kind == 1:
            xs = [rng.randint(0, 9) for _ in range(rng.randint(3, 6))]
            rows.append({"prompt": f"sorted({xs}) ==", "completion": f" {sorted(xs)}"})
        else:
            w = rng.choice(WORDS)[: rng.randint(2, 6)]
            rows.append({"prompt": f'len("{w}") ==', "completion": f" {len(w)}"})
    return rows


def child(spec: dict) -> None:
    """One run in this process: print its metrics and peak RSS as JSON. PEFT is imported by every run, so library
    overhead is the same in each and the RSS differences are the training's."""
    import resource

    import peft  # noqa: F401
    from common import run_pipeline

    params = {"data": spec["train"], "eval_data": spec["eval"], "steps": spec["steps"], "batch_size": 16,
              "warmup": spec["steps"] // 10, "lr": spec["lr"], "max_length": 64, "max_prompt_length": 32,
              "adapter": spec["adapter"], "save": False}
    if spec["adapter"] == "lora":
        params["lora"] = {"r": spec["r"], "alpha": 2 * spec["r"], "target_modules": "all-linear"}
    m = run_pipeline(spec["model"], [{"method": "sft", "params": params}], threads=1, seed=spec["seed"])[0]
    m["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(m))


def run(spec: dict) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True,
                         env={"OMP_NUM_THREADS": "1", **__import__("os").environ})
    if out.returncode:
        raise SystemExit(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="ref:llama")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--child")
    args = ap.parse_args()
    if args.child:
        return child(json.loads(args.child))
    with tempfile.TemporaryDirectory() as tmp:
        train, held = Path(tmp) / "train.jsonl", Path(tmp) / "eval.jsonl"
        train.write_text("".join(json.dumps(r) + "\n" for r in task_rows(2000, 0)))
        held.write_text("".join(json.dumps(r) + "\n" for r in task_rows(200, 1)))
        base = {"model": args.model, "train": str(train), "eval": str(held), "steps": args.steps}
        rows, sweeps = [], {}
        for name, cfg in CONFIGS.items():
            spec = {**base, "adapter": cfg["adapter"], "r": cfg.get("r")}
            sweep = {lr: run({**spec, "lr": lr, "seed": args.seeds[0]}) for lr in cfg["lrs"]}
            while max(sweep) == min(sweep, key=lambda k: sweep[k]["heldout_loss"]):  # best at the edge: go further
                lr = 3 * max(sweep)
                sweep[lr] = run({**spec, "lr": lr, "seed": args.seeds[0]})
            sweeps[name] = {str(lr): m["heldout_loss"] for lr, m in sweep.items()}
            lr = min(sweep, key=lambda k: sweep[k]["heldout_loss"])
            runs = [sweep[lr]] + [run({**spec, "lr": lr, "seed": s}) for s in args.seeds[1:]]
            losses = [m["heldout_loss"] for m in runs]
            first = runs[0]
            rows.append({"config": name, "lr": lr, "trainable_params": first["trainable_params"],
                         "optimizer_mb": first["optimizer_bytes"] / 2**20,
                         "peak_rss_mb": statistics.median(m["peak_rss_mb"] for m in runs),
                         "s_per_step": statistics.median(m["train_seconds"] / m["steps"] for m in runs),
                         "heldout_before": first["heldout_loss_before"], "heldout_after": statistics.mean(losses),
                         "after_min": min(losses), "after_max": max(losses)})
            print(rows[-1], flush=True)
    columns = ["config", "lr", "trainable_params", "optimizer_mb", "peak_rss_mb", "s_per_step", "heldout_before",
               "heldout_after", "after_min", "after_max"]
    table = markdown(columns, rows)
    slug = args.model.replace(":", "_")
    write(f"sft_{slug}", {"model": args.model, "steps": args.steps, "batch_size": 16, "seeds": args.seeds,
                          "machine": machine(), "lr_sweeps": sweeps, "rows": rows})
    (Path(__file__).parent / "results" / f"sft_{slug}.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
