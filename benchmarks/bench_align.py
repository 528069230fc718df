"""Preference alignment at matched KL on the brackets task: every method's preferred rate against its KL from the
reference, next to the best any policy can reach at that KL.

    python benchmarks/bench_align.py [--model ref:llama] [--workers 2] [--eval-prompts 50] [--seed 0]

A script, not a comparison: it sweeps each method's strength and compares families at matched KL by interpolating
along those sweeps, against the oracle frontier and the constant policy, on one dataset shared by every run; the
equal-steps comparisons at each method's best strength are ``llmx compare align``, ``pipa``, ``pipa-unpaired`` and
``confpo``.

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
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, machine, markdown, run_pipeline, write  # noqa: E402

DPO_REF = "DPO b=0.1"
CONFIGS = [  # (label, family, method, data kind, params): strengths swept by beta, or by steps where none exists
    *[(f"DPO b={b}", "DPO", "dpo", "paired", {"beta": b}) for b in (0.03, 0.1, 0.3, 0.5, 1.0)],  # 0.5, 1: low KLs
    ("DPO b=0.1 25 steps", "DPO", "dpo", "paired", {"beta": 0.1, "steps": 25}),
    *[(f"IPO b={b}", "IPO", "ipo", "paired", {"beta": b}) for b in (0.1, 0.5)],
    # SimPO and ConfPO at the official gamma 1.6 (ConfPO's run_confpo.sh and SimPO's script alike), beta swept
    *[(f"SimPO b={b}", "SimPO", "simpo", "paired", {"beta": b, "gamma": 1.6}) for b in (1.5, 2.5)],
    ("SimPO b=2.5 25 steps", "SimPO", "simpo", "paired", {"beta": 2.5, "gamma": 1.6, "steps": 25}),
    *[(f"ConfPO b={b}", "ConfPO", "confpo", "paired", {"base": "simpo", "beta": b, "gamma": 1.6}) for b in (1.5, 2.5)],
    ("ConfPO b=2.5 25 steps", "ConfPO", "confpo", "paired", {"base": "simpo", "beta": 2.5, "gamma": 1.6, "steps": 25}),
    *[(f"KTO b={b}", "KTO", "kto", "unpaired", {"beta": b}) for b in (0.1, 0.3)],
    ("KTO b=0.1 25 steps", "KTO", "kto", "unpaired", {"beta": 0.1, "steps": 25}),
    ("PIPA-N conditional b=1 (= DPO b=1)", "PIPA-N conditional", "pipa", "paired",
     {"variant": "n", "pair_mode": "conditional", "beta": 1.0}),
    *[(f"PIPA-N independent {s} steps", "PIPA-N independent", "pipa", "paired",
       {"variant": "n", "pair_mode": "independent", "steps": s}) for s in (25, 50, 100)],
    *[(f"PIPA-M {s} steps", "PIPA-M", "pipa", "paired", {"variant": "m", "steps": s}) for s in (25, 50, 100)],
    *[(f"PIPA-M unpaired {s} steps", "PIPA-M unpaired", "pipa", "unpaired", {"variant": "m", "steps": s})
      for s in (50, 100)],
    *[(f"PIPA-N unpaired {s} steps", "PIPA-N unpaired", "pipa", "unpaired", {"variant": "n", "steps": s})
      for s in (50, 100)],
    *[(f"SFT on chosen {s} steps", "SFT", "sft", "chosen", {"steps": s}) for s in (25, 50, 100)],
]
MATCHED_KL = (0.25, 0.4, 1.0, 2.0, 3.0)  # nats per completion at which families are compared by interpolation


def evaluation(prompts: int, samples: int, kl: bool = True) -> dict:
    return {"method": "task", "stage": "eval",
            "params": {"task": "brackets", "limit": prompts, "samples": samples, "kl": kl}}


def per_prompt(folder: Path) -> tuple[list[float], list[float]]:
    """Each held-out prompt's preferred rate and KL (0 where none was measured) from the eval's rows."""
    (rows,) = list(folder.glob("*/artifacts/*_task/rows.jsonl"))
    records = [json.loads(line) for line in rows.open()]
    return [sum(r["scores"]) / len(r["scores"]) for r in records], [r.get("kl", 0.0) for r in records]


def constant_policy(model: str, prompts: int) -> dict:
    """Always answering ``)`` and then a newline, generated token by token: the ``)`` token after the prompt's own
    tokens, then any token that starts with a newline (which ends the line; the judge sees ``")\n"``). Its KL from
    the reference is minus the log-probability of that path under the reference; its preferred rate is the judge's."""
    import torch

    from llmx.core import models
    from llmx.core.eval.tasks import rows
    from llmx.core.plugins import host
    from llmx.plugins.tasks.brackets import judge

    ref, tok = models.load(model, dtype="float32", device="cpu")
    torch.set_grad_enabled(False)
    close = tok(")", add_special_tokens=False)["input_ids"]
    newline = [i for i in range(len(tok)) if tok.decode([i]).startswith("\n")]
    held = rows(host().task("brackets"), "validation", 0, prompts)
    kl = []
    for r in held:
        ids = torch.tensor([tok(r["prompt"])["input_ids"] + close])
        logp = torch.log_softmax(ref(input_ids=ids).logits[0].float(), dim=-1)
        path = sum(float(logp[ids.shape[1] - 1 - len(close) + k, t]) for k, t in enumerate(close))
        kl.append(-(path + float(torch.logsumexp(logp[-1, newline], dim=0))))
    wins = [float(judge(r, ")\n")) for r in held]
    return {"label": "constant ')\\n'", "family": "constant", "rate": sum(wins) / len(wins), "kl": sum(kl) / len(kl),
            "kl_per_token": None, "scores": wins, "kls": kl}


