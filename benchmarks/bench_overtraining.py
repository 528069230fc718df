"""Catastrophic overtraining at small scale: sensitivity and forgetting over a doubling checkpoint series.

    python benchmarks/bench_overtraining.py [--max-tokens 16000000] [--workers 2]

A narrow Llama (width 128, 3 layers, tied embeddings; about 0.9M parameters with ref:llama-bench's 2048-token BPE)
pre-trained from scratch on the standard-library corpus at a constant rate after a 50-step warmup, batch 32 x 128
tokens, with checkpoints at doubling budgets T from 0.25M tokens to ``--max-tokens``; and, budget-matched, a cooldown
(linear decay to 0) branched at 0.9 T that ends at T, to separate budget from annealing. The study (``analyze --method
overtraining``): L_pre on 64 held-out stdlib windows, S(T, gamma) for gamma in 0.5..4 (K = 4 draws, sigma = the init
std 0.02 on the matrices), and every checkpoint fine-tuned for 100 steps (batch 8 x 128) on the pydoc prose and on
Tiny Shakespeare (../shared/data) at three rates, 2 seeds, on both series. The verdict per curve: the Spearman
correlation with T and the last-to-first ratio. Writes benchmarks/results/overtraining.json and .md.

Not a comparison: the sensitivity curves S(T, gamma), the turning points and the trends over a doubling series are an
analysis of one run's checkpoints, not arms judged on paired items; ``llmx compare overtraining`` covers one pair (a
1x and a 4x pre-training budget, fine-tuned identically, paired per held-out pre-training window).
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
from common import machine, markdown, narrow_llama, run_pipeline, write  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHAKESPEARE = ROOT.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"
SEQ, BATCH, LR, WARMUP = 128, 32, 2e-3, 50
GAMMAS, LRS, SEEDS = [0.5, 1.0, 2.0, 4.0], [3e-4, 1e-3, 3e-3], [0, 1]


def initial(folder: Path, tokenizer_from: str) -> str:
    """The narrow Llama's folder (its weights are redrawn by init: scratch)."""
    from llmx.core import models

    return narrow_llama(folder, models.load(tokenizer_from)[1], layers=3, seq_len=SEQ)


def budgets(top: int) -> list[int]:
    out, t = [], 250_000
    while t <= top:
        out.append(t)
        t *= 2
    return out


def branches(at: list[int]) -> list[int]:
    """The cooldown branch points: 0.9 T, on a step boundary."""
    return [round(0.9 * t / (SEQ * BATCH)) * SEQ * BATCH for t in at]


def spearman(xs: list[float], ys: list[float]) -> float:
    def ranks(v):
        order = sorted(range(len(v)), key=v.__getitem__)
        out = [0.0] * len(v)
        for r, i in enumerate(order):
            out[i] = float(r)
        return out

    a, b = ranks(xs), ranks(ys)
    return statistics.correlation(a, b) if len(xs) > 2 else float("nan")


def verdict(name: str, m: dict) -> list[dict]:
    """Does S grow with T (per gamma), and forgetting (per rate, mean of seeds)? Spearman rho and last / first."""
    ts = [c["T"] for c in m["checkpoints"]]
    out = []
    for g in GAMMAS:
        s = [next(x["S"] for x in m["sensitivity"] if x["T"] == t and x["gamma"] == g) for t in ts]
        out.append({"study": name, "curve": "S", "gamma": g, "rho_T": spearman(ts, s),
                    "last_over_first": s[-1] / s[0] if s[0] else float("nan")})
    for lr in LRS:
        f = [statistics.fmean(x["forgetting"] for x in m["finetune"] if x["T"] == t and x["lr"] == lr) for t in ts]
        out.append({"study": name, "curve": "forgetting", "lr": lr, "rho_T": spearman(ts, f),
                    "last_over_first": f[-1] / f[0] if f[0] else float("nan")})
    return out


def lm(extra: dict) -> dict:
    return {"method": "lm", "params": {"init": "scratch", "data": "stdlib", "seq_len": SEQ, "batch_size": BATCH,
                                       "lr": LR, "warmup": WARMUP, "schedule": "constant", "weight_decay": 0.1,
                                       "eval_every": 1000, "eval_windows": 32, **extra}}


def study(target: str, extra: dict | None = None) -> dict:
    return {"method": "overtraining", "params": {
        "eval_windows": 64, "gammas": GAMMAS, "draws": 4, **(extra or {}),
        "finetune": {"data": target, "lrs": LRS, "seeds": SEEDS, "steps": 100, "warmup": 10, "batch_size": 8,
                     "seq_len": SEQ, "eval_windows": 32}}}


def child(spec: dict) -> None:
    print(json.dumps(run_pipeline(spec["model"], spec["stages"], output_dir=spec["out"], threads=spec["threads"],
                                  seed=0)[-1], default=str))


