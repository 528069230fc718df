"""Tasks at small scale: what the generate-and-judge tasks measure on the reference zoo, what the sandbox costs, and
whether llmx's choice scorer and lm-evaluation-harness agree on the same rows.

Script-only (not a comparison): what the tasks measure on the reference zoo, the sandbox's cost, and llmx's scorer
against lm-evaluation-harness (agreement, not a technique beside its baselines).

    python benchmarks/bench_tasks.py [--model ref:llama] [--small ref:llama-test] [--prompts 200]

1. HumanEval (all 164 problems: greedy pass@1 with 128 new tokens, and the canonical solutions' bits per byte) and
   brackets (held-out prompts, 4 samples at temperature 1, score with a 95% bootstrap interval) for the small test
   model, the reference model, and the reference model after 4- and 2-bit RTN, each quantized run compared with
   the FP model on the same prompts (paired difference and interval).
2. The sandbox: the median wall time of a trivial program, and all 164 canonical solutions on 1 and 2 workers.
3. A next-line multiple-choice task from held-out standard-library code (the true next line against three lines of
   other files): accuracy from llmx's scorer and from lm-eval on the same rows, the rows they agree on, and time.
Writes benchmarks/results/tasks.json and tasks.md.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, markdown, run_pipeline, write  # noqa: E402


def quality(model: str, small: str, prompts: int) -> list[dict]:
    humaneval = {"method": "task", "stage": "eval", "params": {"task": "humaneval", "max_new_tokens": 128}}
    rows = []
    for label, name, bits in ((f"{small} (FP)", small, None), (f"{model} (FP)", model, None),
                              (f"{model} W4 RTN g64", model, "w4a16"), (f"{model} W2 RTN g64", model, "w2a16")):
        brackets = {"method": "task", "stage": "eval",
                    "params": {"task": "brackets", "limit": prompts, "samples": 4, "k": [1, 4],
                               **({"compare": model} if bits else {})}}
        quant = [{"method": "rtn", "params": {"bits": bits, "group_size": 64, "save": False}}] if bits else []
        t0 = time.perf_counter()
        *_, he, br = run_pipeline(name, quant + [humaneval, brackets], threads=1)
        rows.append({"model": label, "humaneval_pass@1": he["pass@1"], "humaneval_ref_bpb": he["reference_bpb"],
                     "brackets_score": br["score"], "brackets_ci": f"[{br['score_ci_low']:.3f}, {br['score_ci_high']:.3f}]",
                     "brackets_pass@4": br["pass@4"], "diff_vs_fp": br.get("diff"),
                     "diff_ci": f"[{br['diff_ci_low']:.3f}, {br['diff_ci_high']:.3f}]" if bits else None,
                     "seconds": round(time.perf_counter() - t0, 1)})
        print(rows[-1], flush=True)
    return rows


def sandbox_cost() -> dict:
    """The sandbox's cost per program (``bench_sandbox`` compares it with the audit-hook sandbox it replaced) and the
    canonical HumanEval solutions judged on 1 and 2 workers."""
    from concurrent.futures import ThreadPoolExecutor

    from llmx.core.eval import sandbox
    from llmx.plugins.tasks import humaneval

    times = []
    for _ in range(30):
        t0 = time.perf_counter()
        assert sandbox.run("x = 1").completed
        times.append(time.perf_counter() - t0)
    problems = humaneval.rows("test", 0)
    out = {"trivial_program_ms": 1000 * statistics.median(times)}
    for workers in (1, 2):
        t0 = time.perf_counter()
        with ThreadPoolExecutor(workers) as pool:
            verdicts = list(pool.map(lambda p: humaneval.judge(p, p["reference"])[0], problems))
        out[f"canonical_164_seconds_workers_{workers}"] = time.perf_counter() - t0
        out[f"canonical_passed_workers_{workers}"] = sum(verdicts)
    print(out, flush=True)
    return out


def next_line_rows(n: int, seed: int = 0) -> list[dict]:
    from llmx.core.data import documents

    docs = [d.splitlines() for d in documents("stdlib", "validation")]
    lines = [(i, line) for i, d in enumerate(docs) for line in d if len(line.strip()) > 8]
    rng = random.Random(seed)
    rows: list[dict] = []
    while len(rows) < n:
        i = rng.randrange(len(docs))
        d = docs[i]
        if len(d) < 6:
            continue
        at = rng.randrange(4, len(d))
        truth = d[at]
        if len(truth.strip()) <= 8:
            continue
        others = [line for j, line in rng.sample(lines, 12) if j != i and line != truth][:3]
        choices = [truth, *others]
        rng.shuffle(choices)
        rows.append({"prompt": "\n".join(d[at - 4:at]) + "\n", "choices": choices, "answer": choices.index(truth)})
    return rows


def agreement(models: list[str], n: int) -> list[dict]:
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        data = folder / "next_line.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in next_line_rows(n)))
        (folder / "tasks").mkdir()
        (folder / "tasks" / "next_line.yaml").write_text(
            f"task: next_line\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
            "test_split: test\noutput_type: multiple_choice\ntarget_delimiter: ''\ndoc_to_text: '{{prompt}}'\n"
            "doc_to_choice: '{{choices}}'\ndoc_to_target: answer\nmetric_list:\n  - metric: acc\n"
            "  - metric: acc_norm\n")
        for model in models:
            t0 = time.perf_counter()
            ours = run_pipeline(model, [{"method": "task", "stage": "eval", "params": {"file": str(data), "delimiter": ""}}],
                                output_dir=str(folder / "runs"), threads=1)[0]
            t1 = time.perf_counter()
            theirs = run_pipeline(model, [{"method": "lm-eval", "params": {
                "tasks": ["next_line"], "include_path": str(folder / "tasks")}}], output_dir=str(folder / "runs"),
                threads=1)[0]
            t2 = time.perf_counter()
            mine = [json.loads(x) for x in next((folder / "runs").glob("*/artifacts/0_task/rows.jsonl")).open()]
            samples = [json.loads(x) for x in next((folder / "runs").glob("*/artifacts/0_lm-eval/*.jsonl")).open()]
            same = sum(bool(s["acc"]) == r["correct"] for s, r in
                       zip(sorted(samples, key=lambda s: s["doc_id"]), mine, strict=True))
            out.append({"model": model, "rows": n, "llmx_accuracy": ours["accuracy"],
                        "llmx_ci": f"[{ours['accuracy_ci_low']:.3f}, {ours['accuracy_ci_high']:.3f}]",
                        "lm_eval_acc": theirs["next_line.acc"], "llmx_accuracy_norm": ours["accuracy_norm"],
                        "lm_eval_acc_norm": theirs["next_line.acc_norm"], "rows_agreeing": same,
                        "llmx_seconds": round(t1 - t0, 1), "lm_eval_seconds": round(t2 - t1, 1)})
            shutil.rmtree(folder / "runs")
            print(out[-1], flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="ref:llama")
    ap.add_argument("--small", default="ref:llama-test")
    ap.add_argument("--prompts", type=int, default=200)
    ap.add_argument("--choice-rows", type=int, default=400)
    args = ap.parse_args()
    cost = sandbox_cost()
    agree = agreement([args.small, args.model], args.choice_rows)
    rows = quality(args.model, args.small, args.prompts)
    write("tasks", {"benchmark": "tasks", "quality": rows, "sandbox": cost, "agreement": agree, "machine": machine()})
    table = "\n\n".join([
        markdown(["model", "humaneval_pass@1", "humaneval_ref_bpb", "brackets_score", "brackets_ci",
                  "brackets_pass@4", "diff_vs_fp", "diff_ci", "seconds"], rows),
        markdown(list(cost), [cost]),
        markdown(["model", "rows", "llmx_accuracy", "llmx_ci", "lm_eval_acc", "llmx_accuracy_norm", "lm_eval_acc_norm",
                  "rows_agreeing", "llmx_seconds", "lm_eval_seconds"], agree)])
    (Path(__file__).resolve().parent / "results" / "tasks.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
