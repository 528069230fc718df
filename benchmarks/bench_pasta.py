"""Pasta-Lang against sequential decoding of Baseline-SFT, on held-out standard-library classes.

    python benchmarks/bench_pasta.py [--workers 2] [--heldout 100] [--bonbon-prompts 24] [--epochs 4] [--sft-only]

1. ``analyze --method pasta-annotate`` on ``ref:llama-bench``'s tokenizer: classes and runs of module-level
   functions whose independent members are async chunks. Held out: the classes (distinct prompts) of the stdlib
   validation split, topped up to ``--heldout`` with the classes of whole training modules chosen by a hash of the
   module (every row of those modules leaves training). Both fine-tunes see the same rows: those whose annotated form
   fits 384 tokens as Pasta-SFT counts them.
2. From ``ref:llama-bench``, the same SFT budget (4 epochs, batch 8, lr 1e-3, 5% warmup): Baseline-SFT (tags
   stripped) and Pasta-SFT (the interpreter's masks and positions).
3. Decoding every held-out prompt, greedy, through the interpreter: Baseline-SFT (it emits no tag: sequential),
   Pasta-SFT with predicted, oracle (a first pass's true chunk lengths) and fixed (the training chunks' median
   length) positions; then BoNBoN (one round, 10 samples per prompt, SFT + IPO) from Pasta-SFT at λ = 1 and λ = inf
   (sampling at T 1.0 with lr 2e-4, and at T 0.7 with lr 5e-5),
   its quality judged by Baseline-SFT (the evaluation's judge never selects). A response's budget is 384 tokens over
   every thread for every arm.
   Speed: the theoretical speedup (plain tokens / steps: tags cost steps) and the end-to-end ratio of
   Baseline-SFT's steps to the arm's on the same prompt, geometric means. Quality: parse rate of the assembled
   source, per-token NLL of the plain response under ``ref:llama-bench`` (the judge: it saw neither fine-tune), the
   win rate against Baseline-SFT by that NLL, promises per response, mean |length error|; each over every prompt
   and over the prompts where neither response hit the budget. Wall-clock at one thread on the first 30 prompts
   (median of 3 after a warm-up), run last, one at a time; ms per step against active threads. The figures to gate
   on are steps, never wall time (notes §5).

Finished runs are kept in ``--work`` under their spec's digest, so an interrupted run resumes. Writes
benchmarks/results/pasta.json and .md (other ``--epochs`` or ``--sft-only``: pasta_e<epochs>[_sft].json and .md).

Stays a script: its held-out prompts are whole modules topped up to ``--heldout`` (not the annotate stage's
validation split), BoNBoN's selector is the Baseline-SFT model another arm trains, it decodes one Pasta-SFT model at
predicted, oracle and fixed positions (a comparison retrains per arm), and it times decoding and splits out the
prompts neither response capped; ``llmx compare pasta`` runs the judged comparison (Pasta-SFT against
Baseline-SFT, the judge's NLL paired per held-out prompt, decode steps on the cost axis)."""

from __future__ import annotations

import argparse
import hashlib
import json
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
BONBON = [("1", 1.0, 2e-4), ("inf", 1.0, 2e-4), ("1", 0.7, 5e-5), ("inf", 0.7, 5e-5)]  # (λ, temperature, lr)


def split_rows(data_dir: str, heldout: int, out: Path) -> tuple[Path, Path, int]:
    """The rows both fine-tunes train on, the held-out class rows (files), and the training chunks' median length.
    Held out: classes of the stdlib validation split, then of whole training modules (by a hash of the module) until
    ``heldout`` distinct prompts; every row of a held-out module leaves training. Rows must fit MAX_LENGTH as Pasta-SFT
    counts them (leading specials, the annotated response, EOS), so both arms train on the same rows."""
    from transformers import AutoTokenizer

    from llmx.core.data.files import json_lines
    from llmx.plugins.pasta import lang, layout

    tok = AutoTokenizer.from_pretrained(model_folder(MODEL))
    lang.equip(tok)
    read = lambda name: [row for _, row in json_lines(Path(data_dir, name))]  # noqa: E731
    size = lambda r: len(layout.encode(tok, r["prompt"], True) + layout.encode(tok, r["response"])) + 1  # noqa: E731
    module = lambda r: r["name"].split(":")[0]  # noqa: E731
    rows = [r for r in read("train.jsonl") + read("validation.jsonl") if size(r) <= MAX_LENGTH]
    held_modules = {module(r) for r in rows if r["split"] == "validation"}
    ranked = sorted({module(r) for r in rows} - held_modules, key=lambda m: hashlib.sha256(m.encode()).hexdigest())

    def held_prompts() -> list[dict]:
        seen, out_rows = set(), []
        for r in rows:
            if module(r) in held_modules and "@" not in r["name"] and r["prompt"] not in seen:
                seen.add(r["prompt"])
                out_rows.append(r)
        return out_rows

    while len(held_prompts()) < heldout and ranked:
        held_modules.add(ranked.pop(0))
    held = held_prompts()[:heldout]
    train = [r for r in rows if module(r) not in held_modules]
    out.mkdir(parents=True, exist_ok=True)
    (out / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train))
    (out / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in held))
    median = int(statistics.median(n for r in train for n in r["chunk_tokens"]))
    return out / "train.jsonl", out / "heldout.jsonl", median