def run(spec: dict) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": str(spec["threads"])})
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def rows_of(name: str, m: dict) -> list[dict]:
    """Per checkpoint: L_pre, S and the perturbed loss per gamma, and per rate the post-FT losses (mean of seeds)."""
    rows = []
    for c in m["checkpoints"]:
        r = {"series": name, "T": c["T"], "tok_per_param": c["tokens_per_param"], "epochs": c["epochs"],
             "lr_at_T": c["lr"], "annealed": c["annealed"], "L_pre": c["L_pre"]}
        for s in m["sensitivity"]:
            if s["T"] == c["T"]:
                r[f"S@{s['gamma']:g}"] = s["S"]
                r[f"S_sd@{s['gamma']:g}"] = s["S_sd"]
                r[f"Lpert@{s['gamma']:g}"] = s["perturbed_loss"]
        for lr in LRS:
            mine = [f for f in m["finetune"] if f["T"] == c["T"] and f["lr"] == lr]
            r[f"forget@{lr:g}"] = sum(f["forgetting"] for f in mine) / len(mine)
            r[f"Lpre_ft@{lr:g}"] = sum(f["L_pre_after"] for f in mine) / len(mine)
            r[f"target@{lr:g}"] = sum(f["target"] for f in mine) / len(mine)
        rows.append(r)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-tokens", type=int, default=16_000_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--tokenizer-from", default="ref:llama-bench")
    ap.add_argument("--child")
    args = ap.parse_args()
    if args.child:
        return child(json.loads(args.child))
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = initial(tmp / "init", args.tokenizer_from)
        at = budgets(args.max_tokens)
        steps = -(-at[-1] // (SEQ * BATCH))
        pre = run({"model": model, "out": str(tmp / "pre"), "threads": args.workers,
                   "stages": [lm({"steps": steps, "save_at_tokens": sorted(set(at + branches(at)))})]})
        manifest = pre["series"]
        saved = {e["tokens"]: e for e in json.loads(Path(manifest).read_text())["checkpoints"]}
        folder = Path(manifest).parent
        print(f"series: {len(saved)} checkpoints, {pre['train_tokens']} corpus tokens", flush=True)

        def cooldown(t: int) -> dict:
            b = branches([t])[0]
            out = run({"model": model, "out": str(tmp / f"cool_{t}"), "threads": 1,
                       "stages": [lm({"init": "pretrained", "cooldown_from": str(folder / saved[b]["path"]),
                                      "cooldown_fraction": (t - b) / b, "min_lr_ratio": 0.0, "save": True})]})
            return {"path": out["model_dir"], "tokens": b + out["cooldown_steps"] * SEQ * BATCH, "lr": 0.0}

        constant = [{"path": str(folder / saved[t]["path"])} for t in at]
        with ThreadPoolExecutor(args.workers) as pool:
            cooled = list(pool.map(cooldown, at))
            listed = {"constant": {"checkpoints": constant},
                      "cooldown": {"checkpoints": cooled, "data": "stdlib", "seq_len": SEQ}}
            jobs = {f"{kind}/{target}": pool.submit(run, {"model": model, "out": str(tmp / f"{kind}_{target}"),
                                                          "threads": 1, "stages": [study(data, listed[kind])]})
                    for kind in ("constant", "cooldown")
                    for target, data in (("pydoc", "pydoc"), ("shakespeare", str(SHAKESPEARE)))}
            studies = {name: job.result() for name, job in jobs.items()}
    rows = [r for name, m in studies.items() for r in rows_of(name, m)]
    turning = {name: m["turning_points"] for name, m in studies.items()}
    verdicts = [v for name, m in studies.items() for v in verdict(name, m)]
    payload = {"benchmark": "overtraining", "params": studies["constant/pydoc"]["params"],
               "corpus_tokens": pre["train_tokens"], "tokens_per_step": pre["tokens_per_step"],
               "pretrain_heldout_loss": pre["heldout_loss"], "gammas": GAMMAS, "lrs": LRS, "seeds": SEEDS,
               "turning_points": turning, "verdicts": verdicts, "studies": studies, "machine": machine(), "rows": rows}
    write("overtraining", payload)
    cols = ["series", "T", "tok_per_param", "epochs", "annealed", "L_pre", *[f"S@{g:g}" for g in GAMMAS],
            f"S_sd@{GAMMAS[-1]:g}", f"Lpert@{GAMMAS[-1]:g}",
            *[f"forget@{lr:g}" for lr in LRS], *[f"Lpre_ft@{lr:g}" for lr in LRS], *[f"target@{lr:g}" for lr in LRS]]
    text = markdown(cols, rows) + "\n\nDoes it grow with T (Spearman rho over checkpoints, last / first):\n\n"
    text += markdown(["study", "curve", "gamma", "lr", "rho_T", "last_over_first"], verdicts)
    text += "\n\nTurning points T* (a rise past 2 standard errors over draws or seeds and 0.1% of the loss):\n\n"
    text += markdown(["study", "curve", "gamma", "lr", "status", "T_star", "rise", "rise_se", "T_star_each"],
                     [{"study": n, **t} for n, ts in turning.items() for t in ts])
    (ROOT / "benchmarks" / "results" / "overtraining.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
