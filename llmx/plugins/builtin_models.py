"""Built-in model, dataset and layer sources: ``tiny:*`` random-init models, ``ref:*`` trained reference models, and
the ``stdlib`` code and ``pydoc`` prose corpora."""

from llmx.core.spec import DatasetSpec, LayerSpec, ModelSpec
from llmx.core.zoo.presets import DEFAULT_PRESET, PRESETS
from llmx.hookspecs import hookimpl

ARCH_SUMMARY = {
    "gpt2": "GPT-2 (learned positions, fused c_attn)",
    "llama": "Llama (GQA, RoPE)",
    "mamba": "Mamba1 (mambapy parallel scan)",
    "mamba2": "Mamba2",
    "moe": "Mixtral-style MoE, 4 experts top-2",
    "opt": "OPT (learned positions, biases: no RoPE)",
    "qwen2": "Qwen2 (GQA, biased q/k/v, RoPE)",
}
PRESET_SUMMARY = {
    "small": "trained on standard-library code, minutes on a CPU (small preset)",
    "bench": "trained longer for benchmarks (bench preset)",
    "long": "1024-token contexts (long preset)",
    "medium": "6 layers, width 384 (medium preset)",
    "code": "trained on the standard library plus weak and safe API calls at even odds, ProSec's target (code preset)",
    "test": "trained for seconds, for tests (test preset)",
}


@hookimpl
def llmx_models():
    for arch, summary in ARCH_SUMMARY.items():
        yield ModelSpec(f"tiny:{arch}", "llmx.core.models.archs:load_tiny", f"random init: {summary}, 2 layers, width 64")
        for preset, how in PRESET_SUMMARY.items():
            if arch in PRESETS[preset]:
                yield ModelSpec(f"ref:{arch}{'' if preset == DEFAULT_PRESET else '-' + preset}", "llmx.core.zoo:load",
                                f"{summary}, {how}")
    for preset in ("small", "test"):
        yield ModelSpec(f"ref:llava{'' if preset == DEFAULT_PRESET else '-' + preset}", "llmx.core.zoo:load",
                        f"tiny LLaVA (CLIP tower, mlp2x_gelu projector, Llama) on digit scenes in six languages, "
                        f"{PRESET_SUMMARY[preset].split(', ')[-1] if preset == 'test' else 'minutes on a CPU'}")
    yield ModelSpec("ref:*", "llmx.core.zoo:load", "a reference model you built: llmx zoo build ARCH --name NAME")


@hookimpl
def llmx_datasets():
    yield DatasetSpec("stdlib", "llmx.core.data.stdlib:documents",
                      "the Python standard library's own source (train/validation split by path hash)")
    yield DatasetSpec("pydoc", "llmx.core.data.pydoc:documents",
                      "English reference prose shipped with Python (pydoc_data.topics; split by topic hash)")


@hookimpl
def llmx_layers():
    yield LayerSpec("quant_linear", "llmx.core.quant.qlinear:QuantLinear.rebuild", "packed integer linear (RTN, GPTQ)")
    yield LayerSpec("block_linear", "llmx.core.quant.blocklinear:BlockQuantLinear.rebuild",
                    "block-format linear (MXFP4, NVFP4, INT4 blocks, BlockDialect)")
    yield LayerSpec("lut_linear", "llmx.core.quant.lut:LUTLinear.rebuild", "per-row codebook linear (LNQ, SqueezeLLM)")
    yield LayerSpec("block_attention", "llmx.core.quant.blockattn:BlockAttention.rebuild",
                    "block-format QK and PV attention matmuls")
