from llmx.core.compare.arms import strongest_gptq, strongest_int
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


@hookimpl
def llmx_comparisons():
    yield ComparisonSpec(
        name="gptq",
        summary="GPTQ at its strongest (asymmetric g128, act-order, true-sequential, percdamp 0.01) against "
                "round-to-nearest in the same format, so the same stored bits (3-bit judged; 4-bit and float16 "
                "drawn): held-out perplexity windows paired across arms.",
        paper="Frantar et al., ICLR 2023, Table 3 (RTN vs GPTQ on OPT/BLOOM, 3 and 4 bits)",
        target="gptq-w3", baselines=("rtn-w3",),
        arms=(Arm("float16", family="float", cost=16.0),
              Arm("rtn-w4", (strongest_int("rtn", "w4a16"),)), Arm("gptq-w4", (strongest_gptq("w4a16"),)),
              Arm("rtn-w3", (strongest_int("rtn", "w3a16"),)), Arm("gptq-w3", (strongest_gptq("w3a16"),))),
        evaluation={"method": "perplexity", "params": {"max_tokens": 16384}},
        quick={"calib_samples": 8, "group_size": 32, "max_tokens": 2048},
        model="ref:llama", data={"source": "stdlib", "seq_len": 128})
