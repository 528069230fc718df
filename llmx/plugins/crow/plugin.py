from llmx.core.spec import MethodSpec, Stage
from llmx.hookspecs import hookimpl


@hookimpl
def llmx_methods():
    yield MethodSpec("crow", (Stage.TRAIN,), "llmx.plugins.crow.method:run", "llmx.plugins.crow.config:CrowParams",
                     summary="CROW: backdoor removal by fine-tuning on a few clean rows with an adversarial "
                     "layer-consistency regulariser (FGSM on the input embeddings).",
                     paper="Min et al., ICML 2025 (arXiv 2411.12768)")
