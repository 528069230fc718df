"""BlockDialect (Jang & Tambe, ICML 2025, arXiv 2501.01144): per block of 32 along the reduction axis, the MX shared
exponent (Sec. 3.1) and one of the formatbook's 16 dialects (a 4-bit id), each element a sign and a 3-bit index into
it: 4 + (8 + 4) / 32 = 4.375 bits with an E8M0 exponent.

- Weights, offline: the dialect with the lowest squared error (exhaustive over 16; Sec. 3.2).
- Activations, online, two stages (Sec. 3.3): the scaled block max rounded to half-units selects the two dialects
  with that max; the member with the lower error is kept (the paper's stage-2 rule is not given: ``act_select``).
- Full path (Sec. 4): the linears and the attention QKᵀ and PV matmuls (``targets``).

Deviations, each an option: the formatbook values are a third party's reading of Fig. 4 (``formatbook``); a scaled
max in (7.75, 8) saturates at 7.5 (``overflow: clamp``) unless ``bump``.
"""

from __future__ import annotations

from llmx.core.context import RunContext
from llmx.core.quant import blockapply
from llmx.core.quant.blockfp import BlockFormat
from llmx.plugins.blockdialect import formatbook
from llmx.plugins.blockdialect.config import BlockDialectParams


def formats(p: BlockDialectParams) -> tuple[BlockFormat, BlockFormat]:
    """(weight format, activation format) for the run's parameters."""
    book = formatbook.load(p.formatbook)
    base = BlockFormat("blockdialect", book, p.block_size, "e8m0", overflow=p.overflow)
    return base.with_(select=p.weight_select), base.with_(select=p.act_select)


def run(ctx: RunContext, p: BlockDialectParams) -> dict:
    weight, act = formats(p)
    return blockapply.run(ctx, p, "blockdialect", weight, act)