def decoded(metrics: dict) -> list[dict]:
    return [json.loads(x) for x in Path(metrics["decoded"]).read_text().splitlines() if x]


def _figures(rows: list[dict], base: list[dict]) -> dict:
    wins = [(r["judge_nll"] < b["judge_nll"]) + 0.5 * (r["judge_nll"] == b["judge_nll"])
            for r, b in zip(rows, base, strict=True) if r["judge_nll"] is not None and b["judge_nll"] is not None]
    nll = [r["judge_nll"] for r in rows if r["judge_nll"] is not None]
    from llmx.plugins.pasta.decode import geomean, speedup

    return {"speedup_theoretical": geomean([speedup(r["plain_tokens"], r["steps"]) for r in rows]),
            "step_speedup_vs_baseline": geomean([max(b["steps"], 1) / max(r["steps"], 1)
                                                  for r, b in zip(rows, base, strict=True)]),
            "parse_rate": statistics.fmean(r["parses"] for r in rows),
            "judge_nll": statistics.fmean(nll) if nll else None,
            "win_rate_vs_baseline": statistics.fmean(wins) if wins else None,
            "tokens_mean": statistics.fmean(r["tokens"] for r in rows)}


def compare(name: str, base: list[dict], rows: list[dict], timing: dict | None) -> dict:
    """An arm's figures against Baseline-SFT on the same prompts: over every prompt, and over the prompts where
    neither response ran into max_new_tokens (greedy decoding of a small model loops; a loop inflates the step
    ratio and lowers the judge's NLL)."""
    assert [r["prompt"] for r in rows] == [r["prompt"] for r in base]
    ended = [k for k, (r, b) in enumerate(zip(rows, base, strict=True)) if not r["capped"] and not b["capped"]]
    gaps = [abs(g) for r in rows for g in r["length_gaps"]]
    out = {"arm": name, "rows": len(rows), **_figures(rows, base),
           "capped_rate": statistics.fmean(r["capped"] for r in rows),
           "promises_per_response": statistics.fmean(r["promises"] for r in rows),
           "length_error_mean": statistics.fmean(gaps) if gaps else None,
           "responses_with_errors": sum(bool(r["errors"]) for r in rows),
           "steps_mean": statistics.fmean(r["steps"] for r in rows), "ended_rows": len(ended)}
    out["oracle_misses"] = sum("main: oracle-miss" in r["errors"] for r in rows)
    if ended:
        mine, theirs = [rows[k] for k in ended], [base[k] for k in ended]
        out.update({f"ended_{k}": v for k, v in _figures(mine, theirs).items()})
        out.update({f"ended_base_{k}": v for k, v in _figures(theirs, theirs).items()})  # Baseline on the same prompts
    if timing:
        out["wall_s_median"] = timing["wall_s_median"]
        out["ms_per_step_by_threads"] = timing["ms_per_step_by_threads"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--heldout", type=int, default=100)
    ap.add_argument("--bonbon-prompts", type=int, default=24)
    ap.add_argument("--epochs", type=int, default=SFT["epochs"], help="SFT epochs for both fine-tunes")
    ap.add_argument("--sft-only", action="store_true", help="skip BoNBoN and the timing runs")
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

    annotated = run("annotate", [{"method": "pasta-annotate", "stage": "analyze"}])[0]
    data_dir = annotated["data_dir"]
    train, held, median = split_rows(data_dir, args.heldout, work / "rows")

    def decode(**extra) -> dict:
        return {"method": "pasta", "stage": "decode", "params": {"data": str(held), **DECODE, **extra}}

    timing = {"limit": TIMED, "repeats": 4, "judge": None}
    jobs = ThreadPoolExecutor(args.workers)
    trained = {name: jobs.submit(run, f"sft_{name}", [{"method": "pasta", "stage": "train", "params": {
        "data": str(train), "annotated": name == "pasta", **SFT, "epochs": args.epochs}}])
        for name in ("baseline", "pasta")}
    sft = {name: fut.result()[0] for name, fut in trained.items()}
    settings = {"baseline": {"base": {}, "base_timing": timing},
                "pasta": {"predicted": {}, "oracle": {"positions": "oracle"},
                          "fixed": {"positions": "fixed", "fixed_tokens": median}, "timing": timing}}
    if args.sft_only:
        settings = {name: {k: v for k, v in keyed.items() if "timing" not in k} for name, keyed in settings.items()}
    decodes = {key: jobs.submit(run, f"decode_{name}_{key}", [decode(**extra)], on=sft[name]["model_dir"])
               for name, keyed in settings.items() for key, extra in keyed.items() if "timing" not in key}
    selector = sft["baseline"]["model_dir"]  # BoNBoN's quality judge: not the evaluation's (no Goodhart on it)
    bonbon = {}
    for lam, temperature, lr in [] if args.sft_only else BONBON:
        params = {"data": str(train), "prompts": args.bonbon_prompts, "samples": 10, "lam": lam, "judge": selector,
                  "steps": 30, "batch_size": 4, "lr": lr, "warmup": 3}
        tag = f"bonbon_{lam}" if (temperature, lr) == BONBON[0][1:] else f"bonbon_{lam}_t{temperature}_lr{lr}"
        if temperature != 1.0:
            params["temperature"] = temperature
        bonbon[(lam, temperature, lr)] = jobs.submit(run, tag, [{"method": "pasta-bonbon", "stage": "align",
                                                                 "params": params}, decode()],
                                                     on=sft["pasta"]["model_dir"])
    got = {key: fut.result()[0] for key, fut in decodes.items()}
    outputs = {key: decoded(m) for key, m in got.items()}
    for lam in bonbon:
        bonbon[lam] = bonbon[lam].result()
    for name, keyed in settings.items():  # wall-clock last, one run at a time on an otherwise idle machine
        for key, extra in keyed.items():
            if "timing" in key:
                got[key] = run(f"decode_{name}_{key}", [decode(**extra)], on=sft[name]["model_dir"])[0]
    outputs.update({key: decoded(done[1]) for key, done in bonbon.items()})
    seen = {json.loads(x)["prompt"] for x in Path(train).read_text().splitlines() if x}
    keep = [k for k, r in enumerate(outputs["base"]) if r["prompt"] not in seen]  # a class prompt shared by modules
    outputs = {key: [rows[k] for k in keep] for key, rows in outputs.items()}
    base = outputs["base"]
    rows = [compare("Baseline-SFT (sequential)", base, base, got.get("base_timing")),
            compare("Pasta-SFT, predicted positions", base, outputs["predicted"], got.get("timing")),
            compare("Pasta-SFT, oracle positions", base, outputs["oracle"], None),
            compare(f"Pasta-SFT, fixed positions ({median})", base, outputs["fixed"], None)]
    rounds = {}
    for key, (aligned, _) in bonbon.items():
        name = "Pasta + BoNBoN, lambda={}, T={}, lr={}".format(*key)
        rounds[name] = aligned["rounds"]
        rows.append(compare(name, base, outputs[key], None))
    goal = rows[1]

    def verdict(prefix: str, base_prefix: str) -> dict:
        return {"step_speedup_ge_1.3": goal[f"{prefix}step_speedup_vs_baseline"] >= 1.3,
                "parse_rate_within_5_points": abs(goal[f"{prefix}parse_rate"] - goal[f"{base_prefix}parse_rate"]) <= 0.05,
                "judge_nll_within_2pct": goal[f"{prefix}judge_nll"] <= 1.02 * goal[f"{base_prefix}judge_nll"]}

    goal.update({f"base_{k}": rows[0][k] for k in ("parse_rate", "judge_nll")})
    verdicts = {"all_prompts": verdict("", "base_"),
                "both_ended": verdict("ended_", "ended_base_") if "ended_parse_rate" in goal else None}
    name = "pasta" if (args.epochs, args.sft_only) == (SFT["epochs"], False) else \
        f"pasta_e{args.epochs}{'_sft' if args.sft_only else ''}"
    payload = {"benchmark": name, "model": MODEL,
               "annotated_rows": {k: annotated[k] for k in ("rows_train", "rows_validation")},
               "sft": {**SFT, "epochs": args.epochs}, "decode": DECODE, "train_rows": sum(1 for _ in open(train)),
               "heldout_rows": len(base), "fixed_tokens": median, "sft_metrics": sft, "bonbon_rounds": rounds,
               "rows": rows, "goal_predicted_positions": verdicts, "machine": machine()}
    write(name, payload)
    cols = ["arm", "speedup_theoretical", "step_speedup_vs_baseline", "parse_rate", "judge_nll",
            "win_rate_vs_baseline", "capped_rate", "promises_per_response", "length_error_mean", "oracle_misses",
            "tokens_mean"]
    ended = ["arm", "ended_rows", *[f"ended_{c}" for c in cols[1:6]], "ended_base_parse_rate", "ended_base_judge_nll"]
    md = [f"# Pasta-Lang on held-out standard-library classes (ref:llama-bench fine-tunes, {args.epochs} epochs)", "",
          f"{len(base)} held-out prompts (any also a training prompt left out), greedy; Baseline-SFT decoded "
          "sequentially. All prompts:", "",
          markdown(cols, rows), "", "Prompts where neither response ran into max_new_tokens:", "", markdown(ended, rows),
          "", "Goal (Pasta-SFT, predicted positions): " + json.dumps(verdicts), "",
          "Wall-clock at one thread, first 30 prompts (median of 3 after a warm-up):",
          markdown(["arm", "wall_s_median", "ms_per_step_by_threads"], [r for r in rows if "wall_s_median" in r])]
    (Path(__file__).resolve().parent / "results" / f"{name}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
