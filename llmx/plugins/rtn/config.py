from __future__ import annotations

from pydantic import Field, field_validator

from llmx.core.spec import Params

BITS = ("w8a16", "w4a16", "w3a16", "w2a16")


class RTNParams(Params):
    bits: str = Field("w4a16", description=f"Weight-only format, one of {', '.join(BITS)}.")
    group_size: int = Field(128, ge=-1, description="Input channels per scale; -1 means one scale per output channel.")
    symmetric: bool = Field(True, description="Symmetric (no zero point) or asymmetric codes.")
    skip: list[str] = Field(["lm_head"], description="Linear layers whose name contains any of these stay in full precision.")
    save: bool = Field(False, description="Save the quantized model (save_pretrained) as a run artifact.")

    @field_validator("bits")
    @classmethod
    def _bits(cls, v: str) -> str:
        from llmx.core.quant.bits import parse_bits
        from llmx.errors import UsageError

        try:
            return str(parse_bits(v, BITS))
        except UsageError as exc:
            raise ValueError(exc.message) from None

    @field_validator("group_size")
    @classmethod
    def _group(cls, v: int) -> int:
        if v == 0:
            raise ValueError("group_size must be positive, or -1 for per-channel")
        return v