def run_config(job: tuple) -> dict:
    (label, family, method, kind, params), seed, model, data, args, out = job
    stage_name = "train" if method == "sft" else "align"
    train = {"method": method, "stage": stage_name,
             "params": {"data": str(Path(data) / f"train_{kind}.jsonl"), "steps": args["steps"], "lr": args["lr"],
                        "batch_size": 8, "save": False, **params}}
    if method != "sft":
        train["params"]["eval_data"] = str(Path(data) / f"validation_{'paired' if kind == 'chosen' else kind}.jsonl")
    t0 = time.perf_counter()
    folder = Path(out) / f"{label}-{seed}".replace(" ", "_").replace("=", "").replace("(", "").replace(")", "")
    try:
        trained, ev = run_pipeline(model, [train, evaluation(args["eval_prompts"], 8)], output_dir=str(folder),
                                   threads=1, seed=seed)
    except Exception as exc:  # noqa: BLE001 - one failed configuration is a row saying so, not a lost run
        return {"label": label, "family": family, "seed": seed, "error": f"{type(exc).__name__}: {exc}"}
    rates, kls = per_prompt(folder)
    return {"label": label, "family": family, "seed": seed, "rate": ev["score"], "ci_low": ev["score_ci_low"],
            "ci_high": ev["score_ci_high"], "kl": ev["kl_from_reference"], "kl_ci_low": ev["kl_ci_low"],
            "kl_ci_high": ev["kl_ci_high"], "kl_per_token": ev["kl_per_token"],
            "heldout_pref_accuracy": trained.get("heldout_pref_accuracy"), "scores": rates, "kls": kls,
            "seconds": round(time.perf_counter() - t0, 1)}


def interpolate(points: list[tuple[float, float]], kl: float) -> float | None:
    """The rate at ``kl`` on a family's piecewise-linear curve (its points sorted by KL), None outside its range."""
    points = sorted(points)
    for (k0, r0), (k1, r1) in zip(points, points[1:], strict=False):
        if k0 <= kl <= k1:
            return r0 if k1 == k0 else r0 + (r1 - r0) * (kl - k0) / (k1 - k0)
    return None


