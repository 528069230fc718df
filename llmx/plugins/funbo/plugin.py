from llmx.core.spec import MethodSpec, Stage
from llmx.hookspecs import hookimpl

PAPER = "Aglietti et al., ICML 2025 (PMLR 267:639-661)"


@hookimpl
def llmx_methods():
    yield MethodSpec("funbo", (Stage.ANALYZE,), "llmx.plugins.funbo.method:analyze", "llmx.plugins.funbo.config:FunboParams",
                     summary="FunBO: evolve a Bayesian-optimisation acquisition function as code (FunSearch's islands "
                     "and prompt, a sandboxed BO evaluator); samplers hf, openai, or offline mutation.", paper=PAPER)
    yield MethodSpec("acquisition", (Stage.EVAL,), "llmx.plugins.funbo.method:acquisition",
                     "llmx.plugins.funbo.config:AcquisitionParams",
                     summary="Score an acquisition function (a .py file or EI, UCB, PI, mean, random) by BO on a "
                     "function set: normalised regret, FunBO's score, paired wins and a Wilcoxon p.", paper="evaluation")
