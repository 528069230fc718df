from llmx.core.spec import LayerSpec, MethodSpec, Stage
from llmx.hookspecs import hookimpl

PAPER = "Hua et al., ICML 2025 (arXiv 2412.17739)"


@hookimpl
def llmx_methods():
    yield MethodSpec("fope", (Stage.TRAIN,), "llmx.plugins.fope.method:train", "llmx.plugins.fope.config:FopeParams", paper=PAPER,
                     requires=("cupy",),
                     summary="FoPE: train a Llama-family model with Fourier position embedding (floor-clipped "
                     "frequencies, per-head Fourier series); position: rope | alibi as the baselines.")
    yield MethodSpec("length", (Stage.EVAL, Stage.ANALYZE), "llmx.plugins.fope.length:run",
                     "llmx.plugins.fope.config:LengthParams",
                     paper=PAPER, requires=("cupy",),
                     summary="Length generalisation: perplexity at 1x-8x the training length, loss by "
                     "position bucket, a copy probe; yarn_factor for RoPE + YaRN.")


@hookimpl
def llmx_layers():
    yield LayerSpec("fope_attention", "llmx.plugins.fope.attention:rebuild",
                    "Llama-family attention with FoPE tables or ALiBi biases")
