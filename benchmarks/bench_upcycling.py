"""Upcycling scaling law at small scale (Liew et al., ICML 2025): a D1 x D2 grid of upcycled MoEs, the law fitted
with and without the D1·D2 interaction, and upcycling against MoE and dense trained from scratch.

    python benchmarks/bench_upcycling.py [--scale 1.0] [--workers 2]

A dense Llama (width 128, 4 layers, FFN 384, 4 heads / 2 KV heads, tied embeddings, a 2048-token BPE trained on the
corpus) pre-trained on the standard-library corpus at a constant rate after a 50-step warmup, batch 32 x 128, with
checkpoints at D1 in {0.25, 0.5, 1, 2, 4}M tokens and continued to 8M (the dense baseline). Each D1 checkpoint is
upcycled to 8 experts top-2 (``train --method upcycle``, its logits checked against the dense model's, the data order
continued past D1, a 10-step warmup to the same peak rate) and trained at constant rate with checkpoints at 0.9 D2 for
D2 in {0.25, 0.5, 1, 2}M; every point is measured after a cooldown branched at 0.9 of its phase that ends at the
point (linear decay to 0 over the last 10%), on one fixed held-out set of 128 windows. The same MoE from scratch
(to 4M) and the dense series get the same cooldowns. ``analyze --method upcycling-law`` then fits the 15 points below
the largest D2, predicts that column, and gives intervals, a power check for alpha3 = 0.03 and the budget guidance
(dense phase sunk, as the paper's Figure 1 frames it, and charged); the power check is repeated at the run-to-run
noise measured by redrawing the router (seed 1) at D1 = 0.25M and 4M for the first two D2 points, and the MoE from
scratch gets its own rate: a sweep of 1e-3 to 8e-3 to 1M tokens, its series at the best (4e-3; the dense and
upcycled runs keep 2e-3, untuned, which favours the baseline). ``--scale``
multiplies every token budget (0.05 for a quick check). Finished runs are kept in ``--work`` under their spec's
digest, so an interrupted run resumes. Writes benchmarks/results/upcycling.json and .md.

Not a comparison: a law fitted over a D1 x D2 grid of checkpoint series is a study, not arms judged on paired items;
``llmx compare upcycling`` covers one cell of it (the model in hand upcycled against the same MoE from scratch at
equal D2 tokens, paired per perplexity window).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, cached, child, machine, markdown, narrow_llama, run_pipeline, write  # noqa: E402

SEQ, BATCH, LR, WARMUP, EVAL = 128, 32, 2e-3, 50, 128
UP_WARMUP = 10  # the upcycled phase re-warms from trained weights: 10 steps, so a 61-step D2 point is not all warmup
TPS = SEQ * BATCH
D1S = [250_000, 500_000, 1_000_000, 2_000_000, 4_000_000]
D2S = [250_000, 500_000, 1_000_000, 2_000_000]
SCRATCH_MOE = [250_000, 500_000, 1_000_000, 2_000_000, 4_000_000]
DENSE = [*D1S, 8_000_000]
EXPERTS, TOP_K = 8, 2
SCRATCH_LRS, SCRATCH_LR_POINTS = [1e-3, 2e-3, 4e-3, 8e-3], [250_000, 1_000_000]
SCRATCH_LR = 4e-3  # the MoE from scratch's own rate: the best of SCRATCH_LRS at 1M tokens in a first sweep


def initial(folder: Path) -> str:
    """The dense Llama's folder (a BPE trained on the corpus' train split; weights drawn by ``init: scratch``)."""
    from llmx.core.data import documents
    from llmx.core.tokenizer import train_bpe

    if (folder / "config.json").is_file():
        return str(folder)
    return narrow_llama(folder, train_bpe(documents("stdlib", "train"), 2048), layers=4, seq_len=SEQ)


def steps(tokens: float) -> int:
    return max(1, round(tokens / TPS))


def branch(t: int) -> int:
    """The cooldown's branch point: 0.9 of the phase, on a step, at least one step before its end."""
    return min(steps(0.9 * t), steps(t) - 1) * TPS


def lm(method: str = "lm", **extra) -> dict:
    return {"method": method, "params": {"data": "stdlib", "seq_len": SEQ, "batch_size": BATCH, "lr": LR,
                                         "warmup": WARMUP, "schedule": "constant", "weight_decay": 0.1,
                                         "eval_every": None, "eval_windows": EVAL, "save": False, **extra}}


