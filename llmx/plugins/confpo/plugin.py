from llmx.core.spec import MethodSpec, Stage
from llmx.hookspecs import hookimpl


@hookimpl
def llmx_methods():
    yield MethodSpec("confpo", (Stage.ALIGN,), "llmx.plugins.confpo.objective:confpo", "llmx.plugins.confpo.config:ConfPOParams",
                     summary="ConfPO: SimPO (or DPO) on the tokens the policy is least confident about.",
                     paper="Yoon et al., ICML 2025")


@hookimpl
def llmx_comparisons():
    from llmx.core.compare.spec import Arm, ComparisonSpec
    from llmx.core.train.align.comparison import COMMON, aligned

    official = {"beta": 1.5, "gamma": 1.6}  # the official run_confpo.sh, and its SimPO baseline script's
    yield ComparisonSpec(
        name="confpo",
        summary="ConfPO (SimPO on the low-confidence tokens) against SimPO at the same official beta 1.5 / gamma 1.6 "
                "and DPO (beta 0.1), at equal steps, data, batch and rate: the brackets task's held-out preferred "
                "rate per prompt, KL from the starting model drawn (the paper's claim is a better use of KL).",
        paper="Yoon et al., ICML 2025, Table 1 (ConfPO vs SimPO and DPO)",
        target="confpo", baselines=("simpo", "dpo"),
        arms=(Arm("start", family="start"),
              Arm("dpo", aligned("dpo", beta=0.1), family="dpo"),
              Arm("simpo", aligned("simpo", **official), family="simpo"),
              Arm("confpo", aligned("confpo", base="simpo", **official), family="confpo")),
        **COMMON)
