from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from llmx.core.quant.params import BlockQuantParams


class BlockDialectParams(BlockQuantParams):
    formatbook: str = Field("dialectfp4", description="dialectfp4 (the paper's Fig. 4, as read by a third party) or a "
                            "YAML file of 16 dialects x 8 magnitudes (multiples of 0.5, at most 7.5).")
    weight_select: Literal["mse", "two_stage"] = Field("mse", description="Weights (offline): the dialect with the "
                                                       "lowest squared error over all 16 (the paper), or two-stage.")
    act_select: Literal["two_stage", "mse"] = Field(
        "two_stage", description="Activations (online): two-stage (the block max rounded to half-units picks the "
        "pair of dialects with that max; the pair member with the lower error wins: the paper does not state its "
        "stage-2 rule) or exhaustive min-MSE (the selector's oracle).")
    overflow: Literal["clamp", "bump"] = Field(
        "clamp", description="A scaled block max in (7.75, 8) rounds to 8, above every dialect: keep the exponent "
        "and saturate at 7.5 (clamp), or take the next exponent (bump). The paper does not say.")

    @field_validator("formatbook")
    @classmethod
    def _formatbook(cls, v: str) -> str:
        from llmx.errors import UsageError
        from llmx.plugins.blockdialect import formatbook

        try:
            formatbook.load(v)
        except UsageError as exc:
            raise ValueError(exc.message) from None
        return v
