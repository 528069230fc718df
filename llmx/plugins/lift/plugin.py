from llmx.core.spec import MethodSpec, Stage
from llmx.hookspecs import hookimpl


@hookimpl
def llmx_methods():
    yield MethodSpec("lift", (Stage.TRAIN,), "llmx.plugins.lift.method:run", "llmx.plugins.lift.config:LiftParams",
                     summary="LIFT: sparse fine-tuning of the principal weights (top-k of a rank-f SVD filter) at a "
                     "LoRA-sized budget; magnitude and random supports as baselines.",
                     paper="Liu et al., ICML 2025 (arXiv 2506.00772)")
