from llmx.core.spec import MethodSpec, Stage
from llmx.hookspecs import hookimpl


@hookimpl
def llmx_methods():
    yield MethodSpec("overtraining", (Stage.ANALYZE,), "llmx.plugins.overtraining.method:run",
                     "llmx.plugins.overtraining.config:OvertrainingParams",
                     summary="Catastrophic overtraining over a checkpoint series: Gaussian sensitivity S(T, gamma), "
                     "fine-tuning forgetting at fixed rates, turning points T*.",
                     paper="Springer et al., ICML 2025 (arXiv 2503.19206)")
