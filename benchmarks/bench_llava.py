"""The premise Parrot starts from: LLaVA stage 2 on English-only data leaves the other languages below English.

    python benchmarks/bench_llava.py [--model ref:llava] [--steps 300] [--lr 1e-3] [--seeds 0 1 2] [--count 100]

From ``ref:llava`` (text model pre-trained in six languages, CLIP tower, stage-1 projector), three arms at the same
steps, batch and rate, each on its own seed's scenes: no stage 2 (the stage-1 model as built), stage 2 on English-only
conversations (open questions and multiple choice), and stage 2 on the six languages in equal shares. Each model
then answers the same held-out scenes (test-split handwriting) asked in all six languages, multiple choice (MMMB's
letter scoring) and open (the reply parsed to the word it names). Reported per arm, seed and format: the accuracy
per language, the non-English mean and English minus that mean. Writes benchmarks/results/llava_premise_<model>.json
and .md.

Not a comparison: ``llmx compare llava`` runs the three arms (open questions, pooled over the six languages,
paired per question); this script adds the per-language split and English minus the non-English mean (the premise
itself; the runner pairs one pooled metric), the multiple-choice format beside the open one, and each seed's own
training scenes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import file_label, publish, run_pipeline, spread  # noqa: E402

LANGUAGES = ("en", "zh", "ru", "pt", "ar", "tr")
ARMS = {"stage1-only": None, "stage2-en": {"en": 1.0}, "stage2-all": {lang: 1.0 for lang in LANGUAGES}}


def arm_stages(languages: dict[str, float] | None, args, seed: int) -> list[dict]:
    evals = [{"method": "scenes-vqa", "params": {"format": fmt, "count": args.count}} for fmt in ("choice", "open")]
    if languages is None:
        return evals
    train = {"method": "llava", "params": {"stage": 2, "steps": args.steps, "lr": args.lr, "batch_size": 16,
                                           "save": False, "eval_rows": 0,
                                           "scenes": {"count": args.rows, "languages": languages, "seed": seed}}}
    return [train, *evals]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="ref:llava")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=1e-3, help="stage-2 rate (LLaVA-1.5's 2e-5 is for 7B models; a toy "
                    "model moves in a few hundred steps only at higher rates)")
    ap.add_argument("--rows", type=int, default=4000, help="stage-2 conversations per run")
    ap.add_argument("--count", type=int, default=100, help="held-out questions per language and format")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = ap.parse_args()
    rows, gaps = [], {}
    for arm, languages in ARMS.items():
        for seed in args.seeds if languages is not None else args.seeds[:1]:  # nothing random without stage 2
            t0 = time.perf_counter()
            metrics = run_pipeline(args.model, arm_stages(languages, args, seed), seed=seed, threads=1)
            seconds = round(time.perf_counter() - t0, 1)
            for m in metrics[-2:]:
                others = statistics.mean(m[f"accuracy_{lang}"] for lang in LANGUAGES[1:])
                row = {"arm": arm, "seed": seed, "format": m["format"],
                       **{lang: round(m[f"accuracy_{lang}"], 3) for lang in LANGUAGES},
                       "non_en_mean": round(others, 3), "en_minus_non_en": round(m["accuracy_en"] - others, 3),
                       "seconds": seconds}
                rows.append(row)
                gaps.setdefault(f"{arm}/{m['format']}", []).append(row["en_minus_non_en"])
                print(row, flush=True)
    summary = {k: spread(v) for k, v in gaps.items()}
    publish(f"llava_premise_{file_label(args.model)}", rows, model=args.model, steps=args.steps, lr=args.lr,
            rows_per_run=args.rows, questions_per_language=args.count, seeds=args.seeds, gap_spread=summary)


if __name__ == "__main__":
    main()
