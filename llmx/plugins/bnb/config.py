from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator

from llmx.core.quant.params import BitsParams


class BnbParams(BitsParams):
    BITS: ClassVar[tuple[str, ...]] = ("w4a16", "w8a8")

    bits: str = Field("w4a16", description="w4a16: NF4/FP4 weights; w8a8: LLM.int8 (int8 matmul, fp outliers).")
    quant_type: Literal["nf4", "fp4"] = Field("nf4", description="4-bit data type.")
    blocksize: int = Field(64, description="4-bit: weights per absmax block (bitsandbytes' default 64).")
    double_quant: bool = Field(True, description="4-bit: quantize the absmax statistics too (bitsandbytes default).")
    threshold: float = Field(6.0, ge=0, description="int8: activation outlier threshold kept in float.")
    skip: list[str] = Field(["lm_head"], description="Linear layers whose name contains any of these stay in float.")
    save: bool = Field(True, description="Save the model as a run artifact (reloadable with --model).")

    @field_validator("blocksize")
    @classmethod
    def _blocksize(cls, v: int) -> int:
        if v not in (32, 64, 128, 256, 512, 1024, 2048, 4096):
            raise ValueError("blocksize must be a power of two from 32 to 4096")
        return v
