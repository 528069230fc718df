"""Pasta-Lang against sequential decoding of Baseline-SFT, on held-out standard-library classes.

    python benchmarks/bench_pasta.py [--workers 2] [--heldout 100] [--bonbon-prompts 24]

1. ``analyze --method pasta-annotate`` on ``ref:llama-bench``'s tokenizer: classes and runs of module-level
   functions whose independent members are async chunks. Held out: the stdlib validation split, topped up to
   ``--heldout`` rows with training rows chosen by a hash of their name (removed from training). Both fine-tunes see
   the same rows: those whose annotated form fits 384 tokens.
2. From ``ref:llama-bench``, the same SFT budget (4 epochs, batch 8, lr 1e-3, 5% warmup): Baseline-SFT (tags
   stripped) and Pasta-SFT (the interpreter's masks and positions).
3. Decoding every held-out prompt, greedy, through the interpreter: Baseline-SFT (it emits no tag: sequential),
   Pasta-SFT with predicted, oracle (a first pass's true chunk lengths) and fixed (the training chunks' median
   length) positions; then BoNBoN (one round, 10 samples per prompt, SFT + IPO) from Pasta-SFT at λ = 1 and λ = inf.
   Speed: the theoretical speedup (tokens / steps, tags counted) and the end-to-end ratio of Baseline-SFT's steps
   to the arm's on the same prompt, geometric means. Quality: parse rate of the assembled source, per-token NLL of
   the plain response under ``ref:llama-bench`` (the judge: it saw neither fine-tune), the win rate against
   Baseline-SFT by that NLL, promises per response, mean |length error|. Wall-clock at one thread on the first 30
   prompts (median of 3 after a warm-up) and ms per step against active threads. The figures to gate on are steps,
   never wall time (notes §5).

Finished runs are kept in ``--work`` under their spec's digest, so an interrupted run resumes. Writes
benchmarks/results/pasta.json and .md."""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cached, child, machine, markdown, model_folder, write  # noqa: E402

MODEL = "ref:llama-bench"
MAX_LENGTH = 384
SFT = {"epochs": 4, "batch_size": 8, "lr": 1e-3, "warmup_ratio": 0.05, "max_length": MAX_LENGTH}
DECODE = {"max_new_tokens": 384, "max_chunk_tokens": 256, "judge": MODEL}
TIMED = 30


def split_rows(data_dir: str, heldout: int, out: Path) -> tuple[Path, Path, int]:
    """The rows both fine-tunes train on and the held-out rows (files), and the training chunks' median length."""
    from transformers import AutoTokenizer

    from llmx.plugins.pasta import lang

    tok = AutoTokenizer.from_pretrained(model_folder(MODEL))
    lang.equip(tok)
    read = lambda name: [json.loads(x) for x in Path(data_dir, name).read_text().splitlines() if x]  # noqa: E731
    train, held = read("train.jsonl"), read("validation.jsonl")
    fits = lambda r: len(tok(r["prompt"] + r["response"], add_special_tokens=False)["input_ids"]) <= MAX_LENGTH  # noqa
    train, held = [r for r in train if fits(r)], [r for r in held if fits(r)]
    rank = sorted(train, key=lambda r: hashlib.sha256(r["name"].encode()).hexdigest())
    moved = {r["name"] for r in rank[: max(heldout - len(held), 0)]}
    held += [r for r in train if r["name"] in moved]
    train = [r for r in train if r["name"] not in moved]
    out.mkdir(parents=True, exist_ok=True)
    (out / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train))
    (out / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in held))
    median = int(statistics.median(n for r in train for n in r["chunk_tokens"]))
    return out / "train.jsonl", out / "heldout.jsonl", median


def decoded(metrics: dict) -> list[dict]:
    return [json.loads(x) for x in Path(metrics["decoded"]).read_text().splitlines() if x]


def geomean(xs: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(x) for x in xs))


