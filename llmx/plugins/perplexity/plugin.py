from llmx.core.spec import MethodSpec, Stage
from llmx.hookspecs import hookimpl
from llmx.plugins.perplexity.config import PerplexityParams


@hookimpl
def llmx_methods():
    yield MethodSpec(
        name="perplexity",
        aliases=("ppl",),
        stages=(Stage.EVAL,),
        impl="llmx.plugins.perplexity.method:run",
        config=PerplexityParams,
        summary="Sliding-window perplexity and bits per byte on held-out text.",
        paper="evaluation",
    )
