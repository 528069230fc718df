from llmx.core.spec import MethodSpec, Stage
from llmx.hookspecs import hookimpl


@hookimpl
def llmx_methods():
    yield MethodSpec("confpo", (Stage.ALIGN,), "llmx.plugins.confpo.objective:confpo", "llmx.plugins.confpo.config:ConfPOParams",
                     summary="ConfPO: SimPO (or DPO) on the tokens the policy is least confident about.",
                     paper="Yoon et al., ICML 2025")
