from llmx.core.spec import MethodSpec, Stage
from llmx.hookspecs import hookimpl


@hookimpl
def llmx_methods():
    yield MethodSpec("perplexity", (Stage.EVAL,), "llmx.plugins.evals.perplexity:run",
                     "llmx.plugins.evals.config:PerplexityParams",
                     aliases=("ppl",), paper="evaluation",
                     summary="Sliding-window perplexity and bits per byte on held-out text.")
    yield MethodSpec("speed", (Stage.EVAL,), "llmx.plugins.evals.speed:run",
                     "llmx.plugins.evals.config:SpeedParams", paper="evaluation",
                     summary="Prefill and decode tokens/s (warm-up excluded, median of repeats, threads recorded).")
    yield MethodSpec("memory", (Stage.EVAL, Stage.ANALYZE), "llmx.plugins.evals.memory:run",
                     "llmx.plugins.evals.config:MemoryParams",
                     paper="evaluation", summary="Weight bytes (in memory and as stored), KV/state cache bytes, peak RSS.")
    yield MethodSpec("generate", (Stage.EVAL,), "llmx.plugins.evals.generate:run",
                     "llmx.plugins.evals.config:GenerateParams", paper="evaluation",
                     summary="Sample completions for a prompt (greedy or nucleus sampling).")
