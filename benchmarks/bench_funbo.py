"""FunBO against the general-purpose AFs, out of and in distribution, with the offline ``mutate`` sampler.

    python benchmarks/bench_funbo.py [--seeds 0 1 2] [--budget 160] [--workers 2]

1. OOD-Bench (notes §2.3): search on 1-D Ackley, Levy, Schwefel, validate on 1-D Rosenbrock, test on 9 functions x
   50 seeded scale/shift instances. Per search seed: the AF found (sampler ``mutate``, so labelled: not an LLM) and
   ``mutate`` on the seed alone (every prompt shows EI only, no database: the machinery's share), both at the same
   budget and chosen the same way (top 20% by training score, then validation).
2. ID: Michalewicz-2D, search on 5 instances, validate on 5, test on 60 new ones.
3. Rows: the found AFs, seed-only, EI, UCB (beta 1), PI, posterior mean, random search (once per seed) and the OOD
   AF the notes recall (unverified). Normalised simple regret at T = 30 (mean, median), FunBO's score, paired wins /
   losses against EI with a two-sided Wilcoxon p.
4. A BoTorch re-check of the OOD AFs and EI in a standard loop (random start, GP refitted every trial) on a
   subset; ``hf``'s valid-program rate with ``ref:llama-test`` as the sampler.

Writes benchmarks/results/funbo.json and .md.

Not a comparison: ``llmx compare funbo`` runs part 1's FunBO arm against EI, UCB, PI, MEAN and random search on the
OOD test set, paired per problem; this script adds the seed-only ablation (a search whose sampler sees EI alone,
set up in Python), the in-distribution setting, the OOD AF the notes recall, the BoTorch re-check and the hf
sampler's valid-program rate."""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, machine, markdown, write  # noqa: E402

from llmx.plugins.funbo import afs, bo, sandbox  # noqa: E402
from llmx.plugins.funbo import prompt as P  # noqa: E402
from llmx.plugins.funbo.config import SUITES  # noqa: E402
from llmx.plugins.funbo.database import Database  # noqa: E402
from llmx.plugins.funbo.method import names, paired  # noqa: E402
from llmx.plugins.funbo.program import key  # noqa: E402
from llmx.plugins.funbo.samplers import MutateSampler  # noqa: E402
from llmx.plugins.funbo.search import Search, choose  # noqa: E402

PROTOCOL = {"trials": 30, "beta": 1.0, "time_term": "optimum"}
LIMITS = sandbox.Limits(timeout_s=30)
BASELINES = ("ei", "ucb", "pi", "mean", "random", "ood-paper")


def settings(ood_instances: int, id_test: int) -> dict:
    return {
        "ood": {"train": names(SUITES["ood-train"]), "validation": names(SUITES["ood-validation"]),
                "test": names(SUITES["ood-test"], ood_instances, 1000)},
        "id-michalewicz": {"train": names("michalewicz-2d", 5, 0), "validation": names("michalewicz-2d", 5, 5),
                           "test": names("michalewicz-2d", id_test, 100)},
    }


class SeedOnly:
    """``mutate`` on the seed alone: each prompt shows EI twice (as many programs as the search's prompts, so
    crossover is drawn as often, with EI itself), whatever the database holds."""

    def __init__(self, seed: int):
        self.inner = MutateSampler(seed)

    def sample(self, prompt: str, n: int) -> list[str]:
        return self.inner.sample(P.build([afs.SOURCES["ei"]] * 2), n)


def search(setting: dict, seed: int, budget: int, workers: int, seed_only: bool) -> dict:
    specs = [bo.spec(n) for n in setting["train"]]
    outcome = sandbox.evaluate(afs.SOURCES["ei"], specs, limits=LIMITS, **PROTOCOL)
    db = Database(islands=4, functions_per_prompt=2, seed=seed)
    db.register(afs.SOURCES["ei"], outcome.scores)
    sampler = SeedOnly(seed) if seed_only else MutateSampler(seed)
    s = Search(db, sampler, specs, PROTOCOL, LIMITS, workers=workers, reset_period=10)
    s.seen[key(afs.SOURCES["ei"])] = outcome
    start = time.time()
    while s.tally.sampled < budget:
        s.step(min(4, budget - s.tally.sampled))
    val = [bo.spec(n) for n in setting["validation"]]
    pool = s.evaluated(afs.SOURCES["ei"])
    best, best_val, rows = choose(pool, 0.2, val, PROTOCOL, LIMITS, workers)
    return {"source": best.source, "train_score": best.score, "validation_score": best_val,
            "best_train_score": pool[0].score, "seed_train_score": db.reduced(outcome.scores),
            "candidates": s.tally.sampled, "valid": s.tally.valid, "duplicates": s.tally.duplicates,
            "resets": s.tally.resets, "seconds": round(time.time() - start, 1)}


def test(source: str | None, problems: list[str], seed: int = 0) -> list[dict]:
    specs = [bo.spec(n) for n in problems]
    if source is None:
        rows = []
        for i, s in enumerate(specs):
            problem = bo.Problem.build(s)
            best = bo.run(problem, bo.random_policy(7919 * seed + i), PROTOCOL["trials"], PROTOCOL["beta"])
            rows.append({"score": bo.score(best, problem), "regret": bo.regret(best, problem)})
        return rows
    out = sandbox.evaluate(source, specs, limits=sandbox.Limits(timeout_s=5 * len(specs)), **PROTOCOL)
    if not out.ok:
        raise RuntimeError(out.reason)
    return [{"score": s, "regret": c} for s, c in zip(out.scores, out.curves, strict=True)]


