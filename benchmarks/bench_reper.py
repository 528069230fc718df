"""RePer at toy scale: does reflective unlikelihood (RPL) teach a captioner to use a critic's feedback better than
SFT or DPO on the same dialogues?

    python benchmarks/bench_reper.py [--model ref:llava] [--base-steps 600] [--scenes 2500] [--steps 150]
                                     [--lr 2e-4] [--test 100] [--seeds 0 1 2] [--jobs 2]

A script, not a comparison: it trains the base captioner first (LLaVA stage 2), builds one dialogue set for every
arm, sweeps rates and alpha, and decodes with two critics (rule and noisy) and checks the issue's goals; RPL against
the base, SFT and DPO with the rule critic is ``llmx compare reper``.

One base policy: ``ref:llava`` after a brief LLaVA stage 2 on English captions of train scenes (so it still errs).
It writes the Visual Reflection Dataset once (``analyze --method reper``: 8 captions per scene at temperatures 0 to
1.4, the rule critic, gap 4). Every arm then trains from the base on those dialogues at the same steps, batch and
rate: SFT on all turns, SFT on the best caption only, alpha = 0 (sigma-weighted SFT), DPO on (worst, best) at the
rate and at a tenth of it (its own tuning), RPL (alpha = 8), RPL with ``ul_tokens: differing`` and RPL at alpha 2,
4, 10; 3 seeds for RPL and both SFTs, one for the rest; RPL, alpha = 0 and both SFTs also at a tenth and 5 times
the rate (one seed: each method's own tuning). Each model, and the base,
then runs the policy/critic loop for 3 turns on held-out test scenes (unseen handwriting), once with the rule critic
and once with a noisy one (noise 0.3); turn 1 is the single-turn baseline. Scored against ground truth: caption
precision, recall, F1, the hallucination rate (mentioned digits not in the image), digits mentioned per caption (a
caption that names nothing hallucinates nothing) and the noise-free rubric; the issue's goals are checked on the
means. Finished runs are kept in the temporary folder under their spec's digest. Writes
benchmarks/results/reper.json and .md (``--candidates corrupt``: dialogues of corrupted true captions instead,
reper_corrupt.json and .md).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, cached, child, markdown, publish  # noqa: E402

CRITICS = {"rule": 0.0, "noisy": 0.3}
BASELINES = ("base", "sft_all", "sft_best", "alpha0", "dpo", "dpo_lr10")
TUNED = {"sft_all": {"objective": "sft_all"}, "sft_best": {"objective": "sft_best"},  # each also at lr/10 and 5 lr
         "alpha0": {"objective": "rpl", "alpha": 0.0}, "rpl": {"objective": "rpl", "alpha": 8.0}}


def arms(seeds: list[int], lr: float) -> list[tuple[str, dict, list[int]]]:
    one = seeds[:1]
    return [("base", {}, one), ("sft_all", {"objective": "sft_all"}, seeds),
            ("sft_best", {"objective": "sft_best"}, seeds), ("alpha0", {"objective": "rpl", "alpha": 0.0}, one),
            ("dpo", {"objective": "dpo"}, one), ("dpo_lr10", {"objective": "dpo", "lr": lr / 10}, one),
            ("rpl", {"objective": "rpl", "alpha": 8.0}, seeds),
            ("rpl_differing", {"objective": "rpl", "ul_tokens": "differing"}, one),
            *((f"rpl_a{a}", {"objective": "rpl", "alpha": float(a)}, one) for a in (2, 4, 10)),
            *((f"{name}_lr{tag}", {**params, "lr": lr * scale}, one) for name, params in TUNED.items()
              for tag, scale in (("10", 0.1), ("x5", 5.0)))]


WORK = Path(tempfile.gettempdir()) / "llmx-bench-reper"  # finished runs, kept under their spec's digest


def run(model: str, stages: list[dict], seed: int) -> list[dict]:
    return cached(__file__, WORK / "result", {"model": model, "out": str(WORK / "runs"), "seed": seed,
                                              "stages": stages})


def decodes(args) -> list[dict]:
    return [{"method": "reper", "stage": "decode", "params": {"scenes": args.test, "max_trials": 3, "noise": noise}}
            for noise in CRITICS.values()]


def checks(summary: list[dict]) -> dict[str, bool]:
    """The issue's goals, on the means over seeds: with the rule critic RPL's F1 gain from turn 1 to 3 beats every
    baseline's, its turn-1 F1 is at least the base's, its turn-3 hallucination rate is the lowest while it still
    names at least 80% of the digits the base names (naming nothing hallucinates nothing); with the noisy critic its
    gain shrinks but stays positive."""
    at = {(r["arm"], r["critic"]): r for r in summary}
    rpl, noisy = at["rpl", "rule"], at["rpl", "noisy"]
    others = [at[b, "rule"] for b in BASELINES]
    return {"rpl_gain_beats_every_baseline": all(rpl["f1_gain"] > o["f1_gain"] for o in others),
            "rpl_turn1_f1_at_least_base": rpl["t1_f1"] >= at["base", "rule"]["t1_f1"],
            "rpl_turn3_hallucination_lowest": all(rpl["t3_hallucination"] < o["t3_hallucination"] for o in others),
            "rpl_turn3_names_as_much": rpl["t3_mentioned"] >= 0.8 * at["base", "rule"]["t1_mentioned"],
            "noisy_gain_smaller_same_sign": 0 < noisy["f1_gain"] < rpl["f1_gain"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="ref:llava")
    ap.add_argument("--base-steps", type=int, default=600, help="stage-2 steps of the base captioner (brief: it errs)")
    ap.add_argument("--scenes", type=int, default=2500, help="train scenes the dialogues are built from")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--test", type=int, default=100, help="held-out scenes per decode")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--candidates", default="policy", choices=("policy", "corrupt"), help="the dialogues' captions: "
                    "the base's own (the paper) or corrupted true captions (results/reper_corrupt.*)")
    ap.add_argument("--jobs", type=int, default=2, help="children at once (one thread each)")
    ap.add_argument("--child")
    args = ap.parse_args()
    if args.child:
        import json

        return child(json.loads(args.child))
    base = run(args.model, [{"method": "llava", "params": {
        "stage": 2, "steps": args.base_steps, "lr": 1e-3, "batch_size": 16, "eval_rows": 0,
        "scenes": {"count": 4000, "formats": {"caption": 1.0}}}}], 0)[0]
    source = {} if args.candidates == "policy" else {"candidates": args.candidates}
    built = run(base["model_dir"], [{"method": "reper", "stage": "analyze", "params": {"scenes": args.scenes, **source}}],
                0)[0]
    print({k: v for k, v in built.items() if k != "data"}, flush=True)
    jobs = []
    for name, params, seeds in arms(args.seeds, args.lr):
        train = [] if name == "base" else [{"method": "reper", "stage": "align", "params": {
            "data": built["data"], "steps": args.steps, "lr": args.lr, "batch_size": args.batch, "save": False,
            "warmup": max(1, args.steps // 20), **params}}]
        jobs += [(name, seed, train) for seed in seeds]
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda j: (j[0], j[1], run(base["model_dir"], j[2] + decodes(args), j[1])), jobs))
    rows = []
    for name, seed, metrics in results:
        trained = metrics[0] if name != "base" else {}
        for critic, m in zip(CRITICS, metrics[-2:], strict=True):
            row = {"arm": name, "seed": seed, "critic": critic}
            for t in (1, 2, 3):
                row.update({f"t{t}_{k}": round(m[f"turn{t}_{k}"], 4)
                            for k in ("f1", "precision", "recall", "hallucination", "mentioned", "rubric")})
            row["f1_gain"] = round(m["turn3_f1"] - m["turn1_f1"], 4)
            row["logp_first"] = round(trained["logp_first_after"] - trained["logp_first_before"], 3) if trained else None
            row["logp_last"] = round(trained["logp_last_after"] - trained["logp_last_before"], 3) if trained else None
            rows.append(row)
            print(row, flush=True)
    summary = []
    for name, _, _ in arms(args.seeds, args.lr):
        for critic in CRITICS:
            mine = [r for r in rows if r["arm"] == name and r["critic"] == critic]
            summary.append({"arm": name, "critic": critic, "seeds": len(mine), **{
                k: round(statistics.mean(r[k] for r in mine), 4) for k in (
                    "t1_f1", "t3_f1", "f1_gain", "t1_hallucination", "t3_hallucination", "t1_mentioned",
                    "t3_mentioned", "t1_rubric", "t3_rubric")},
                "f1_gain_min": min(r["f1_gain"] for r in mine), "f1_gain_max": max(r["f1_gain"] for r in mine)})
    goals = checks(summary)
    print(goals, flush=True)
    name = "reper" if args.candidates == "policy" else "reper_corrupt"
    publish(name, rows, model=args.model, base=base, dataset={k: v for k, v in built.items() if k != "data"},
            steps=args.steps, lr=args.lr, batch=args.batch, test_scenes=args.test, seeds=args.seeds,
            critics=CRITICS, candidates=args.candidates, summary=summary, goals=goals)
    table = markdown(list(summary[0]), summary)
    with (RESULTS / f"{name}.md").open("a") as f:
        f.write("\n" + table + "\n")
    print(table)


if __name__ == "__main__":
    main()
