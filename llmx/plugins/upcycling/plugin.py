from llmx.core.spec import MethodSpec, Stage
from llmx.hookspecs import hookimpl

PAPER = "Liew, Kato, Takase, ICML 2025 (arXiv 2502.03009)"


@hookimpl
def llmx_methods():
    yield MethodSpec("upcycle", (Stage.TRAIN,), "llmx.plugins.upcycling.method:run",
                     "llmx.plugins.upcycling.config:UpcycleParams",
                     summary="Sparse upcycling: a dense Llama/Qwen2 becomes a top-k MoE of FFN copies (logits "
                     "checked), then trained through the lm stage.", paper=PAPER)
    yield MethodSpec("upcycling-law", (Stage.ANALYZE,), "llmx.plugins.upcycling.analyze:run",
                     "llmx.plugins.upcycling.config:LawParams",
                     summary="The upcycling law L(D1, D2) with the D1xD2 interaction: fit, intervals, held-out "
                     "error, power, and budget guidance against MoE/dense from scratch.", paper=PAPER)