def summary(label: str, rows: list[dict], ei: list[dict]) -> dict:
    final = np.array([r["regret"][-1] for r in rows])
    out = {"af": label, "mean_regret": float(final.mean()), "median_regret": float(np.median(final)),
           "score": float(np.mean([r["score"] for r in rows])),
           "curve": [float(v) for v in np.mean([r["regret"] for r in rows], axis=0)]}
    return out | (paired(rows, ei) if rows is not ei else {})


def botorch_recheck(sources: dict[str, str], problems: list[str], trials: int) -> dict:
    from llmx.plugins.funbo import botorch_check as B

    out = {}
    for label, src in {**sources, "ei": afs.SOURCES["ei"]}.items():
        finals = [B.standard(src, bo.spec(n), trials, 1.0, seed=i)[-1] for i, n in enumerate(problems)]
        out[label] = {"mean_regret": float(np.mean(finals)), "median_regret": float(np.median(finals)),
                      "finals": finals}
    return out


def hf_rate(prompts: int = 2, per_prompt: int = 12) -> dict:
    from llmx.core import models
    from llmx.plugins.funbo.program import ProgramError
    from llmx.plugins.funbo.samplers import HFSampler

    model, tok = models.load("ref:llama-test")
    sampler = HFSampler(model, tok, 96, 1.0, 0)
    specs = [bo.spec(n) for n in names(SUITES["ood-train"])]
    valid = parsed = total = 0
    for i in range(prompts):
        text = P.build([afs.SOURCES["pi"], afs.SOURCES["ei"]][: i % 2 + 1])
        for completion in sampler.sample(text, per_prompt):
            total += 1
            try:
                program = P.to_program(completion, i % 2 + 1)
            except ProgramError:
                continue
            parsed += 1
            valid += sandbox.evaluate(program, specs, limits=LIMITS, **PROTOCOL).ok
    return {"model": "ref:llama-test", "completions": total, "parsed": parsed, "valid": valid,
            "valid_rate": valid / total}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--budget", type=int, default=160, help="candidates per search")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--instances", type=int, default=50, help="OOD test instances per function")
    ap.add_argument("--id-test", type=int, default=60, help="ID test instances")
    args = ap.parse_args()
    started = time.time()
    results: dict = {"machine": machine(), "protocol": PROTOCOL, "budget": args.budget, "seeds": args.seeds,
                     "sampler": MutateSampler.label, "settings": {}}
    for name, setting in settings(args.instances, args.id_test).items():
        searches = {f"{kind} seed {s}": search(setting, s, args.budget, args.workers, kind == "seed-only")
                    for kind in ("funbo", "seed-only") for s in args.seeds}
        afs_to_test = {label: (r["source"], 0) for label, r in searches.items()} | {
            b: (afs.load(b), 0) for b in BASELINES if b != "random"} | {f"random seed {s}": (None, s) for s in args.seeds}
        with ThreadPoolExecutor(args.workers) as pool:
            jobs = [pool.submit(test, src, setting["test"], seed) for src, seed in afs_to_test.values()]
            tested = dict(zip(afs_to_test, (j.result() for j in jobs), strict=True))
        rows = [summary(label, r, tested["ei"]) for label, r in tested.items()]
        results["settings"][name] = {"searches": searches, "rows": rows, "test_problems": len(setting["test"])}
        print(name, markdown(["af", "mean_regret", "median_regret", "wins", "losses", "wilcoxon_p"], rows), flush=True)
    subset = names("branin,hartmann-3,styblinski-tang-2d", 4, 2000)
    ood = results["settings"]["ood"]["searches"]
    results["botorch_recheck"] = {"problems": subset, "trials": 20, "afs": botorch_recheck(
        {f"funbo seed {s}": ood[f"funbo seed {s}"]["source"] for s in args.seeds}, subset, 20)}
    results["hf"] = hf_rate()
    results["seconds"] = round(time.time() - started, 1)
    write("funbo", results)
    md = [f"# FunBO (sampler: {MutateSampler.label})", "",
          f"Budget {args.budget} candidates per search, seeds {args.seeds}, T = 30, 4 islands, reset every 10 prompts."]
    for name, r in results["settings"].items():
        md += ["", f"## {name} ({r['test_problems']} test problems)", "",
               markdown(["af", "train_score", "validation_score", "best_train_score", "seed_train_score", "valid",
                         "seconds"], [{"af": k, **v} for k, v in r["searches"].items()]), "",
               markdown(["af", "mean_regret", "median_regret", "score", "wins", "losses", "ties", "wilcoxon_p"],
                        r["rows"])]
    b = results["botorch_recheck"]
    md += ["", "## BoTorch re-check (standard loop, GP refit, random start, T = 20)", "",
           markdown(["af", "mean_regret", "median_regret"], [{"af": k, **v} for k, v in b["afs"].items()]),
           "", f"hf sampler ({results['hf']['model']}): {results['hf']['valid']} valid of "
           f"{results['hf']['completions']} completions ({results['hf']['parsed']} parsed)"]
    (RESULTS / "funbo.md").write_text("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
