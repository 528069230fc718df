from llmx.core.spec import LayerSpec, MethodSpec, Stage
from llmx.hookspecs import hookimpl


@hookimpl
def llmx_methods():
    yield MethodSpec("quamba2", (Stage.QUANTIZE,), "llmx.plugins.quamba2.method:run", "llmx.plugins.quamba2.config:Quamba2Params",
                     summary="Quamba2: W8A8 / W4A8 / W4A16 for Mamba and Mamba2 (sort-and-cluster x, per-state-group "
                     "B/C, Hadamard rotations, GPTQ); recipe=quamba1|naive for the baselines.",
                     paper="Chiang et al., ICML 2025 (arXiv 2503.22879)", requires=("cupy",))


@hookimpl
def llmx_layers():
    yield LayerSpec("quamba2_mixer", "llmx.plugins.quamba2.mixers:rebuild", "W4A8/W8A8 Mamba mixer")
    yield LayerSpec("quamba2_head", "llmx.plugins.quamba2.head:QuantHead.rebuild", "packed lm_head (head-to-toe)")
    yield LayerSpec("quamba2_embedding", "llmx.plugins.quamba2.embedding:QuantEmbedding.rebuild", "group-quantized embedding")
