from llmx.core.compare.spec import Arm, ComparisonSpec
from llmx.core.models.archs import ATTENTION_KINDS
from llmx.core.spec import MethodSpec, Stage
from llmx.hookspecs import hookimpl


@hookimpl
def llmx_methods():
    yield MethodSpec(
        name="blockdialect",
        aliases=("bd", "dialectfp4"),
        stages=(Stage.QUANTIZE,),
        impl="llmx.plugins.blockdialect.method:run",
        config="llmx.plugins.blockdialect.config:BlockDialectParams",
        summary="BlockDialect: a per-block FP4 dialect from a 16-entry formatbook, MX exponent, integer-MAC values; "
                "weights exhaustive, activations two-stage, optionally the attention matmuls (full path).",
        paper="Jang & Tambe, ICML 2025 (arXiv 2501.01144)",
        requires=("cupy",),
    )


def _full_path(method: str, **params) -> dict:
    """W4A4 on the full path (every linear's weights and inputs, the attention QK^T and PV operands), as the paper."""
    return {"method": method, "params": {"bits": "w4a4", "save": False, **params}}


@hookimpl
def llmx_comparisons():
    yield ComparisonSpec(
        name="blockdialect",
        summary="BlockDialect (DialectFP4, b32, 4.375 bits) against MXFP4 (b32 4.25 bits, b16 4.5), NVFP4 (b16, 4.5) "
                "and INT4 absmax (b32, 4.5), W4A4 on the full path: held-out perplexity windows paired across arms.",
        paper="Jang & Tambe, ICML 2025 (arXiv 2501.01144): full-path W4A4 against MXFP4 (WikiText2 perplexity, "
              "zero-shot accuracy; +10.78% / +7.48% on Llama-3-8B / Llama-2-7B)",
        target="blockdialect",
        baselines=("mxfp4-b32", "mxfp4-b16", "nvfp4-b16", "int4-b32"),
        arms=(Arm("float16", family="float", cost=16.0),
              Arm("mxfp4-b32", (_full_path("mxfp4", block_size=32),)),
              Arm("mxfp4-b16", (_full_path("mxfp4", block_size=16),)),
              Arm("nvfp4-b16", (_full_path("nvfp4", block_size=16),)),
              Arm("int4-b32", (_full_path("int4-block", block_size=32),)),
              Arm("blockdialect", (_full_path("blockdialect"),))),
        evaluation={"method": "perplexity", "params": {"max_tokens": 16384}},
        tolerance=0.25,
        # no calibration and no randomness: every seed would repeat the same runs
        seeds=(0,),
        quick={"max_tokens": 256},
        model="ref:llama-bench", data={"source": "stdlib", "seq_len": 128}, kinds=ATTENTION_KINDS)