class Bench:
    def __init__(self, work: Path, scale: float):
        self.work, self.scale = work, scale
        self.model = initial(work / "init")

    def t(self, tokens: int) -> int:
        return steps(tokens * self.scale) * TPS

    def run(self, name: str, model: str, stage: dict) -> dict:
        folder = self.work / name
        return cached(__file__, folder / "result", {"model": model, "out": str(folder / "runs"), "seed": 0,
                                                    "stages": [stage]})[0]

    def series(self, name: str, model: str, stage: dict, points: list[int],
               sources: list[int] = ()) -> tuple[dict, list[dict]]:
        """A constant-rate run saving at 0.9 T of each point (and at each of ``sources``, the checkpoints to upcycle),
        then each point's cooldown: (run, one row a point)."""
        at = [self.t(p) for p in points]
        saves = {branch(t) for t in at} | {self.t(s) for s in sources}
        stage["params"].update(steps=max(saves) // TPS, save_at_tokens=sorted(saves))
        out = self.run(name, model, stage)
        manifest = Path(out["series"])
        saved = {e["tokens"]: e for e in json.loads(manifest.read_text())["checkpoints"]}
        rows = []
        for p, t in zip(points, at, strict=True):
            b = branch(t)
            cool = self.run(f"{name}_cool_{p}", model, lm(init="pretrained", cooldown_from=str(
                manifest.parent / saved[b]["path"]), cooldown_fraction=(t - b) / b, min_lr_ratio=0.0))
            rows.append({"point": p, "tokens": b + cool["cooldown_steps"] * TPS, "loss": cool["heldout_loss"]})
        return out, rows

    def dense(self) -> tuple[dict, list[dict]]:
        return self.series("dense", self.model, lm(init="scratch"), DENSE, sources=D1S)

    def moe_scratch(self) -> tuple[dict, list[dict]]:
        return self.series("moe_scratch", self.model, lm("upcycle", init="scratch", num_experts=EXPERTS,
                                                         top_k=TOP_K, lr=SCRATCH_LR), SCRATCH_MOE)

    def moe_scratch_lr(self, lr: float) -> list[dict]:
        """The MoE from scratch at another peak rate, to 1M tokens: its own tuning."""
        return self.series(f"moe_scratch_lr{lr:g}", self.model, lm("upcycle", init="scratch", num_experts=EXPERTS,
                                                                   top_k=TOP_K, lr=lr), SCRATCH_LR_POINTS)[1]

    def upcycled(self, dense_series: dict, d1: int, router_seed: int | None = None) -> tuple[dict, list[dict]]:
        """The upcycled series from D1; ``router_seed`` redraws the router on the same data (the first two D2
        points only: a seed-noise reading)."""
        manifest = Path(dense_series["series"])
        saved = {e["tokens"]: e for e in json.loads(manifest.read_text())["checkpoints"]}
        source = str(manifest.parent / saved[self.t(d1)]["path"])
        stage = lm("upcycle", init="pretrained", num_experts=EXPERTS, top_k=TOP_K, data_offset=self.t(d1),
                   warmup=UP_WARMUP)
        if router_seed is None:
            return self.series(f"upcycled_{d1}", source, stage, D2S)
        stage["params"]["router_seed"] = router_seed
        return self.series(f"upcycled_{d1}_router{router_seed}", source, stage, D2S[:2])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=float, default=1.0, help="Multiplies every token budget (0.05: a quick check).")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "llmx-bench-upcycling"))
    ap.add_argument("--bootstrap", type=int, default=200)
    ap.add_argument("--power-sims", type=int, default=100)
    ap.add_argument("--child")
    args = ap.parse_args()
    if args.child:
        return child(json.loads(args.child))
    work = Path(args.work) / f"scale_{args.scale:g}"
    work.mkdir(parents=True, exist_ok=True)
    bench = Bench(work, args.scale)
    with ThreadPoolExecutor(args.workers) as pool:
        dense_job, moe_job = pool.submit(bench.dense), pool.submit(bench.moe_scratch)
        dense_run, dense_rows = dense_job.result()
        up_jobs = {d1: pool.submit(bench.upcycled, dense_run, d1) for d1 in D1S}
        noise_jobs = {d1: pool.submit(bench.upcycled, dense_run, d1, 1) for d1 in (D1S[0], D1S[-1])}
        lr_jobs = {lr: pool.submit(bench.moe_scratch_lr, lr) for lr in SCRATCH_LRS}
        moe_run, moe_rows = moe_job.result()
        upcycled = {d1: job.result() for d1, job in up_jobs.items()}
        redrawn = {d1: job.result()[1] for d1, job in noise_jobs.items()}
        sweep = [{"lr": lr, "tokens": r["tokens"], "loss": r["loss"]} for lr, job in lr_jobs.items()
                 for r in job.result()]
    pairs = [{"D1": bench.t(d1), "D2": r["tokens"], "router_seed_0": a["loss"], "router_seed_1": r["loss"]}
             for d1, rows in redrawn.items() for a, r in zip(upcycled[d1][1], rows, strict=False)]
    seed_noise = float(np.sqrt(np.mean([np.log(x["router_seed_1"] / x["router_seed_0"]) ** 2 for x in pairs]) / 2))
    corpus = dense_run["train_tokens"]
    dense_n = upcycled[D1S[0]][0]["dense_params"]["active_params"]
    moe_n = upcycled[D1S[0]][0]["moe_params"]
    grid = [{"kind": "upcycled", "D1": bench.t(d1), "D2": r["tokens"], "loss": r["loss"],
             "active_params": moe_n["active_params"], "dense_params": dense_n} for d1 in D1S for r in upcycled[d1][1]]
    grid += [{"kind": "moe", "tokens": r["tokens"], "loss": r["loss"], "active_params": moe_n["active_params"]}
             for r in moe_rows]
    grid += [{"kind": "dense", "tokens": r["tokens"], "loss": r["loss"], "active_params": dense_n}
             for r in dense_rows]
    grid_path = work / "grid.jsonl"
    grid_path.write_text("".join(json.dumps(r) + "\n" for r in grid))
    variants = {"sunk": {}, "charged": {"sunk_dense": False}, "huber_auto": {"huber_scale": "auto"},
                "by_point": {"bootstrap_unit": "point"}, "seed_noise": {"power_noise": seed_noise}}
    law = {name: run_pipeline(bench.model, [{"method": "upcycling-law", "params": {
        "runs": str(grid_path), "bootstrap": args.bootstrap, "power_sims": args.power_sims, **extra}}],
        seed=0)[0] for name, extra in variants.items()}
    scratch_at = {r["point"]: r["loss"] for r in moe_rows}
    rows = []
    for d1 in D1S:
        identity = upcycled[d1][0]["identity_max_logit_error"]
        for p, r in zip(D2S, upcycled[d1][1], strict=True):
            rows.append({"D1": bench.t(d1), "D2": r["tokens"], "epochs": round((bench.t(d1) + r["tokens"]) / corpus, 3),
                         "upcycled": r["loss"], "moe_scratch_same_D2": scratch_at.get(p),
                         "gain_vs_scratch": scratch_at[p] - r["loss"] if p in scratch_at else None,
                         "dense_at_D1": next(x["loss"] for x in dense_rows if x["point"] == d1),
                         "identity_error": identity})
    payload = {"benchmark": "upcycling", "scale": args.scale, "corpus_tokens": corpus, "tokens_per_step": TPS,
               "lr": LR, "scratch_lr": SCRATCH_LR, "warmup": WARMUP, "experts": EXPERTS, "top_k": TOP_K,
               "aux_loss_coef": upcycled[D1S[0]][0]["aux_loss_coef"], "dense_params": upcycled[D1S[0]][0][
                   "dense_params"], "moe_params": moe_n, "grid": grid, "rows": rows,
               "dense": dense_rows, "moe_scratch": moe_rows, "law": law, "scratch_lr_sweep": sweep,
               "seed_pairs": pairs, "seed_noise_log_sd": seed_noise, "machine": machine()}
    name = "upcycling" if args.scale == 1 else f"upcycling_scale{args.scale:g}"
    write(name, payload)
    (RESULTS / f"{name}.md").write_text(report(payload) + "\n")
    print(report(payload))


