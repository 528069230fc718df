"""Built-in model and dataset sources: ``tiny:*`` random-init models, the ``stdlib`` code corpus."""

from llmx.core.spec import DatasetSpec, ModelSpec
from llmx.hookspecs import hookimpl

TINY = {
    "llama": "Llama (GQA, RoPE), 2 layers, width 64",
    "mamba": "Mamba1, 2 layers, width 64 (mambapy scan)",
    "mamba2": "Mamba2, 2 layers, width 64, head dim 16",
    "moe": "Mixtral-style MoE, 4 experts top-2, 2 layers, width 64",
}


@hookimpl
def llmx_models():
    for arch, summary in TINY.items():
        yield ModelSpec(f"tiny:{arch}", f"llmx.plugins.builtin_models:tiny_{arch}", f"random init: {summary}")


@hookimpl
def llmx_datasets():
    yield DatasetSpec("stdlib", "llmx.core.data.stdlib:documents",
                      "the Python standard library's own source (train/validation split by path hash)")


def _tiny(arch):
    def build(dtype: str = "float32", device: str = "cpu"):
        from llmx.core.models.tiny import build as _build

        return _build(arch, dtype=dtype, device=device)

    return build


tiny_llama, tiny_mamba, tiny_mamba2, tiny_moe = (_tiny(a) for a in TINY)
