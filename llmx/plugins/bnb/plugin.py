from llmx.core.spec import LayerSpec, MethodSpec, Stage
from llmx.hookspecs import hookimpl


@hookimpl
def llmx_methods():
    yield MethodSpec(
        name="bnb",
        aliases=("bitsandbytes", "nf4"),
        stages=(Stage.QUANTIZE,),
        impl="llmx.plugins.bnb.method:run",
        config="llmx.plugins.bnb.config:BnbParams",
        summary="bitsandbytes NF4/FP4 weight-only or LLM.int8 quantization (a real library baseline; runs on CPU).",
        paper="Dettmers et al., 2022/2023 (baseline)",
        requires=("bitsandbytes",),
    )


@hookimpl
def llmx_layers():
    yield LayerSpec("bnb_linear4bit", "llmx.plugins.bnb.layers:rebuild4", "bitsandbytes 4-bit linear (NF4/FP4)")
    yield LayerSpec("bnb_linear8bit", "llmx.plugins.bnb.layers:rebuild8", "bitsandbytes LLM.int8() linear")