def verdicts(m: dict) -> list[str]:
    """The paper's three claims, read off the measurements and the default fit."""
    law, rows = m["law"]["sunk"], m["rows"]
    first = [r for r in rows if r["D2"] == min(x["D2"] for x in rows)]
    ahead = sum(r["gain_vs_scratch"] > 0 for r in first)
    slopes = [r["measured_log_slope"] for r in law["per_d1"]]
    shrinking = all(b > a for a, b in zip(slopes, slopes[1:], strict=False))
    a3 = law["alpha3"]
    robust = {k: m["law"][k]["alpha3"] for k in ("huber_auto", "by_point")}
    seeded = m["law"]["seed_noise"]["power"]
    return [
        f"Upcycling ahead of the MoE from scratch at the smallest D2 (equal tokens and compute, dense phase sunk): "
        f"{ahead} of {len(first)} D1.",
        f"Measured log-log slope of loss in D2 per D1 {[round(x, 4) for x in slopes]}: "
        f"{'flattens at every step' if shrinking else 'not monotone'} as D1 grows.",
        f"alpha3 = {a3['estimate']:.4f}, {a3['interval_kind']} {[round(x, 4) for x in a3['interval']]} "
        f"(asymptotic {[round(x, 4) for x in a3['asymptotic_interval']]}): "
        f"{'excludes 0' if a3['excludes_zero'] else 'contains 0'}; huber auto {robust['huber_auto']['estimate']:.4f} "
        f"{[round(x, 4) for x in robust['huber_auto']['interval']]}, bootstrap over points "
        f"{[round(x, 4) for x in robust['by_point']['interval']]}.",
        f"Power to detect alpha3 = {law['power']['alpha3']}: {law['power']['power']:.2f} at the fit's residual "
        f"noise (log sd {law['power']['noise_log_sd']:.4f}; false positives at 0: "
        f"{law['power']['false_positive_rate']:.2f}), {seeded['power']:.2f} at the measured router-seed noise "
        f"(log sd {seeded['noise_log_sd']:.4f}, {len(m['seed_pairs'])} pairs; false positives "
        f"{seeded['false_positive_rate']:.2f}).",
        "MoE from scratch, peak rate swept (its own tuning): " + ", ".join(
            f"{t // 1000}k tokens: " + " / ".join(f"{r['lr']:g} -> {r['loss']:.3f}" for r in sorted(
                (x for x in m["scratch_lr_sweep"] if x["tokens"] == t), key=lambda x: x["lr"]))
            for t in sorted({x["tokens"] for x in m["scratch_lr_sweep"]})) + f"; its series uses {m['scratch_lr']:g}, "
        f"the dense and upcycled runs {m['lr']:g} (untuned).",
        f"Epochs over the {m['corpus_tokens']}-token corpus: up to {max(r['epochs'] for r in rows):.2f} for the "
        f"upcycled points (D1 + D2), {max(r['tokens'] for r in m['dense']) / m['corpus_tokens']:.2f} for the dense "
        f"series, {max(r['tokens'] for r in m['moe_scratch']) / m['corpus_tokens']:.2f} for the MoE from scratch: "
        "repetition grows with D1, so a positive alpha3 here is confounded with repeated data.",
    ]


