"""FoPE against RoPE, clip-only, Fourier-only and ALiBi at small scale: length generalisation from scratch.

    python benchmarks/bench_fope.py [--steps 500] [--workers 2] [--model ref:llama-bench]

Every variant is the ``small`` preset's Llama (width 256, 4 layers, 4 heads of 64, 2 KV heads, ref:llama-bench's
2048-token BPE) trained from scratch by ``train --method fope`` on the standard-library corpus at train_len T = 64,
batch 32 (the preset's 2048 tokens per step) for 500 steps (its token budget), lr 2e-3 with 50 warmup steps, cosine
to 0.1x, weight decay 0.1; the same data order per seed. RoPE, FoPE (sigma 0.3) and clip-only (sigma 0) with 3
seeds; Fourier-only (no floor clip) and ALiBi with 1. Then ``eval --method length`` on 16 held-out windows of 512:
perplexity at 64/128/256/512, loss per position bucket, the degradation (bucket [4T, 8T) minus [0, T)) and the copy
probe at distances 32..256; RoPE + YaRN (factor 8, training-free) on every RoPE seed; and one 64 -> 128 extension
(50 more steps at T = 128, batch 16) for RoPE and FoPE, evaluated at 128..1024. Two runs in parallel, one thread
each; finished runs are kept in ``--work`` under their spec's digest, so an interrupted run
resumes. Writes benchmarks/results/fope.json
and .md.

Not a comparison: ``llmx compare fope`` runs the from-scratch arms (FoPE against RoPE and ALiBi, the two ablations
drawn) paired per 8T window; this script adds RoPE + YaRN (another evaluation for one arm), the 64 -> 128 extension
(arms continuing from another arm's saved model) and the per-bucket and copy-probe tables."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cached, child, machine, markdown, spread, verdict, write  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
T = 64
VARIANTS = {"rope": ({"position": "rope"}, 3), "fope": ({"position": "fope"}, 3),
            "clip-only": ({"position": "fope", "sigma": 0.0}, 3),
            "fourier-only": ({"position": "fope", "floor_clip": False}, 1), "alibi": ({"position": "alibi"}, 1)}
EVAL = {"method": "length", "stage": "eval", "params": {"windows": 16, "copy_samples": 16}}


def train(extra: dict, steps: int) -> dict:
    return {"method": "fope", "params": {"init": "scratch", "data": "stdlib", "train_len": T, "batch_size": 32,
                                         "steps": steps, "lr": 2e-3, "warmup": 50, "schedule": "cosine",
                                         "min_lr_ratio": 0.1, "weight_decay": 0.1, "eval_every": steps,
                                         "eval_windows": 32, **extra}}


def row(name: str, seed: int, trained: dict, m: dict) -> dict:
    r = {"variant": name, "seed": seed, "T": m["train_len"], "heldout_loss": trained.get("heldout_loss"),
         **{k: v for k, v in m.items() if k.startswith("ppl@")}, "degradation": m["degradation"]}
    r.update({f"bucket{k}": v for k, v in m["buckets"].items()})
    r.update({f"copy@{d}": v for d, v in m["copy_loss"].items()})
    return r


def summary(rows: list[dict]) -> list[dict]:
    """Mean and range over seeds per variant, and the verdicts the issue asks for."""
    out = []
    for name in dict.fromkeys(r["variant"] for r in rows):
        mine = [r for r in rows if r["variant"] == name]
        s = {"variant": name, "seeds": len(mine)}
        for key in [k for k in mine[0] if k.startswith(("ppl@", "degradation", "copy@"))]:
            s[key] = statistics.mean(r[key] for r in mine)
        s["degradation_range"] = f"{min(r['degradation'] for r in mine):.3f}..{max(r['degradation'] for r in mine):.3f}"
        out.append(s)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--model", default="ref:llama-bench", help="its config (shape) and tokenizer; weights redrawn")
    ap.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "llmx-bench-fope"),
                    help="finished runs are kept here; a rerun reuses them (delete it to start afresh)")
    ap.add_argument("--child")
    args = ap.parse_args()
    if args.child:
        return child(json.loads(args.child))
    jobs = [(name, seed) for name, (_, n) in VARIANTS.items() for seed in range(n)]
    work = Path(args.work)

    def one(job: tuple[str, int]) -> tuple[str, int, list[dict]]:
        name, seed = job
        folder = work / f"{name}_{seed}"
        trained = cached(__file__, folder / "train", {"model": args.model, "out": str(folder / "runs"), "seed": seed,
                                                 "stages": [train({**VARIANTS[name][0], "save": True}, args.steps)]})
        stages = [EVAL] + ([{**EVAL, "params": {**EVAL["params"], "yarn_factor": 8}}] if name == "rope" else [])
        evals = cached(__file__, folder / "eval", {"model": trained[0]["model_dir"], "out": str(folder / "runs"),
                                              "seed": seed, "stages": stages})
        print(f"{name} seed {seed}: degradation {evals[0]['degradation']:.3f}", flush=True)
        return name, seed, [trained[0], *evals]

    def extend(done: tuple[str, int, list[dict]]) -> dict:
        name, seed, out = done
        params = {**VARIANTS[name][0], "init": "continue", "data": "stdlib", "train_len": 2 * T, "batch_size": 16,
                  "steps": 50, "lr": 2e-4, "warmup": 5, "schedule": "cosine", "weight_decay": 0.1,
                  "eval_every": 50, "eval_windows": 16, "save": False}
        folder = work / f"{name}_ext"
        ext = cached(__file__, folder / "run", {"model": out[0]["model_dir"], "out": str(folder / "runs"), "seed": seed,
                                           "stages": [{"method": "fope", "params": params}, EVAL]})
        return row(f"{name} 64->128", seed, ext[0], ext[1])

    with ThreadPoolExecutor(args.workers) as pool:
        results = list(pool.map(one, jobs))
        extended = list(pool.map(extend, [r for r in results if r[0] in ("rope", "fope") and r[1] == 0]))
    rows = [row(name, seed, out[0], out[1]) for name, seed, out in results]
    rows += [row("rope + yarn x8", seed, out[0], out[2]) for name, seed, out in results if name == "rope"]
    table = summary(rows)
    deg = {name: [r["degradation"] for r in rows if r["variant"] == name] for name in ("rope", "fope", "clip-only")}
    far = f"copy@{4 * T}"
    verdicts = {
        "fope_over_rope_degradation": statistics.mean(deg["fope"]) / statistics.mean(deg["rope"]),
        "goal_below_0.6": statistics.mean(deg["rope"]) > 0
        and statistics.mean(deg["fope"]) < 0.6 * statistics.mean(deg["rope"]),
        "degradation fope vs rope": verdict(deg["fope"], deg["rope"], ("fope", "rope")),
        "degradation fope vs clip-only": verdict(deg["fope"], deg["clip-only"], ("fope", "clip-only")),
        f"{far} fope vs rope": verdict([r[far] for r in rows if r["variant"] == "fope"],
                                      [r[far] for r in rows if r["variant"] == "rope"], ("fope", "rope")),
        "in-domain cost ppl@64 fope - rope": statistics.mean(r["ppl@64"] for r in rows if r["variant"] == "fope")
        - statistics.mean(r["ppl@64"] for r in rows if r["variant"] == "rope"),
        "degradation spread": {k: spread(v) for k, v in deg.items()},
    }
    payload = {"benchmark": "fope", "train": train({}, args.steps)["params"], "eval": EVAL["params"],
               "model": args.model, "verdicts": verdicts, "summary": table, "extension": extended,
               "machine": machine(), "rows": rows}
    write("fope", payload)
    cols = ["variant", "seeds", "ppl@64", "ppl@128", "ppl@256", "ppl@512", "degradation", "degradation_range",
            *[f"copy@{d}" for d in (T // 2, T, 2 * T, 4 * T)]]
    text = markdown(cols, table) + "\n\nPer run (bucket losses at 512):\n\n"
    text += markdown(["variant", "seed", "heldout_loss", "bucket[0,64)", "bucket[64,128)", "bucket[128,256)",
                      "bucket[256,511)", "degradation"], rows)
    text += "\n\n64 -> 128 extension (50 steps at T = 128), evaluated at 128..1024:\n\n"
    text += markdown(["variant", "ppl@128", "ppl@256", "ppl@512", "ppl@1024", "degradation",
                      *[f"copy@{d}" for d in (64, 128, 256, 512)]], extended)
    text += "\n\nVerdicts:\n\n" + "\n".join(f"- {k}: {v}" for k, v in verdicts.items() if k != "degradation spread")
    (ROOT / "benchmarks" / "results" / "fope.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
