"""Preference alignment at matched KL on the brackets task: every method's preferred rate against its KL from the
reference, next to the best any policy can reach at that KL.

    python benchmarks/bench_align.py [--model ref:llama] [--workers 2] [--eval-prompts 50] [--seed 0]

Data: the reference model's own samples on 400 training prompts of standard-library code (4 each), judged by a
program (the completed line has balanced brackets): paired rows, unpaired rows, and each prompt's first passing
sample (for SFT on the chosen responses). Every method trains from the same model with the same lr, batch and
data; its strength is swept (beta for DPO, IPO, SimPO, ConfPO and KTO; steps for PIPA, which has no strength knob in
its unpaired and M forms, and for SFT). Evaluation: 8 samples at temperature 1 on the same held-out prompts for
every model, the preferred rate with a 95% bootstrap interval over prompts, the Monte-Carlo KL from the reference on
those samples, and the paired difference from DPO (beta 0.1) on the same prompts.

The known truth: 32 samples per held-out prompt from the reference estimate each prompt's success probability p
(add-half smoothed); for a 0/1 reward the best rate at a mean KL is the KL-regularised optimum, which tilts every
prompt's p by one common 1/beta (``llmx.core.eval.stats.frontier_rate``). Each method's gap to that frontier at its
own KL is reported. The constant completion ")\n", which the program judge always prefers, is placed on the same
axes: its KL from the reference is the mean of -log p_ref(")\n" | prompt). Writes benchmarks/results/align.json,
align.md and align_frontier.png (+ .csv).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, machine, markdown, run_pipeline, write  # noqa: E402

DPO_REF = "DPO b=0.1"
CONFIGS = [  # (label, family, method, data kind, params)
    *[(f"DPO b={b}", "DPO", "dpo", "paired", {"beta": b}) for b in (0.03, 0.1, 0.3)],
    *[(f"IPO b={b}", "IPO", "ipo", "paired", {"beta": b}) for b in (0.1, 0.5)],
    *[(f"SimPO b={b}", "SimPO", "simpo", "paired", {"beta": b, "gamma": 0.5}) for b in (1.0, 2.5)],
    *[(f"ConfPO b={b}", "ConfPO", "confpo", "paired", {"base": "simpo", "beta": b, "gamma": 0.5}) for b in (1.0, 2.5)],
    *[(f"KTO b={b}", "KTO", "kto", "unpaired", {"beta": b}) for b in (0.1, 0.3)],
    ("PIPA-N conditional b=1 (= DPO b=1)", "PIPA-N conditional", "pipa", "paired",
     {"variant": "n", "pair_mode": "conditional", "beta": 1.0}),
    *[(f"PIPA-N independent {s} steps", "PIPA-N independent", "pipa", "paired",
       {"variant": "n", "pair_mode": "independent", "steps": s}) for s in (50, 100)],
    *[(f"PIPA-M {s} steps", "PIPA-M", "pipa", "paired", {"variant": "m", "steps": s}) for s in (50, 100)],
    ("PIPA-M unpaired", "PIPA-M unpaired", "pipa", "unpaired", {"variant": "m"}),
    ("PIPA-N unpaired", "PIPA-N unpaired", "pipa", "unpaired", {"variant": "n"}),
    *[(f"SFT on chosen {s} steps", "SFT", "sft", "chosen", {"steps": s}) for s in (50, 100)],
]


def evaluation(prompts: int, samples: int) -> dict:
    return {"method": "task", "stage": "eval",
            "params": {"task": "brackets", "limit": prompts, "samples": samples, "kl": samples > 1}}


def scores(folder: Path) -> list[float]:
    (rows,) = list(folder.glob("*/artifacts/*_task/rows.jsonl"))
    return [sum(r["scores"]) / len(r["scores"]) for r in map(json.loads, rows.open())]


def constant_policy(model: str, prompts: int, text: str = ")\n") -> dict:
    """Always answering ``text``: its preferred rate under the judge and its KL from the reference (the KL of a point
    mass is minus the log-probability the reference gives it)."""
    from llmx.core import models
    from llmx.core.eval.score import continuation_logprobs
    from llmx.core.eval.tasks import rows
    from llmx.core.plugins import host
    from llmx.plugins.tasks.brackets import judge

    ref, tok = models.load(model, dtype="float32", device="cpu")
    held = rows(host().task("brackets"), "validation", 0, prompts)
    logps = continuation_logprobs(ref, tok, [(r["prompt"], text) for r in held])
    wins = [float(judge(r, text)) for r in held]
    return {"label": f"constant {text!r}", "family": "constant", "rate": sum(wins) / len(wins), "ci_low": min(wins),
            "ci_high": max(wins), "kl": -sum(s.logprob for s in logps) / len(logps), "kl_per_token": None,
            "per_prompt": wins}


def run_config(job: tuple) -> dict:
    (label, family, method, kind, params), model, data, args, out = job
    stage_name = "train" if method == "sft" else "align"
    train = {"method": method, "stage": stage_name,
             "params": {"data": str(Path(data) / f"train_{kind}.jsonl"), "steps": args["steps"], "lr": args["lr"],
                        "batch_size": 8, "save": False, **params}}
    if method != "sft":
        train["params"]["eval_data"] = str(Path(data) / f"validation_{'paired' if kind == 'chosen' else kind}.jsonl")
    t0 = time.perf_counter()
    folder = Path(out) / label.replace(" ", "_").replace("=", "").replace("(", "").replace(")", "")
    trained, ev = run_pipeline(model, [train, evaluation(args["eval_prompts"], 8)], output_dir=str(folder),
                               threads=1, seed=args["seed"])
    return {"label": label, "family": family, "rate": ev["score"], "ci_low": ev["score_ci_low"],
            "ci_high": ev["score_ci_high"], "kl": ev["kl_from_reference"], "kl_per_token": ev["kl_per_token"],
            "heldout_pref_accuracy": trained.get("heldout_pref_accuracy"), "per_prompt": scores(folder),
            "seconds": round(time.perf_counter() - t0, 1)}


def main() -> None:
    from llmx.core.eval import stats

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="ref:llama")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--prompts", type=int, default=400)
    ap.add_argument("--eval-prompts", type=int, default=50)
    ap.add_argument("--oracle-samples", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        built = run_pipeline(args.model, [{"method": "task", "stage": "analyze", "params": {
            "task": "brackets", "limit": {"train": args.prompts, "validation": 50}}}], output_dir=tmp, threads=1)[0]
        print(built, flush=True)
        oracle_dir = Path(tmp) / "oracle"
        run_pipeline(args.model, [evaluation(args.eval_prompts, args.oracle_samples)], output_dir=str(oracle_dir),
                     threads=1, seed=args.seed + 1)
        n = args.oracle_samples
        p = [(s * n + 0.5) / (n + 1) for s in scores(oracle_dir)]  # add-half smoothing: no prompt is certain
        ref_dir = Path(tmp) / "reference"
        ref = run_pipeline(args.model, [evaluation(args.eval_prompts, 8)], output_dir=str(ref_dir), threads=1,
                           seed=args.seed)[0]
        reference = {"label": "reference", "family": "reference", "rate": ref["score"], "ci_low": ref["score_ci_low"],
                     "ci_high": ref["score_ci_high"], "kl": 0.0, "kl_per_token": 0.0, "per_prompt": scores(ref_dir)}
        jobs = [(c, args.model, built["data_dir"], vars(args), tmp) for c in CONFIGS]
        with ProcessPoolExecutor(max_workers=args.workers) as pool:
            rows = []
            for row in pool.map(run_config, jobs):
                print({k: v for k, v in row.items() if k != "per_prompt"}, flush=True)
                rows.append(row)
    rows = [reference, *rows, constant_policy(args.model, args.eval_prompts)]
    dpo = next(r for r in rows if r["label"] == DPO_REF)["per_prompt"]
    for r in rows:
        r["frontier_at_kl"] = stats.frontier_rate(p, max(r["kl"], 0.0))
        r["gap_to_frontier"] = r["frontier_at_kl"] - r["rate"]
        d = stats.paired(dpo, r["per_prompt"], seed=args.seed)
        r.update({"diff_vs_dpo": d.diff, "diff_ci": f"[{d.low:.3f}, {d.high:.3f}]",
                  "rate_ci": f"[{r['ci_low']:.3f}, {r['ci_high']:.3f}]"})
    top = max(r["kl"] for r in rows) * 1.15 + 0.5
    curve = [(top * i / 60, stats.frontier_rate(p, top * i / 60)) for i in range(61)]
    write("align", {"benchmark": "align", "model": args.model, "seed": args.seed, "steps": args.steps, "lr": args.lr,
                    "data": built, "oracle_p": p, "frontier": curve, "machine": machine(),
                    "rows": [{k: v for k, v in r.items()} for r in rows]})
    columns = ["label", "rate", "rate_ci", "kl", "frontier_at_kl", "gap_to_frontier", "diff_vs_dpo", "diff_ci",
               "heldout_pref_accuracy"]
    table = markdown(columns, rows)
    (RESULTS / "align.md").write_text(table + "\n")
    plot(rows, curve)
    print(table)


def plot(rows: list[dict], curve: list[tuple[float, float]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5))
    ax.plot([k for k, _ in curve], [r for _, r in curve], "k--", label="best reachable (KL-regularised optimum)")
    families = list(dict.fromkeys(r["family"] for r in rows))
    for i, fam in enumerate(families):
        mine = sorted((r for r in rows if r["family"] == fam), key=lambda r: r["kl"])
        ax.errorbar([r["kl"] for r in mine], [r["rate"] for r in mine],
                    yerr=[[r["rate"] - r["ci_low"] for r in mine], [r["ci_high"] - r["rate"] for r in mine]],
                    fmt="o-", capsize=3, color=plt.cm.tab20(i % 20), label=fam)
    ax.set_xlabel("KL from the reference (nats per completion)")
    ax.set_ylabel("preferred rate on held-out prompts (95% CI)")
    ax.set_xlim(left=-0.2, right=max(r["kl"] for r in rows) * 1.15 + 0.5)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(RESULTS / "align_frontier.png", dpi=120)
    (RESULTS / "align_frontier.csv").write_text("label,family,kl,rate,ci_low,ci_high,frontier_at_kl\n" + "".join(
        f"{r['label']},{r['family']},{r['kl']:.4f},{r['rate']:.4f},{r['ci_low']:.4f},{r['ci_high']:.4f},"
        f"{r['frontier_at_kl']:.4f}\n" for r in rows))


if __name__ == "__main__":
    main()
