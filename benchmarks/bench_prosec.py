"""ProSec at toy scale on ``ref:llama-bench``: the pipeline's counts, then the unaligned model against SafeCoder-style
tuning on SVEN and ProSec (SimPO, DPO, SimPO without utility pairs) on the model's own pairs.

    python benchmarks/bench_prosec.py [--model ref:llama-bench] [--seeds 0 1 2] [--scenarios 24] [--samples 12]
                                      [--sven ../shared/data/sven-train] [--work DIR] [--jobs 2]

A script, not a comparison: it first gives the model a habit of string-built SQL from half of SVEN (SafeCoder then
trains on the other half), shares one pair set per seed among the ProSec arms and runs them only when pairs came
out, and scores HumanEval and perplexity beside security; ProSec against SafeCoder on held-out scenarios is
``llmx compare prosec``.

Per seed: ``analyze --method prosec`` (CWEs 78, 89, 502, 338) writes the pairs; each arm trains from the same model
(SafeCoder: 150 steps of 8 at 1e-4; ProSec: 150 steps of 8 at 1e-5 on the pairs, when there are any) and is scored
by ``secure-code`` on held-out scenarios (vulnerable rate per CWE among completions that parse, the unparsed share,
inducing and benign), HumanEval (the canonical solutions' bits per byte; pass@1 is 0 at this scale) and stdlib
perplexity. Writes benchmarks/results/prosec.json and .md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cached, child, publish  # noqa: E402

CWES = [78, 89, 502, 338]


def evals(args) -> list[dict]:
    return [{"method": "secure-code", "params": {"cwes": CWES, "scenarios": args.held, "samples": args.held_samples}},
            {"method": "task", "params": {"task": "humaneval", "limit": 40, "max_new_tokens": 8}},
            {"method": "perplexity", "params": {"max_tokens": 20000}}]


def habits(args, work: Path) -> tuple[str, str]:
    """The unaligned model and SafeCoder's data. With ``--habit-rows N`` the model first learns string-built SQL
    from the vulnerable versions of SVEN's first N CWE-89 Python functions (``lm``, 200 steps), and SafeCoder trains
    on the other SVEN Python pairs, so the two never share a function."""
    if not args.habit_rows:
        return args.model, str(Path(args.sven).resolve())
    work.mkdir(parents=True, exist_ok=True)
    rest = work / "sven-rest"
    rest.mkdir(exist_ok=True)
    texts = []
    for f in sorted(Path(args.sven).glob("cwe-*.jsonl")):
        rows = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
        rows = [r for r in rows if r["file_name"].endswith(".py")]
        cut = args.habit_rows if f.name == "cwe-089.jsonl" else 0
        texts += [r["func_src_before"] for r in rows[:cut]]
        (rest / f.name).write_text("".join(json.dumps(r) + "\n" for r in rows[cut:]))
    data = work / "habit.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    spec = {"model": args.model, "seed": 0, "out": str(work / "runs"), "stages": [
        {"method": "lm", "params": {"data": str(data), "steps": 200, "batch_size": 8, "seq_len": 128, "lr": 3e-4,
                                    "save": True}}]}
    (made,) = cached(__file__, work / "cache", spec)
    return made["model_dir"], str(rest)


def arm(name: str, args, pairs: str | None, sven: str) -> list[dict]:
    train = {"steps": args.steps, "batch_size": 8, "save": False}
    if name == "unaligned":
        return evals(args)
    if name == "safecoder":
        return [{"method": "safecoder", "params": {**train, "data": sven, "lr": 1e-4}},
                *evals(args)]
    loss = {"prosec-simpo": "simpo", "prosec-dpo": "dpo", "prosec-no-utility": "simpo"}[name]
    data = pairs if name != "prosec-no-utility" else pairs.replace("pairs.jsonl", "security.jsonl")
    return [{"method": "prosec", "stage": "align", "params": {**train, "data": data, "loss": loss, "lr": 1e-5,
                                                                "max_len": 256}}, *evals(args)]


def row(name: str, seed: int, metrics: list[dict]) -> dict:
    sec, he, ppl = metrics[-3], metrics[-2], metrics[-1]
    out = {"arm": name, "seed": seed, "vulnerable": round(sec["inducing_vulnerable_rate"], 3),
           **{f"vuln_{c}": round(sec[f"inducing_vulnerable_rate_{c}"], 3) for c in CWES},
           "unparsed": round(sum(sec[f"inducing_unparsed_{c}"] for c in CWES) / len(CWES), 3),
           "benign_vulnerable": round(sec["benign_vulnerable_rate"], 3)}
    out.update({"humaneval_pass1": he["pass@1"], "humaneval_ref_bpb": round(he["reference_bpb"], 4),
                "stdlib_ppl": round(ppl["perplexity"], 2)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="ref:llama-bench")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--scenarios", type=int, default=24, help="scenarios per CWE (official 2,000)")
    ap.add_argument("--samples", type=int, default=12, help="completions per scenario (official 20)")
    ap.add_argument("--held", type=int, default=16, help="held-out scenarios per CWE")
    ap.add_argument("--held-samples", type=int, default=8)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--sven", default=str(Path(__file__).resolve().parents[2] / "shared" / "data" / "sven-train"))
    ap.add_argument("--habit-rows", type=int, default=92, help="CWE-89 functions whose vulnerable versions the "
                    "model learns first (0: the model as it is)")
    ap.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "llmx-bench-prosec"))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--child")
    args = ap.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    work = Path(args.work)
    base, sven = habits(args, work)
    rows, counts = [], []
    for seed in args.seeds:
        spec = {"model": base, "seed": seed, "out": str(work / "runs"), "stages": [
            {"method": "prosec", "stage": "analyze", "params": {"cwes": CWES, "scenarios": args.scenarios,
                                                                 "samples": args.samples}}]}
        (made,) = cached(__file__, work / "cache", spec)
        counts.append({"seed": seed, **{k: v for k, v in made.items() if k != "pairs_file"}})
        pairs = made["pairs_file"]
        arms = ["unaligned", "safecoder"] + (["prosec-simpo", "prosec-dpo", "prosec-no-utility"]
                                             if made["security_pairs"] >= 4 else [])

        def one(name, seed=seed, pairs=pairs):
            spec = {"model": base, "seed": seed, "out": str(work / "runs"), "stages": arm(name, args, pairs, sven)}
            return row(name, seed, cached(__file__, work / "cache", spec))

        with ThreadPoolExecutor(args.jobs) as pool:
            rows += list(pool.map(one, arms))
        for r in rows[-len(arms):]:
            print(r, flush=True)
    publish("prosec", rows, model=args.model, base=base, habit_rows=args.habit_rows, cwes=CWES,
            scenarios=args.scenarios, samples=args.samples,
            held=args.held, held_samples=args.held_samples, steps=args.steps, seeds=args.seeds, pipeline=counts)


if __name__ == "__main__":
    main()
