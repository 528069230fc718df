from llmx.core.spec import MethodSpec, Stage
from llmx.hookspecs import hookimpl


@hookimpl
def llmx_methods():
    yield MethodSpec("pipa", (Stage.ALIGN,), "llmx.plugins.pipa.objective:pipa",
                     "llmx.plugins.pipa.config:PIPAParams", aliases=("pipa-m", "pipa-n"),
                     summary="PIPA: preference alignment as prior-informed MLE (PIPA-M / PIPA-N; paired, unpaired, "
                     "step-level).", paper="Li, Wang, Liu, ICML 2025 (arXiv 2502.05773)")


@hookimpl
def llmx_comparisons():
    from llmx.core.compare.spec import Arm, ComparisonSpec
    from llmx.core.train.align.comparison import COMMON, aligned

    note = ("the target is the paper's method, pair_mode: independent (the default: each side a labelled sample, g "
            "learned), not pair_mode: conditional, which is DPO with beta 1 (g cancels)")
    yield ComparisonSpec(
        name="pipa",
        summary="PIPA-N on pairs (pair_mode: independent) against DPO and IPO at equal steps, data, batch and rate: "
                "the brackets task's held-out preferred rate per prompt, KL from the starting model drawn. " + note
                + ".",
        paper="Li, Wang, Liu, ICML 2025, answer-level paired results (PIPA vs DPO and IPO)",
        target="pipa-n", baselines=("dpo", "ipo"),
        arms=(Arm("start", family="start"),
              Arm("dpo", aligned("dpo", beta=0.1), family="dpo"),
              Arm("ipo", aligned("ipo", beta=0.1), family="ipo"),
              Arm("pipa-n", aligned("pipa", variant="n", pair_mode="independent"), family="pipa")),
        **COMMON)
    yield ComparisonSpec(
        name="pipa-unpaired",
        summary="PIPA-N on unpaired labelled samples against KTO at equal steps, data, batch and rate: the brackets "
                "task's held-out preferred rate per prompt, KL from the starting model drawn.",
        paper="Li, Wang, Liu, ICML 2025, answer-level unpaired results (PIPA vs KTO)",
        target="pipa-n", baselines=("kto",),
        arms=(Arm("start", family="start"),
              Arm("kto", aligned("kto", beta=0.3), family="kto"),
              Arm("pipa-n", aligned("pipa", variant="n", run_rows="unpaired"), family="pipa")),
        **COMMON)
