from llmx.core.spec import MethodSpec, Stage
from llmx.hookspecs import hookimpl
from llmx.plugins.pipa.config import PIPAParams


@hookimpl
def llmx_methods():
    yield MethodSpec("pipa", (Stage.ALIGN,), "llmx.plugins.pipa.objective:pipa", PIPAParams, aliases=("pipa-m", "pipa-n"),
                     summary="PIPA: preference alignment as prior-informed MLE (PIPA-M / PIPA-N; paired, unpaired, "
                     "step-level).", paper="Li, Wang, Liu, ICML 2025 (arXiv 2502.05773)")
