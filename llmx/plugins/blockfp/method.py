"""The block-format baselines: the same format for weights and activations, through ``core.quant.blockapply``."""

from __future__ import annotations

from llmx.core.context import RunContext
from llmx.core.quant import blockapply, blockfp
from llmx.plugins.blockfp.config import Int4BlockParams, MXFP4Params, NVFP4Params


def mxfp4(ctx: RunContext, p: MXFP4Params) -> dict:
    fmt = blockfp.mxfp4(p.block_size)
    return blockapply.run(ctx, p, "mxfp4", fmt, fmt)


def nvfp4(ctx: RunContext, p: NVFP4Params) -> dict:
    fmt = blockfp.nvfp4(p.block_size)
    return blockapply.run(ctx, p, "nvfp4", fmt, fmt.with_(tensor_scale=p.act_tensor_scale))


def int4_block(ctx: RunContext, p: Int4BlockParams) -> dict:
    fmt = blockfp.int4(p.block_size)
    return blockapply.run(ctx, p, "int4-block", fmt, fmt)
