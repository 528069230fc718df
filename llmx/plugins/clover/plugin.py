from llmx.core.spec import LayerSpec, MethodSpec, Stage
from llmx.hookspecs import hookimpl


@hookimpl
def llmx_methods():
    yield MethodSpec(
        name="clover", stages=(Stage.PRUNE,), impl="llmx.plugins.clover.method:prune",
        config="llmx.plugins.clover.config:CloverPruneParams",
        summary="CLOVER: per-head SVD of the Q-K and V-O products; prune head dims by singular value.",
        paper="Meng et al., ICML 2025 (arXiv 2411.17426)",
    )
    yield MethodSpec(
        name="clover", stages=(Stage.TRAIN,), impl="llmx.plugins.clover.finetune:finetune",
        config="llmx.plugins.clover.config:CloverTrainParams",
        summary="CLOVER fine-tuning: r x r cores between frozen orthonormal vectors, merged back; LoRA / PiSSA "
                "baselines at the same budget.",
        paper="Meng et al., ICML 2025 (arXiv 2411.17426)",
    )


@hookimpl
def llmx_layers():
    yield LayerSpec("clover_attention", "llmx.plugins.clover.attention:rebuild", "attention with CLOVER-pruned head dimensions")