def matched(rows: list[dict], reference: dict, resamples: int = 1000, seed: int = 0) -> list[dict]:
    """Each family's rate at the MATCHED_KL values (its curve starts at the reference, KL 0) and its difference from
    DPO's there, averaged over the training seeds on which both have their whole sweep, with percentile intervals
    from resampling the seeds and then the prompts (one draw of prompts for every model and seed: the differences
    stay paired). Near the end of a family's range some resamples fall short of the KL; the interval is over the
    others, and ``coverage`` says how many that is (draws where both curves reach it). With few seeds the seed
    resample has few distinct draws, so each interval is widened to the t-interval on the per-seed values where that
    is wider (``stats.widened``, as ``llmx compare`` does)."""
    from llmx.core.eval import stats

    by: dict[str, dict[int, list[dict]]] = {}
    for r in rows:
        if "error" not in r and r["family"] not in ("reference", "constant"):
            by.setdefault(r["family"], {}).setdefault(r["seed"], []).append(r)
    sweep = {fam: {c[0] for c in CONFIGS if c[1] == fam} for fam in by}
    full = {fam: sorted(s for s, m in per.items() if {r["label"] for r in m} == sweep[fam]) for fam, per in by.items()}
    if not full.get("DPO"):
        return []
    n = len(reference["scores"])
    rng = random.Random(seed)

    def curve(members: list[dict], idx: list[int]) -> list[tuple[float, float]]:
        base = (0.0, sum(reference["scores"][i] for i in idx) / n)
        return [base] + [(sum(m["kls"][i] for i in idx) / n, sum(m["scores"][i] for i in idx) / n) for m in members]

    def at(fam: str, seeds: list[int], idx: list[int], kl: float) -> float | None:
        values = [interpolate(curve(by[fam][s], idx), kl) for s in seeds]
        return None if any(v is None for v in values) else sum(values) / len(values)

    out = []
    for fam in by:
        common = [s for s in full[fam] if s in full["DPO"]]
        if not common:  # no seed on which both sweeps are whole
            continue
        draws = [(common, list(range(n)))] + [([rng.choice(common) for _ in common], [rng.randrange(n) for _ in range(n)])
                                              for _ in range(resamples)]
        for kl in MATCHED_KL:
            values = [(at(fam, ss, idx, kl), at("DPO", ss, idx, kl)) for ss, idx in draws]
            if values[0][0] is None:
                continue
            covered = sum(v is not None and (d is not None or fam == "DPO") for v, d in values[1:]) / resamples
            rates = sorted(v for v, _ in values[1:] if v is not None)
            diffs = sorted(a - b for a, b in values[1:] if a is not None and b is not None)
            whole = list(range(n))
            per_seed = [(at(fam, [s], whole, kl), at("DPO", [s], whole, kl)) for s in common]
            _, low, high = stats.widened(values[0][0], rates[int(0.025 * len(rates))],
                                         rates[int(0.975 * len(rates)) - 1], [a for a, _ in per_seed if a is not None])
            row = {"family": fam, "kl": kl, "seeds": len(common), "rate": values[0][0], "coverage": covered,
                   "rate_ci": f"[{low:.3f}, {high:.3f}]"}
            if values[0][1] is not None and diffs and fam != "DPO":
                diff = values[0][0] - values[0][1]
                _, low, high = stats.widened(diff, diffs[int(0.025 * len(diffs))], diffs[int(0.975 * len(diffs)) - 1],
                                             [a - b for a, b in per_seed if a is not None and b is not None])
                row.update({"diff_vs_dpo": diff, "diff_ci": f"[{low:.3f}, {high:.3f}]"})
            out.append(row)
    return out


