from llmx.core.spec import MethodSpec, Stage
from llmx.hookspecs import hookimpl


@hookimpl
def llmx_methods():
    yield MethodSpec(
        name="rtn",
        aliases=("round-to-nearest",),
        stages=(Stage.QUANTIZE,),
        impl="llmx.plugins.rtn.method:run",
        config="llmx.plugins.rtn.config:RTNParams",
        summary="Round-to-nearest weight-only integer quantization (per-channel or per-group): the baseline.",
        paper="baseline",
        requires=("cupy",),
    )
