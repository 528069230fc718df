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
