from llmx.core.compare.arms import strongest_gptq
from llmx.core.compare.spec import Arm, ComparisonSpec
from llmx.core.spec import MethodSpec, Stage
from llmx.hookspecs import hookimpl


@hookimpl
def llmx_methods():
    yield MethodSpec(
        name="guidedquant",
        aliases=("gq", "lnq"),
        stages=(Stage.QUANTIZE,),
        impl="llmx.plugins.guidedquant.method:run",
        config="llmx.plugins.guidedquant.config:GuidedQuantParams",
        summary="GuidedQuant: end-loss saliency-weighted Hessians per output-channel group, for LNQ (per-row "
                "codebooks), GPTQ or the SqueezeLLM seed.",
        paper="Kim et al., ICML 2025 (arXiv 2505.07004)",
        requires=("cupy",),
    )


CALIB = {"calib_samples": 128, "calib_seq_len": 128}  # the same windows for every arm (the bench presets' context)


def _stage(method: str, **params) -> dict:
    return {"method": method, "params": {"bits": "w2a16", "save": False, **CALIB, **params}}


def _gptq() -> dict:
    """GPTQ at its strongest (asymmetric g128, act-order, true-sequential; about 2.19 bits per weight, under LNQ's
    2.21 on the bench widths) on the same calibration windows."""
    stage = strongest_gptq("w2a16")
    return {**stage, "params": {**stage["params"], **CALIB}}


@hookimpl
def llmx_comparisons():
    yield ComparisonSpec(
        name="guidedquant",
        summary="LNQ + GuidedQuant (g=4) against plain LNQ, SqueezeLLM and GPTQ at its strongest (asymmetric g128, "
                "act-order, true-sequential: LNQ's bits from below) at 2 bits, weight-only, the same calibration "
                "windows: held-out perplexity windows paired.",
        paper="Kim et al., ICML 2025, Table 1 (Llama-2-7B at 2.01 bits: SqueezeLLM, LNQ, LNQ + GQuant; GPTQ)",
        target="lnq-gq-w2",
        baselines=("lnq-w2", "squeezellm-w2", "gptq-w2"),
        arms=(Arm("float16", family="float", cost=16.0),
              Arm("gptq-w2", (_gptq(),)),
              Arm("squeezellm-w2", (_stage("guidedquant", backend="squeezellm", guided=False),), family="squeezellm"),
              Arm("lnq-w2", (_stage("guidedquant", backend="lnq", guided=False),), family="lnq"),
              Arm("lnq-gq-w2", (_stage("guidedquant"),), family="lnq + guidedquant")),
        evaluation={"method": "perplexity", "params": {"max_tokens": 16384}},
        tolerance=0.25,
        # quick: one saliency group (each group runs its own k-means seed, the slow part on a loaded CPU)
        quick={"calib_samples": 4, "calib_seq_len": 64, "max_tokens": 512, "iterations": 2, "cd_cycles": 1,
               "num_groups": 1},
        model="ref:llama-bench", data={"source": "stdlib", "seq_len": 128})
