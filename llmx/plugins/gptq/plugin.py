from llmx.core.spec import MethodSpec, Stage
from llmx.hookspecs import hookimpl


@hookimpl
def llmx_methods():
    yield MethodSpec(
        name="gptq",
        stages=(Stage.QUANTIZE,),
        impl="llmx.plugins.gptq.method:run",
        config="llmx.plugins.gptq.config:GPTQParams",
        summary="GPTQ: second-order weight quantization from calibration Hessians (block-wise lazy updates).",
        paper="Frantar et al., ICLR 2023 (baseline)",
        requires=("cupy",),
    )
