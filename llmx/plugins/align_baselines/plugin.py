from llmx.core.spec import MethodSpec, Stage
from llmx.hookspecs import hookimpl


@hookimpl
def llmx_methods():
    yield MethodSpec("dpo", (Stage.ALIGN,), "llmx.plugins.align_baselines.objectives:dpo",
                     "llmx.plugins.align_baselines.config:DPOParams",
                     summary="Direct Preference Optimization on paired data (baseline).", paper="Rafailov et al., 2023")
    yield MethodSpec("ipo", (Stage.ALIGN,), "llmx.plugins.align_baselines.objectives:ipo",
                     "llmx.plugins.align_baselines.config:IPOParams",
                     summary="IPO: squared loss to a fixed log-ratio margin on paired data (baseline).",
                     paper="Azar et al., 2024")
    yield MethodSpec("simpo", (Stage.ALIGN,), "llmx.plugins.align_baselines.objectives:simpo",
                     "llmx.plugins.align_baselines.config:SimPOParams",
                     summary="SimPO: reference-free, length-normalised, with a target margin (baseline).",
                     paper="Meng et al., 2024")
    yield MethodSpec("kto", (Stage.ALIGN,), "llmx.plugins.align_baselines.objectives:kto",
                     "llmx.plugins.align_baselines.config:KTOParams",
                     summary="KTO on unpaired desirable / undesirable data (baseline).", paper="Ethayarajh et al., 2024")


@hookimpl
def llmx_comparisons():
    from llmx.core.compare.spec import Arm, ComparisonSpec
    from llmx.core.train.align.comparison import COMMON, aligned

    yield ComparisonSpec(
        name="align",
        summary="The preference baselines' own family at equal steps, data, batch and rate: DPO (beta 0.1) against "
                "IPO, SimPO and KTO, each at its best strength in bench_align; the brackets task's held-out "
                "preferred rate per prompt, KL from the starting model drawn.",
        paper="llmx's cross-method table (benchmarks/bench_align.py; Rafailov et al. 2023, Azar et al. 2024, "
              "Meng et al. 2024, Ethayarajh et al. 2024)",
        target="dpo", baselines=("ipo", "simpo", "kto"),
        arms=(Arm("start", family="start"),
              Arm("dpo", aligned("dpo", beta=0.1), family="dpo"),
              Arm("ipo", aligned("ipo", beta=0.1), family="ipo"),
              Arm("simpo", aligned("simpo", beta=1.0, gamma=0.5), family="simpo"),
              Arm("kto", aligned("kto", beta=0.3), family="kto")),
        **COMMON)