def main() -> None:

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="ref:llama")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--extra-seeds", type=int, nargs="*", default=[1, 2], help="Seeds every config is repeated on.")
    ap.add_argument("--resume", action="store_true", help="Keep align.json's finished (config, seed) rows (same "
                    "model, steps, lr and prompts) and run only the others.")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--prompts", type=int, default=400)
    ap.add_argument("--eval-prompts", type=int, default=50)
    ap.add_argument("--oracle-samples", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--reanalyze", action="store_true", help="Recompute the tables and the plot from align.json.")
    args = ap.parse_args()
    if args.reanalyze:
        saved = json.loads((RESULTS / "align.json").read_text())
        keep = {k: v for k, v in saved.items() if k not in ("rows", "frontier", "seeds", "matched_kl")}
        report(saved["rows"], saved["oracle_p"], keep, saved["seed"])
        return
    payload = {"benchmark": "align", "model": args.model, "seed": args.seed, "steps": args.steps, "lr": args.lr,
               "machine": machine()}
    with tempfile.TemporaryDirectory() as tmp:
        built = run_pipeline(args.model, [{"method": "task", "stage": "analyze", "params": {
            "task": "brackets", "limit": {"train": args.prompts, "validation": 50}}}], output_dir=tmp, threads=1)[0]
        print(built, flush=True)
        oracle_dir, ref_dir = Path(tmp) / "oracle", Path(tmp) / "reference"
        run_pipeline(args.model, [evaluation(args.eval_prompts, args.oracle_samples, kl=False)],
                     output_dir=str(oracle_dir), threads=1, seed=args.seed + 1)
        n = args.oracle_samples
        p = [(s * n + 0.5) / (n + 1) for s in per_prompt(oracle_dir)[0]]  # add-half smoothing: no prompt is certain
        ref = run_pipeline(args.model, [evaluation(args.eval_prompts, 8, kl=False)], output_dir=str(ref_dir),
                           threads=1, seed=args.seed)[0]
        reference = {"label": "reference", "family": "reference", "seed": args.seed, "rate": ref["score"],
                     "ci_low": ref["score_ci_low"], "ci_high": ref["score_ci_high"], "kl": 0.0, "kl_per_token": 0.0,
                     "scores": per_prompt(ref_dir)[0], "kls": [0.0] * args.eval_prompts}
        payload.update(data=built, data_digest=fingerprint(built), oracle_p=p)
        rows = [reference] + _finished(args, built, payload["data_digest"])
        done = {(r["label"], r["seed"]) for r in rows}
        jobs = [(c, seed, args.model, built["data_dir"], vars(args), tmp) for c in CONFIGS
                for seed in [args.seed, *args.extra_seeds] if (c[0], seed) not in done]
        with ProcessPoolExecutor(max_workers=args.workers) as pool:
            for row in pool.map(run_config, jobs):
                print({k: v for k, v in row.items() if k not in ("scores", "kls")}, flush=True)
                rows.append(row)
                write("align", {**payload, "rows": rows})  # what is done survives a later failure
    rows.append({**constant_policy(args.model, args.eval_prompts), "seed": args.seed})
    report(rows, p, payload, args.seed)


def fingerprint(built: dict) -> str:
    """A digest of the task's rows (every jsonl file the analyze stage wrote)."""
    import hashlib

    digest = hashlib.sha256()
    for f in sorted(Path(built["data_dir"]).glob("*.jsonl")):
        digest.update(f.name.encode() + f.read_bytes())
    return digest.hexdigest()[:16]


def _finished(args, built: dict, digest: str) -> list[dict]:
    """With --resume, align.json's rows of configs that finished under the same settings and data."""
    path = RESULTS / "align.json"
    if not args.resume or not path.is_file():
        return []
    saved = json.loads(path.read_text())
    same = all(saved.get(k) == getattr(args, k) for k in ("model", "seed", "steps", "lr"))
    counts = lambda d: {k: v for k, v in d.items() if k != "data_dir"}  # noqa: E731
    if not same or len(saved["oracle_p"]) != args.eval_prompts or counts(saved["data"]) != counts(built) \
            or saved.get("data_digest", digest) != digest:
        raise SystemExit("--resume: align.json was written with other settings; run without --resume")
    if "data_digest" not in saved:  # written before digests: the rows are trusted on the counts alone
        print("--resume: align.json has no data digest; its rows are kept on matching settings and counts", flush=True)
    return [r for r in saved["rows"] if "error" not in r and r["family"] not in ("reference", "constant")]


def report(rows: list[dict], p: list[float], payload: dict, seed: int) -> None:
    """Frontier gaps, differences from DPO, matched-KL comparisons and seed spreads; the tables and the plot."""
    from llmx.core.eval import stats

    done = [r for r in rows if "error" not in r]
    reference = next(r for r in done if r["family"] == "reference")
    dpo = {r["seed"]: r["scores"] for r in done if r["label"] == DPO_REF}
    for r in done:
        r["frontier_at_kl"] = stats.frontier_rate(p, max(r["kl"], 0.0))
        r["gap_to_frontier"] = r["frontier_at_kl"] - r["rate"]
        r["frontier_kl_for_rate"] = stats.frontier_kl(p, r["rate"])
        r["kl_efficiency"] = r["frontier_kl_for_rate"] / r["kl"] if r["kl"] > 0 else None
        d = stats.paired(dpo.get(r["seed"], dpo[seed]), r["scores"], seed=seed)  # the same seed's DPO
        r.update({"diff_vs_dpo_b0.1": d.diff, "diff_ci": f"[{d.low:.3f}, {d.high:.3f}]",
                  "rate_ci": f"[{r['ci_low']:.3f}, {r['ci_high']:.3f}]" if "ci_low" in r else "",
                  "kl_ci": f"[{r['kl_ci_low']:.2f}, {r['kl_ci_high']:.2f}]" if "kl_ci_low" in r else ""})
    seeds = seed_summary(done)
    at_kl = matched(done, reference, seed=seed)
    kl_top = max(r["kl"] for r in done if r["family"] != "constant")
    grid = [0.0] + [1e-3 * (kl_top * 1.2 / 1e-3) ** (i / 80) for i in range(81)]
    curve = [(k, stats.frontier_rate(p, k)) for k in grid]
    write("align", {**payload, "rows": rows, "frontier": curve, "seeds": seeds, "matched_kl": at_kl})
    main_rows = [r for r in done if r["seed"] == seed]
    table = "\n\n".join([
        markdown(["label", "rate", "rate_ci", "kl", "kl_ci", "frontier_at_kl", "frontier_kl_for_rate", "kl_efficiency",
                  "diff_vs_dpo_b0.1", "diff_ci", "heldout_pref_accuracy"], main_rows),
        markdown(["family", "kl", "seeds", "rate", "rate_ci", "diff_vs_dpo", "diff_ci", "coverage"], at_kl),
        markdown(["label", "seeds", "rate_mean", "rate_sd", "kl_mean", "kl_sd"], seeds)])
    (RESULTS / "align.md").write_text(table + "\n")
    plot(main_rows, curve, kl_top)
    print(table)


def seed_summary(rows: list[dict]) -> list[dict]:
    out = []
    for label in dict.fromkeys(r["label"] for r in rows):
        mine = [r for r in rows if r["label"] == label]
        if len(mine) > 1:
            rates, kls = [r["rate"] for r in mine], [r["kl"] for r in mine]
            out.append({"label": label, "seeds": len(mine), "rate_mean": statistics.mean(rates),
                        "rate_sd": statistics.stdev(rates), "kl_mean": statistics.mean(kls), "kl_sd": statistics.stdev(kls)})
    return out


def plot(rows: list[dict], curve: list[tuple[float, float]], kl_top: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5))
    ax.plot([k for k, _ in curve], [r for _, r in curve], "k--", label="best reachable (KL-regularised optimum)")
    families = [f for f in dict.fromkeys(r["family"] for r in rows) if f != "constant"]
    for i, fam in enumerate(families):
        mine = sorted((r for r in rows if r["family"] == fam), key=lambda r: r["kl"])
        ax.errorbar([r["kl"] for r in mine], [r["rate"] for r in mine],
                    yerr=[[r["rate"] - r["ci_low"] for r in mine], [r["ci_high"] - r["rate"] for r in mine]],
                    xerr=[[r["kl"] - r.get("kl_ci_low", r["kl"]) for r in mine],
                          [r.get("kl_ci_high", r["kl"]) - r["kl"] for r in mine]],
                    fmt="o-", capsize=2, lw=1, color=plt.cm.tab20(i % 20), label=fam)
    const = next((r for r in rows if r["family"] == "constant"), None)
    if const:
        ax.annotate(f"constant ')\\n': rate {const['rate']:.2f} at KL {const['kl']:.1f}", xy=(kl_top * 1.2, 1.0),
                    xytext=(kl_top * 0.55, 1.02), fontsize=8, arrowprops={"arrowstyle": "->"})
    ax.set_xlabel("KL from the reference (nats per completion, token level)")
    ax.set_ylabel("preferred rate on held-out prompts (95% CI)")
    ax.set_xlim(-0.1, kl_top * 1.2)
    ax.set_ylim(top=1.06)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(RESULTS / "align_frontier.png", dpi=120)
    (RESULTS / "align_frontier.csv").write_text("label,family,kl,rate,ci_low,ci_high,frontier_at_kl\n" + "".join(
        f"{r['label']},{r['family']},{r['kl']:.4f},{r['rate']:.4f},{r.get('ci_low', r['rate']):.4f},"
        f"{r.get('ci_high', r['rate']):.4f},{r['frontier_at_kl']:.4f}\n" for r in rows))


if __name__ == "__main__":
    main()
