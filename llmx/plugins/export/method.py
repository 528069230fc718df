"""The export stage: the run's model as a compressed-tensors folder, the run artifact ``model`` (same code as
``llmx export``)."""

from __future__ import annotations

from llmx.core.context import RunContext
from llmx.plugins.export.config import CompressedTensorsParams


def run(ctx: RunContext, p: CompressedTensorsParams) -> dict:
    from llmx.core import export

    plan = export.prepare(ctx.model, "compressed-tensors", ctx.config.model or "the run's model")  # before any write
    return export.write(plan, ctx.model, ctx.tokenizer, ctx.artifact("model"), verify=p.verify)
