"""The stages the alignment comparisons share (``llmx compare align``, ``pipa``, ``confpo``): each arm samples its
own preference data on the brackets task's train prompts (``analyze --method task``: 4 samples per prompt judged by
the program, the first passing and the first failing one a pair), aligns on it (100 steps of 8 at lr 5e-5, the same
for every method), and the evaluation samples 8 completions per held-out (validation) prompt: the preferred rate per
prompt is the item, the KL of those samples from the starting model the cost axis (drawn, not matched). As
``benchmarks/bench_align.py``; equal budget is the same data, steps, batch and rate. In core, not in a plugin: three
plugins' comparisons share it, and no plugin imports another."""

from __future__ import annotations

from typing import Any

PAPER_DATA = "brackets task (the starting model's own judged samples; held-out validation prompts)"
ANALYZE = {"method": "task", "stage": "analyze",
           "params": {"task": "brackets", "splits": ["train"], "limit": 400, "samples": 4}}
EVALUATION = {"method": "task", "stage": "eval", "params": {"task": "brackets", "limit": 50, "samples": 8, "kl": True}}
BUDGET = {"steps": 100, "lr": 5e-5, "batch_size": 8, "save": False}
QUICK = {"steps": 2, "limit": 8, "samples": 2, "batch_size": 4, "max_len": 64}
COMMON = dict(evaluation=EVALUATION, items="rows.jsonl", metric="score", higher_is_better=True,
              cost="KL from the starting model (nats per completion)", cost_key="kl_from_reference",
              quick=QUICK, model="ref:llama", quick_model="ref:llama-test", data={"source": "stdlib", "seq_len": 128},
              corpus=False)


def aligned(method: str, **params: Any) -> tuple[dict[str, Any], ...]:
    """An arm's stages: its own judged samples, then ``method`` at the shared budget."""
    return (ANALYZE, {"method": method, "params": {**BUDGET, **params}})
