from llmx.core.spec import MethodSpec, Stage
from llmx.hookspecs import hookimpl


@hookimpl
def llmx_methods():
    yield MethodSpec(
        name="blockdialect",
        aliases=("bd", "dialectfp4"),
        stages=(Stage.QUANTIZE,),
        impl="llmx.plugins.blockdialect.method:run",
        config="llmx.plugins.blockdialect.config:BlockDialectParams",
        summary="BlockDialect: a per-block FP4 dialect from a 16-entry formatbook, MX exponent, integer-MAC values; "
                "weights exhaustive, activations two-stage, optionally the attention matmuls (full path).",
        paper="Jang & Tambe, ICML 2025 (arXiv 2501.01144)",
        requires=("cupy",),
    )
