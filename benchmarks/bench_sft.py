"""SFT of a trained reference model on a generated task: full fine-tuning against LoRA (r 8 and 16, PEFT).

    python benchmarks/bench_sft.py [--model ref:llama] [--steps 200] [--seeds 0 1 2]

The task: three Python-expression completions the reference model (trained on standard-library code) has never
been taught: ``"name".upper() ==`` -> ``"NAME"``, ``sorted([..]) ==`` -> the sorted list, ``len("..") ==`` -> the
length; 2000 training rows, and two disjoint sets of 200 (no prompt shared with any other set): validation, on which
each configuration's learning rate is chosen (a sweep on seed 0, extended past either end while the best is at it),
and test, on which every reported loss is measured (a fresh run per seed at the chosen rate). Every configuration
gets the same steps, batch and warmup; the loss is on the completion only. Each run is its own process, so its
memory is its own (PEFT is imported in every run, so library overhead is equal). Reported: trainable parameters,
optimiser bytes (measured on the AdamW state), peak RSS and the resident set while training (sampled), seconds per
step, test completion loss (mean and min-max
over seeds). Writes benchmarks/results/sft_<model>.json and .md.

Script only: its figures are memory and time per configuration (optimiser bytes, resident set, seconds per step)
beside the loss, and its rows are generated before the runs (a comparison run cannot hand a generated file to the
``sft`` stage); ``llmx compare lift`` covers sparse fine-tuning against dense fine-tuning of the same weights.
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


def task_row(rng: random.Random) -> dict[str, str]:
    kind = rng.randrange(3)
    if kind == 0:
        w = "_".join(rng.choice(WORDS) for _ in range(rng.randint(1, 2))) + rng.choice(["", str(rng.randint(0, 9))])
        return {"prompt": f'"{w}".upper() ==', "completion": f' "{w.upper()}"'}
    if kind == 1:
        xs = [rng.randint(0, 9) for _ in range(rng.randint(3, 6))]
        return {"prompt": f"sorted({xs}) ==", "completion": f" {sorted(xs)}"}
    w = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
    return {"prompt": f'len("{w}") ==', "completion": f" {len(w)}"}


def task_sets(sizes: dict[str, int], seed: int = 0) -> dict[str, list[dict[str, str]]]:
    """Disjoint sets of rows: no prompt appears in two sets (or twice in one)."""
    rng, seen, out = random.Random(seed), set(), {}
    for name, n in sizes.items():
        rows = []
        while len(rows) < n:
            row = task_row(rng)
            if row["prompt"] not in seen:
                seen.add(row["prompt"])
                rows.append(row)
        out[name] = rows
    return out


def child(spec: dict) -> None:
    """One run in this process: print its metrics and memory as JSON. PEFT is imported by every run, so library
    overhead is the same in each. A thread samples the resident set every 10 ms: ``train_rss_mb`` is the median of
    the samples in the last half of the run (training dominates it), ``peak_rss_mb`` the process's peak."""
    import resource
    import threading
    import time

    import peft  # noqa: F401
    import psutil
    from common import run_pipeline

    samples, done = [], threading.Event()

    def sample() -> None:
        me = psutil.Process()
        while not done.is_set():
            samples.append(me.memory_info().rss)
            time.sleep(0.01)

    threading.Thread(target=sample, daemon=True).start()
    params = {"data": spec["train"], "eval_data": spec["eval"], "steps": spec["steps"], "batch_size": 16,
              "warmup": spec["steps"] // 10, "lr": spec["lr"], "max_length": 64, "max_prompt_length": 32,
              "adapter": spec["adapter"], "save": False}
    if spec["adapter"] == "lora":
        params["lora"] = {"r": spec["r"], "alpha": 2 * spec["r"], "target_modules": "all-linear"}
    m = run_pipeline(spec["model"], [{"method": "sft", "params": params}], threads=1, seed=spec["seed"])[0]
    done.set()
    m["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    m["train_rss_mb"] = statistics.median(samples[len(samples) // 2:]) / 2**20
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
        files = {}
        for name, rows_ in task_sets({"train": 2000, "validation": 200, "test": 200}).items():
            files[name] = Path(tmp) / f"{name}.jsonl"
            files[name].write_text("".join(json.dumps(r) + "\n" for r in rows_))
        base = {"model": args.model, "train": str(files["train"]), "steps": args.steps}
        rows, sweeps = [], {}
        for name, cfg in CONFIGS.items():
            spec = {**base, "adapter": cfg["adapter"], "r": cfg.get("r")}
            tune = {**spec, "eval": str(files["validation"]), "seed": args.seeds[0]}
            sweep = {lr: run({**tune, "lr": lr})["heldout_loss"] for lr in cfg["lrs"]}
            while (best := min(sweep, key=sweep.get)) in (min(sweep), max(sweep)) and len(sweep) < 7:  # go past an end
                lr = best * 3 if best == max(sweep) else best / 3
                sweep[lr] = run({**tune, "lr": lr})["heldout_loss"]
            sweeps[name] = {f"{lr:g}": loss for lr, loss in sorted(sweep.items())}
            runs = [run({**spec, "eval": str(files["test"]), "lr": best, "seed": s}) for s in args.seeds]
            losses = [m["heldout_loss"] for m in runs]
            first = runs[0]
            rows.append({"config": name, "lr": best, "trainable_params": first["trainable_params"],
                         "optimizer_mb": first["optimizer_bytes"] / 2**20,
                         "peak_rss_mb": statistics.median(m["peak_rss_mb"] for m in runs),
                         "train_rss_mb": statistics.median(m["train_rss_mb"] for m in runs),
                         "s_per_step": statistics.median(m["train_seconds"] / m["steps"] for m in runs),
                         "test_before": first["heldout_loss_before"], "test_after": statistics.mean(losses),
                         "after_min": min(losses), "after_max": max(losses)})
            print(rows[-1], flush=True)
    columns = ["config", "lr", "trainable_params", "optimizer_mb", "peak_rss_mb", "train_rss_mb", "s_per_step", "test_before",
               "test_after", "after_min", "after_max"]
    table = markdown(columns, rows)
    slug = args.model.replace(":", "_")
    write(f"sft_{slug}", {"model": args.model, "steps": args.steps, "batch_size": 16, "seeds": args.seeds,
                          "machine": machine(), "lr_sweeps_validation_loss": sweeps, "rows": rows})
    (Path(__file__).parent / "results" / f"sft_{slug}.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
