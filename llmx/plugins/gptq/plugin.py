from llmx.core.compare.spec import Arm, ComparisonSpec
from llmx.core.spec import MethodSpec, Stage
from llmx.hookspecs import hookimpl


@hookimpl
def llmx_methods():
    yield MethodSpec(
        name="gptq",
        stages=(Stage.QUANTIZE,),
        impl="llmx.plugins.gptq.method:run",
        config="llmx.plugins.gptq.config:GPTQParams",
        summary="GPTQ: second-order weight quantization from calibration Hessians (block-wise lazy updates).",
        paper="Frantar et al., ICLR 2023 (baseline)",
        requires=("cupy",),
    )


def _quant(method: str, bits: str, **extra) -> dict:
    """Asymmetric, group 128: each method at its strongest common setting (GPTQ with act-order)."""
    return {"method": method, "params": {"bits": bits, "group_size": 128, "symmetric": False, "save": False, **extra}}


@hookimpl
def llmx_comparisons():
    yield ComparisonSpec(
        name="gptq",
        summary="GPTQ against round-to-nearest at the same bits (3-bit judged; 4-bit and float16 drawn): held-out "
                "perplexity windows paired across arms.",
        paper="Frantar et al., ICLR 2023, Table 3 (RTN vs GPTQ on OPT/BLOOM, 3 and 4 bits)",
        target="gptq-w3", baselines=("rtn-w3",),
        arms=(Arm("float16", family="float", cost=16.0),
              Arm("rtn-w4", (_quant("rtn", "w4a16"),)), Arm("gptq-w4", (_quant("gptq", "w4a16", actorder=True),)),
              Arm("rtn-w3", (_quant("rtn", "w3a16"),)), Arm("gptq-w3", (_quant("gptq", "w3a16", actorder=True),))),
        evaluation={"method": "perplexity", "params": {"max_tokens": 16384}},
        quick={"calib_samples": 8, "group_size": 32, "max_tokens": 2048},
        model="ref:llama", data={"source": "stdlib", "seq_len": 128})
