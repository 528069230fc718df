"""Parrot's headline at toy scale: on English-centric stage-2 data, the language-conditioned MoE against the fair
ablation (LLaVA-style projector only, the same LLM, data, steps and rate).

    python benchmarks/bench_parrot.py [--model ref:llava] [--steps 300] [--lr 1e-3] [--seeds 0 1 2] [--count 100]
                                      [--mix imbalanced|english] [--work DIR] [--jobs 2]

From ``ref:llava`` (text model pre-trained in six languages, CLIP tower, stage-1 projector), each seed trains stage 2
twice on the same rows: ``llava`` (projector + LM) and ``parrot`` (fresh MoE + projector + LM, 6 experts,
intermediate = hidden, residual 0.1, soft mixing). The mix is the notes' 90% English + 2% each other language
(``imbalanced``) or English only. Each model then answers an MMMB-format set generated from held-out scenes (the
same questions and option order in six languages, Parrot's prompt and VLMEvalKit's letter extraction) and open
questions on held-out scenes (the reply parsed to the word it names). Reported per arm and seed: accuracy per
language, the non-English mean, and for Parrot the nearest-centroid language accuracy of its gates before and after
training. Child runs are cached in ``--work`` (a temporary folder by default). Writes
benchmarks/results/parrot_<mix>[_s<steps>].json and .md.

Not a comparison: ``llmx compare parrot`` runs the same three arms and stage 2 (imbalanced mix) paired per MMMB
question over all six languages; this script adds what a comparison cannot report: accuracy per language and the
non-English mean (the runner pairs one pooled metric), the open-question evaluation beside MMMB, the per-seed
training rows and the gates' routing accuracy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cached, child, publish, spread, verdict  # noqa: E402

LANGUAGES = ("en", "zh", "ru", "pt", "ar", "tr")
MIXES = {"imbalanced": {"en": 0.9, **{lang: 0.02 for lang in LANGUAGES[1:]}}, "english": {"en": 1.0}}


def stages(arm: str, args, seed: int) -> list[dict]:
    evals = [{"method": "mmmb", "params": {"count": args.count}},
             {"method": "scenes-vqa", "params": {"format": "open", "count": args.count}}]
    if arm == "stage1-only":
        return evals
    params = {"stage": 2, "steps": args.steps, "lr": args.lr, "batch_size": 16, "save": False, "eval_rows": 0,
              "scenes": {"count": args.rows, "languages": MIXES[args.mix], "seed": seed}}
    return [{"method": arm, "params": params}, *evals]


def row(arm: str, seed: int, metrics: list[dict]) -> dict:
    mmmb, open_ = metrics[-2], metrics[-1]
    out = {"arm": arm, "seed": seed}
    for name, m in (("mmmb", mmmb), ("open", open_)):
        for lang in LANGUAGES:
            out[f"{name}_{lang}"] = round(m[f"accuracy_{lang}"], 3)
        out[f"{name}_non_en"] = round(statistics.mean(m[f"accuracy_{lang}"] for lang in LANGUAGES[1:]), 3)
    out["mmmb_unanswered"] = round(mmmb["unanswered"], 3)
    if arm == "parrot":
        train = metrics[0]
        out["routing_acc_init"] = round(train["routing_language_accuracy_init"], 3)
        out["routing_acc"] = round(train["routing_language_accuracy"], 3)
        out["top_expert"] = train["routing_top_expert"]
    if arm != "stage1-only":
        out["train_s"] = round(metrics[0]["train_seconds"], 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="ref:llava")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=1e-3, help="stage-2 rate (Parrot's 2e-5 is for 7B; a 1.4M-parameter "
                    "model barely moves at it in 300 steps)")
    ap.add_argument("--rows", type=int, default=4000, help="stage-2 conversations per run")
    ap.add_argument("--count", type=int, default=100, help="held-out questions per language, each evaluation")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--mix", choices=sorted(MIXES), default="imbalanced")
    ap.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "llmx-bench-parrot"))
    ap.add_argument("--jobs", type=int, default=2, help="child runs at once (each on one thread)")
    ap.add_argument("--child")
    args = ap.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    work = Path(args.work)
    jobs = [(arm, seed) for arm in ("stage1-only", "llava", "parrot")
            for seed in (args.seeds[:1] if arm == "stage1-only" else args.seeds)]

    def one(job):
        arm, seed = job
        spec = {"model": args.model, "seed": seed, "stages": stages(arm, args, seed), "out": str(work / "runs")}
        return row(arm, seed, cached(__file__, work / "cache", spec))

    with ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(one, jobs))
    columns = dict.fromkeys(k for r in rows for k in r)
    rows = [{c: r.get(c) for c in columns} for r in rows]
    for r in rows:
        print(r, flush=True)
    summary = {}
    for metric in ("mmmb_en", "mmmb_non_en", "open_en", "open_non_en"):
        a = [r[metric] for r in rows if r["arm"] == "parrot"]
        b = [r[metric] for r in rows if r["arm"] == "llava"]
        summary[metric] = {"parrot": spread(a), "llava": spread(b),
                           "verdict": verdict(a, b, ("parrot", "llava"), lower_is_better=False)}
    name = f"parrot_{args.mix}" + (f"_s{args.steps}" if args.steps != 300 else "")
    publish(name, rows, model=args.model, steps=args.steps, lr=args.lr, rows_per_run=args.rows,
            mix=MIXES[args.mix], questions_per_language=args.count, seeds=args.seeds, summary=summary)


if __name__ == "__main__":
    main()
