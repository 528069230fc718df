from llmx.core.spec import MethodSpec, Stage
from llmx.hookspecs import hookimpl


@hookimpl
def llmx_methods():
    yield MethodSpec(
        name="compressed-tensors",
        stages=(Stage.EXPORT,),
        impl="llmx.plugins.export.method:run",
        config="llmx.plugins.export.config:CompressedTensorsParams",
        summary="Write the quantized model as a compressed-tensors folder (W4A16 pack-quantized, W8A8 int-quantized) "
                "that plain transformers loads (the llm-compressor checkpoint format).",
        paper="format",
        requires=("compressed_tensors",),
    )
