from llmx.core.spec import MethodSpec, Stage
from llmx.hookspecs import hookimpl


@hookimpl
def llmx_methods():
    yield MethodSpec(
        name="guidedquant",
        aliases=("gq", "lnq"),
        stages=(Stage.QUANTIZE,),
        impl="llmx.plugins.guidedquant.method:run",
        config="llmx.plugins.guidedquant.config:GuidedQuantParams",
        summary="GuidedQuant: end-loss saliency-weighted Hessians per output-channel group, for LNQ (per-row "
                "codebooks), GPTQ or the SqueezeLLM seed.",
        paper="Kim et al., ICML 2025 (arXiv 2505.07004)",
        requires=("cupy",),
    )
