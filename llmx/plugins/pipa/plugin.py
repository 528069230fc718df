from llmx.core.spec import MethodSpec, Stage
from llmx.hookspecs import hookimpl


@hookimpl
def llmx_methods():
    yield MethodSpec("pipa", (Stage.ALIGN,), "llmx.plugins.pipa.objective:pipa",
                     "llmx.plugins.pipa.config:PIPAParams", aliases=("pipa-m", "pipa-n"),
                     summary="PIPA: preference alignment as prior-informed MLE (PIPA-M / PIPA-N; paired, unpaired, "
                     "step-level).", paper="Li, Wang, Liu, ICML 2025 (arXiv 2502.05773)")
