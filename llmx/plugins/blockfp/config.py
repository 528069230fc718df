from __future__ import annotations

from typing import Literal

from pydantic import Field

from llmx.core.quant.params import BlockQuantParams


class MXFP4Params(BlockQuantParams):
    """OCP MXFP4: E2M1 elements, one E8M0 power-of-two scale per block of 32 (4.25 bits; 16 gives 4.5)."""


class NVFP4Params(BlockQuantParams):
    """NVFP4: E2M1 elements, an E4M3 scale per block of 16 times an FP32 tensor scale (4.5 bits)."""

    block_size: int = Field(16, gt=0, multiple_of=8, description="Elements per block along the reduction axis.")
    act_tensor_scale: Literal["tensor", "row"] = Field(
        "tensor", description="The activations' FP32 scale: the amax of each call's whole input (torchao's dynamic "
        "recipe; a token's codes then depend on its batch) or one per row (per token).")


class Int4BlockParams(BlockQuantParams):
    """INT4 absmax per block of 32 (codes -7..7, a float16 scale per block: 4.5 bits)."""