def compare(name: str, m: dict, base: list[dict], rows: list[dict], timing: dict | None) -> dict:
    """An arm's figures against Baseline-SFT on the same prompts."""
    assert [r["prompt"] for r in rows] == [r["prompt"] for r in base]
    wins = [(r["judge_nll"] < b["judge_nll"]) + 0.5 * (r["judge_nll"] == b["judge_nll"])
            for r, b in zip(rows, base, strict=True) if r["judge_nll"] is not None and b["judge_nll"] is not None]
    out = {"arm": name, "rows": len(rows), "speedup_theoretical": m["speedup_theoretical_geomean"],
           "step_speedup_vs_baseline": geomean([b["steps"] / r["steps"] for r, b in zip(rows, base, strict=True)]),
           "steps_mean": m["steps_mean"], "tokens_mean": m["tokens_mean"], "parse_rate": m["parse_rate"],
           "judge_nll": m["judge_nll_mean"], "win_rate_vs_baseline": statistics.fmean(wins) if wins else None,
           "promises_per_response": m["promises_per_response"], "length_error_mean": m["length_error_mean"],
           "responses_with_errors": m["responses_with_errors"]}
    if timing:
        out["wall_s_median"] = timing["wall_s_median"]
        out["ms_per_step_by_threads"] = timing["ms_per_step_by_threads"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--heldout", type=int, default=100)
    ap.add_argument("--bonbon-prompts", type=int, default=24)
    ap.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "llmx-bench-pasta"),
                    help="finished runs are kept here; a rerun reuses them (delete it to start afresh)")
    ap.add_argument("--child")
    args = ap.parse_args()
    if args.child:
        return child(json.loads(args.child))
    work = Path(args.work)

    def run(tag: str, stages: list[dict], on: str = MODEL) -> list[dict]:
        folder = work / tag
        return cached(__file__, folder, {"model": on, "out": str(folder / "runs"), "seed": 0, "stages": stages})

    data_dir = run("annotate", [{"method": "pasta-annotate", "stage": "analyze"}])[0]["data_dir"]
    train, held, median = split_rows(data_dir, args.heldout, work / "rows")

    def decode(**extra) -> dict:
        return {"method": "pasta", "stage": "decode", "params": {"data": str(held), **DECODE, **extra}}

    timing = {"limit": TIMED, "repeats": 4, "judge": None}
    arms = {"baseline": [decode(), decode(**timing)],
            "pasta": [decode(), decode(positions="oracle"), decode(positions="fixed", fixed_tokens=median),
                      decode(**timing)]}
    jobs = ThreadPoolExecutor(args.workers)
    futures = {name: jobs.submit(run, f"sft_{name}", [{"method": "pasta", "stage": "train", "params": {
        "data": str(train), "annotated": name == "pasta", **SFT}}, *stages]) for name, stages in arms.items()}
    base_m, base_timing = futures["baseline"].result()[1:]
    pasta = futures["pasta"].result()
    model_dir = pasta[0]["model_dir"]
    bonbon = {lam: jobs.submit(run, f"bonbon_{lam}", [{"method": "pasta-bonbon", "stage": "align", "params": {
        "data": str(train), "prompts": args.bonbon_prompts, "samples": 10, "lam": lam, "judge": MODEL, "steps": 30,
        "batch_size": 4, "lr": 2e-4, "warmup": 3}}, decode()], on=model_dir) for lam in ("1", "inf")}
    base = decoded(base_m)
    rows = [compare("Baseline-SFT (sequential)", base_m, base, base, base_timing),
            compare("Pasta-SFT, predicted positions", pasta[1], base, decoded(pasta[1]), pasta[4]),
            compare("Pasta-SFT, oracle positions", pasta[2], base, decoded(pasta[2]), None),
            compare(f"Pasta-SFT, fixed positions ({median})", pasta[3], base, decoded(pasta[3]), None)]
    rounds = {}
    for lam, fut in bonbon.items():
        aligned, m = fut.result()
        rounds[lam] = aligned["rounds"]
        rows.append(compare(f"Pasta + BoNBoN, lambda={lam}", m, base, decoded(m), None))
    goal = rows[1]
    verdict = {"step_speedup_ge_1.3": goal["step_speedup_vs_baseline"] >= 1.3,
               "parse_rate_within_5_points": abs(goal["parse_rate"] - rows[0]["parse_rate"]) <= 0.05,
               "judge_nll_within_2pct": goal["judge_nll"] <= 1.02 * rows[0]["judge_nll"]}
    payload = {"benchmark": "pasta", "model": MODEL, "sft": SFT, "decode": DECODE, "train_rows": sum(
        1 for _ in open(train)), "heldout_rows": len(base), "fixed_tokens": median, "sft_metrics": {
        "baseline": futures["baseline"].result()[0], "pasta": pasta[0]}, "bonbon_rounds": rounds, "rows": rows,
        "goal_predicted_positions": verdict, "machine": machine()}
    write("pasta", payload)
    cols = ["arm", "rows", "speedup_theoretical", "step_speedup_vs_baseline", "parse_rate", "judge_nll",
            "win_rate_vs_baseline", "promises_per_response", "length_error_mean", "steps_mean", "tokens_mean"]
    md = ["# Pasta-Lang on held-out standard-library classes (ref:llama-bench fine-tunes)", "",
          markdown(cols, rows), "", "Goal (Pasta-SFT, predicted positions): " + json.dumps(verdict), "",
          "Wall-clock at one thread, first 30 prompts (median of 3 after a warm-up):",
          markdown(["arm", "wall_s_median", "ms_per_step_by_threads"], [r for r in rows if "wall_s_median" in r])]
    (Path(__file__).resolve().parent / "results" / "pasta.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
