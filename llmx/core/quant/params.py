"""Parameters shared by the weight-quantization methods (RTN, GPTQ, and the papers' methods built on them).
No torch import here: method listings load this module."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from llmx.core.quant.bits import BitSpec, parse_bits
from llmx.core.refs import TextSource
from llmx.core.spec import Params
from llmx.errors import UsageError


class BitsParams(Params):
    """A ``bits`` field checked against the class's ``BITS``; the error names the valid values."""

    BITS: ClassVar[tuple[str, ...]] = ()

    bits: str = Field("w4a16", description="w<N>a<M>: weight bits, activation bits (16 = not quantized).")

    @field_validator("bits")
    @classmethod
    def _bits(cls, v: str) -> str:
        try:
            return str(parse_bits(v, cls.BITS))
        except UsageError as exc:
            raise ValueError(exc.message) from None

    @property
    def bitspec(self) -> BitSpec:
        return parse_bits(self.bits, self.BITS)


class GridParams(Params):
    grid: Literal["full", "restricted"] = Field("full", description="Symmetric integer grid: full uses all 2^b codes "
                                                "(scale = absmax / ((2^b - 1) / 2), as the reference GPTQ code, "
                                                "compressed-tensors and Quamba2's code); restricted leaves -2^(b-1) "
                                                "unused (scale = absmax / (2^(b-1) - 1)).")


class WeightQuantParams(BitsParams, GridParams):
    BITS: ClassVar[tuple[str, ...]] = ("w8a16", "w4a16", "w3a16", "w2a16", "w8a8")

    group_size: int | None = Field(None, ge=-1, description="Input channels per scale; -1 per output channel, 0 per "
                                   "tensor. Default: 128 for weight-only, per channel for W8A8.")
    symmetric: bool = Field(True, description="Symmetric codes (no zero point).")
    act_scale: Literal["dynamic", "static"] = Field("dynamic", description="A8: per-token scales at run time, or one "
                                                    "per-tensor scale calibrated offline.")
    skip: list[str] = Field(["lm_head"], description="Linear layers whose name contains any of these stay in float.")
    calib_samples: int = Field(64, gt=0, description="Calibration windows (GPTQ Hessians, static activation scales).")
    calib_seq_len: int = Field(256, gt=1)
    calib_source: TextSource | None = Field(None, description="Calibration text; default: the run's data.source (train split).")
    save: bool = Field(True, description="Save the packed model as a run artifact (reloadable with --model).")

    @model_validator(mode="after")
    def _w8a8(self) -> WeightQuantParams:
        if self.bitspec.act == 8 and (self.group_size not in (None, -1) or not self.symmetric):
            raise ValueError("W8A8 uses symmetric per-channel weights: leave group_size unset (or -1), symmetric true")
        return self

    def format(self, in_features: int):
        """The ``IntFormat`` for a layer of this width (a group larger than the layer becomes per channel)."""
        from llmx.core.quant.formats import IntFormat

        g = self.group_size
        if g is None:
            g = -1 if self.bitspec.act == 8 else 128
        group = None if g == -1 or g >= in_features else g
        return IntFormat(self.bitspec.weight, group, self.symmetric, self.grid == "full")


BLOCK_TARGETS = ("linear", "attn_qk", "attn_pv")


class BlockQuantParams(BitsParams):
    """Block-format quantization (MXFP4, NVFP4, INT4 blocks, BlockDialect): weights offline, activations online, both
    blocked along the reduction axis."""

    BITS: ClassVar[tuple[str, ...]] = ("w4a16", "w4a4")

    bits: str = Field("w4a4", description="w4a16 (weights only) or w4a4 (weights and every quantized matmul's "
                      "activations).")
    block_size: int = Field(32, gt=0, multiple_of=8, description="Elements per block along the reduction axis.")
    targets: list[Literal["linear", "attn_qk", "attn_pv"]] | None = Field(
        None, description="What to quantize: linear layers, the attention QK^T and PV matmuls. Default: all three "
        "(the full path) at w4a4, linear at w4a16.")
    skip: list[str] = Field(["lm_head"], description="Linear layers whose name contains any of these stay in float.")
    save: bool = Field(True, description="Save the packed model as a run artifact (reloadable with --model).")

    @model_validator(mode="after")
    def _targets(self) -> BlockQuantParams:
        attn = set(self.targets or ()) - {"linear"}
        if attn and self.bitspec.act == 16:
            raise ValueError(f"{', '.join(sorted(attn))} quantize activations: use bits w4a4")
        if self.targets is not None and not self.targets:
            raise ValueError("targets is empty: name linear, attn_qk and/or attn_pv")
        return self

    @property
    def resolved_targets(self) -> tuple[str, ...]:
        if self.targets is not None:
            return tuple(dict.fromkeys(self.targets))
        return BLOCK_TARGETS if self.bitspec.act < 16 else ("linear",)
