from llmx.core.spec import MethodSpec, Stage
from llmx.hookspecs import hookimpl


@hookimpl
def llmx_methods():
    yield MethodSpec(
        name="mxfp4",
        stages=(Stage.QUANTIZE,),
        impl="llmx.plugins.blockfp.method:mxfp4",
        config="llmx.plugins.blockfp.config:MXFP4Params",
        summary="MXFP4 (OCP MX v1.0): E2M1 with a shared power-of-two scale per block of 32, weights and activations.",
        paper="OCP Microscaling Formats v1.0 (baseline)",
        requires=("cupy",),
    )
    yield MethodSpec(
        name="nvfp4",
        stages=(Stage.QUANTIZE,),
        impl="llmx.plugins.blockfp.method:nvfp4",
        config="llmx.plugins.blockfp.config:NVFP4Params",
        summary="NVFP4: E2M1 with an E4M3 scale per block of 16 and an FP32 tensor scale, weights and activations.",
        paper="NVIDIA Blackwell NVFP4 (baseline)",
        requires=("cupy",),
    )
    yield MethodSpec(
        name="int4-block",
        stages=(Stage.QUANTIZE,),
        impl="llmx.plugins.blockfp.method:int4_block",
        config="llmx.plugins.blockfp.config:Int4BlockParams",
        summary="INT4 absmax per block of 32 with a float16 scale, weights and activations.",
        paper="baseline",
        requires=("cupy",),
    )
