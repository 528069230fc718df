from llmx.core.spec import MethodSpec, Stage
from llmx.hookspecs import hookimpl
from llmx.plugins.bnb.config import BnbParams


@hookimpl
def llmx_methods():
    yield MethodSpec(
        name="bnb",
        aliases=("bitsandbytes", "nf4"),
        stages=(Stage.QUANTIZE,),
        impl="llmx.plugins.bnb.method:run",
        config=BnbParams,
        summary="bitsandbytes NF4/FP4 weight-only or LLM.int8 quantization (a real library baseline; runs on CPU).",
        paper="Dettmers et al., 2022/2023 (baseline)",
        requires=("bitsandbytes",),
    )
