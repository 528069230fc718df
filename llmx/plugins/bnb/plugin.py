from llmx.core.compare.arms import strongest_gptq, strongest_int
from llmx.core.compare.spec import Arm, ComparisonSpec
from llmx.core.spec import LayerSpec, MethodSpec, Stage
from llmx.hookspecs import hookimpl


@hookimpl
def llmx_methods():
    yield MethodSpec(
        name="bnb",
        aliases=("bitsandbytes", "nf4"),
        stages=(Stage.QUANTIZE,),
        impl="llmx.plugins.bnb.method:run",
        config="llmx.plugins.bnb.config:BnbParams",
        summary="bitsandbytes NF4/FP4 weight-only or LLM.int8 quantization (a real library baseline; runs on CPU).",
        paper="Dettmers et al., 2022/2023 (baseline)",
        requires=("bitsandbytes",),
    )


@hookimpl
def llmx_layers():
    yield LayerSpec("bnb_linear4bit", "llmx.plugins.bnb.layers:rebuild4", "bitsandbytes 4-bit linear (NF4/FP4)")
    yield LayerSpec("bnb_linear8bit", "llmx.plugins.bnb.layers:rebuild8", "bitsandbytes LLM.int8() linear")


def _nf4(blocksize: int) -> dict:
    return {"method": "bnb", "params": {"bits": "w4a16", "quant_type": "nf4", "blocksize": blocksize, "save": False}}


@hookimpl
def llmx_comparisons():
    yield ComparisonSpec(
        name="quant",
        summary="The weight-only 4-bit baselines, matched from below (no judged baseline stores more bits per "
                "weight, scales and zeros included, than the target's 4.19 on this model's widths): GPTQ at its "
                "strongest (asymmetric g128, act-order, true-sequential, percdamp 0.01) against round-to-nearest "
                "(asymmetric g128, the same 4.19) and bitsandbytes NF4 (block 128, double quantization: 4.16); NF4 "
                "block 64 (4.22, above the target), 8-bit RTN, LLM.int8 and float16 drawn. Held-out perplexity "
                "windows paired.",
        paper="Frantar et al., ICLR 2023 (GPTQ); Dettmers et al., NeurIPS 2023 (QLoRA's NF4): the baselines the "
              "quantization papers compare with",
        target="gptq-w4", baselines=("rtn-w4", "nf4-b128"),
        arms=(Arm("float16", family="float", cost=16.0),
              Arm("rtn-w8", ({"method": "rtn", "params": {"bits": "w8a16", "group_size": -1, "save": False}},)),
              Arm("llm-int8", ({"method": "bnb", "params": {"bits": "w8a8", "save": False}},), family="bnb"),
              Arm("rtn-w4", (strongest_int("rtn", "w4a16"),)),
              Arm("nf4-b64", (_nf4(64),), family="bnb"), Arm("nf4-b128", (_nf4(128),), family="bnb"),
              Arm("gptq-w4", (strongest_gptq("w4a16"),))),
        evaluation={"method": "perplexity", "params": {"max_tokens": 16384}},
        tolerance=0.25,
        quick={"calib_samples": 8, "calib_seq_len": 64, "max_tokens": 512},
        model="ref:llama-bench", data={"source": "stdlib", "seq_len": 128})