def report(m: dict) -> str:
    law = m["law"]["sunk"]
    fits = law["fits"]
    text = "\n".join(f"- {v}" for v in verdicts(m)) + "\n\n"
    text += markdown(["D1", "D2", "epochs", "upcycled", "moe_scratch_same_D2", "gain_vs_scratch", "dense_at_D1",
                      "identity_error"], m["rows"])
    text += "\n\nRouter redrawn on the same data (seed noise):\n\n" + markdown(
        ["D1", "D2", "router_seed_0", "router_seed_1"], m["seed_pairs"])
    text += "\n\nScratch series (cooled):\n\n" + markdown(["series", "tokens", "loss"], [
        {"series": k, **r} for k in ("dense", "moe_scratch") for r in m[k]])
    consts = []
    for form, f in fits.items():
        for k, v in f["params"].items():
            boot = f.get("bootstrap", {}).get(k)
            consts.append({"form": form, "param": k, "value": v, "bootstrap_lo": boot and boot[0],
                           "bootstrap_hi": boot and boot[1], "asymptotic_lo": f["intervals"][k][0],
                           "asymptotic_hi": f["intervals"][k][1], "at_bound": k in f["at_bounds"]})
    text += f"\n\nLaw fitted on {law['fitted_rows']} points, token unit {law['token_unit']:g}:\n\n"
    text += markdown(["form", "param", "value", "bootstrap_lo", "bootstrap_hi", "asymptotic_lo", "asymptotic_hi",
                      "at_bound"], consts)
    text += "\n\n" + markdown(["form", "huber_scale", "log_rmse_fit", "log_rmse_heldout"], [
        {"form": k, **{c: f[c] for c in ("huber_scale", "log_rmse_fit", "log_rmse_heldout")}}
        for name in ("sunk", "huber_auto") for k, f in m["law"][name]["fits"].items()])
    text += "\n\nPer D1 (the law's effective D2 exponent, the measured slope):\n\n"
    text += markdown(["D1", "effective_alpha2", "measured_log_slope", "points"], law["per_d1"])
    text += "\n\nPer sunk D1, the D2 above which the MoE from scratch is ahead (Eq. 13 solved numerically):\n\n"
    text += markdown(["D1", "D2", "upcycling_ahead"], law["guidance"].get("crossover_d2_by_d1", []))
    for name in ("sunk", "charged"):
        g = m["law"][name]["guidance"]
        text += f"\n\nGuidance, sunk_dense {g['sunk_dense']}: crossovers {g.get('crossovers')}\n\n"
        text += markdown(["compute", "extrapolated", "upcycled", "moe", "dense"], [
            {"compute": b["compute"], "extrapolated": b["extrapolated"],
             **{k: b[k] and round(b[k]["loss"], 4) for k in ("upcycled", "moe", "dense") if k in b}}
            for b in g["budgets"]])
    return text


if __name__ == "__main__":
    main()
