"""`llmx eval --method perplexity` against a plain loop over the same windows, in one process, one thread.

Script-only (not a comparison): the evaluation's wall time against a hand-written loop, a speed study of llmx itself.

    python benchmarks/bench_eval_speed.py [--model ref:llama-test tiny:llama] [--rounds 15] [--max-tokens 16384]

The plain loop is what anyone would write with the token stream in hand: for each batch of the evaluation's windows,
``model(ids).logits``, then the cross-entropy summed over the positions the window scores. The evaluation is the
whole in-process call (``llmx.evaluate``: run folder, metadata, data, scoring, bits per byte, metrics file) and its
stage alone (the ``seconds`` llmx records: data, scoring, bits per byte); the difference is the run's own bookkeeping
(run folder, package versions, git commit, fsynced metadata), the same for every method. Rounds interleave the call
and the loop, after one warm-up of each (the process's first call also indexes the standard library and reads the
token cache, tokenising only if no earlier run did: it is reported on its own, ``first_call_s``). Ratios are the
loop's median time over the evaluation's (1.0: as fast; the target is >= 0.95). Both must give the same figure:
``nll_diff`` is their difference. Writes benchmarks/results/eval_speed.json and .md.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import EVAL, publish  # noqa: E402


@torch.inference_mode()
def plain_loop(model, tokens: torch.Tensor, seq_len: int, stride: int, batch: int) -> tuple[float, int]:
    """Summed NLL and count over the evaluation's windows, batched as it batches them."""
    from llmx.core.eval.lm import windows

    spans = windows(len(tokens), seq_len, stride)
    total, count = 0.0, 0
    for i in range(0, len(spans), batch):
        groups: dict[int, list] = {}
        for span in spans[i:i + batch]:
            groups.setdefault(span[1] - span[0], []).append(span)
        for group in groups.values():
            x = torch.stack([tokens[b:e] for b, e, _ in group])
            logits = model(input_ids=x).logits[:, :-1].float()
            nll = torch.nn.functional.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten(), reduction="none")
            nll = nll.view(len(group), -1)
            for row, (b, e, first) in enumerate(group):
                total += float(nll[row, first - b - 1:].sum())
                count += e - first
    return total, count


def measure(name: str, rounds: int, seq_len: int, stride: int, max_tokens: int, batch: int) -> dict:
    import llmx
    from llmx.core.data import token_stream

    model, tok = llmx.load(name)
    model.eval()
    params = {"seq_len": seq_len, "stride": stride, "max_tokens": max_tokens, "batch_size": batch}

    def evaluate() -> tuple[dict, float, float]:
        with tempfile.TemporaryDirectory(prefix="llmx-bench-") as out:
            t0 = time.perf_counter()
            metrics = llmx.evaluate(model, tokenizer=tok, method="perplexity", output_dir=out, **params)
            wall = time.perf_counter() - t0
            stage = json.loads(next(Path(out).glob("*/metrics.json")).read_text())["stages"][0]["seconds"]
        return metrics, wall, stage

    t0 = time.perf_counter()
    metrics, _, _ = evaluate()
    first = time.perf_counter() - t0
    tokens = token_stream(tok, "stdlib", "validation", max_tokens)
    plain_loop(model, tokens, seq_len, stride, batch)
    calls, stages, loops = [], [], []
    for _ in range(rounds):
        metrics, wall, stage = evaluate()
        calls.append(wall)
        stages.append(stage)
        t0 = time.perf_counter()
        total, count = plain_loop(model, tokens, seq_len, stride, batch)
        loops.append(time.perf_counter() - t0)
    loop, call, stage = statistics.median(loops), statistics.median(calls), statistics.median(stages)
    assert count == metrics["tokens"], (count, metrics["tokens"])
    return {"model": name, "tokens": count, "loop_s": round(loop, 4), "eval_call_s": round(call, 4),
            "eval_stage_s": stage, "call_ratio": round(loop / call, 3), "stage_ratio": round(loop / stage, 3),
            "loop_range_s": _range(loops), "call_range_s": _range(calls), "first_call_s": round(first, 4),
            "nll_eval": metrics["nll"], "nll_loop": total / count, "nll_diff": abs(metrics["nll"] - total / count),
            "perplexity": metrics["perplexity"], "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def _range(values: list[float]) -> str:
    return f"{min(values):.3f}-{max(values):.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", "--model", nargs="+", default=["ref:llama-test", "tiny:llama"], dest="models")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--max-tokens", type=int, default=EVAL["max_tokens"])
    ap.add_argument("--seq-len", type=int, default=EVAL["seq_len"])
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--name", default="eval_speed", help="Result file name (default: eval_speed).")
    args = ap.parse_args()
    torch.set_num_threads(1)
    stride = max(args.seq_len // 2, 1)
    rows = [measure(m, args.rounds, args.seq_len, stride, args.max_tokens, args.batch_size) for m in args.models]
    for r in rows:
        if not math.isclose(r["nll_eval"], r["nll_loop"], rel_tol=1e-6):
            raise SystemExit(f"{r['model']}: eval and loop disagree ({r['nll_eval']} vs {r['nll_loop']})")
    publish(args.name, rows, rounds=args.rounds, seq_len=args.seq_len, stride=stride, max_tokens=args.max_tokens,
            batch_size=args.batch_size, threads=torch.get_num_threads(), target_ratio=0.95)


if __name__ == "__main__":
    main()
