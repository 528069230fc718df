"""Sample completions for a prompt; they land in metrics.json and in ``samples.txt``."""

from __future__ import annotations

from llmx.core import atomic
from llmx.core.context import RunContext
from llmx.core.eval.generate import generate
from llmx.plugins.evals.config import GenerateParams


def run(ctx: RunContext, p: GenerateParams) -> dict:
    (completions,) = generate(ctx.model, ctx.tokenizer, [p.prompt], max_new_tokens=p.max_new_tokens,
                              samples=p.samples, temperature=p.temperature, top_p=p.top_p, seed=ctx.config.seed)
    texts = [c.text for c in completions]
    atomic.write_text(ctx.artifact("samples.txt"), "\n\n----\n\n".join(p.prompt + t for t in texts) + "\n")
    return {"samples": texts, "new_tokens": max(c.tokens for c in completions)}
