"""Quamba2 parameters. Defaults follow the official code (Quamba2 notes Sec. 6) except the calibration size, scaled
down for CPU (official: 512 windows x 512 tokens for scales, 128 x 1024 for GPTQ). No torch import here."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from llmx.core.quant.params import BitsParams, GridParams
from llmx.core.refs import TextSource


class Quamba2Params(BitsParams, GridParams):
    """``grid`` applies to the W4 weights (the official GPTQ path is full-range, 2 max|w| / 15); W8 weights are
    per-tensor ``max|w| / 127`` as in the official code."""

    BITS: ClassVar[tuple[str, ...]] = ("w8a8", "w4a8", "w4a16")

    bits: str = Field("w4a8", description="w8a8: int8 per-tensor weights; w4a8: GPTQ int4 group-128 weights; both with "
                      "static int8 activations. w4a16: GPTQ int4 weights, activations in float (no reorder/calibration).")
    recipe: Literal["quamba2", "quamba1", "naive"] = Field(
        "quamba2", description="quamba2: sort-and-cluster x + per-SSD-group B/C (Mamba2 only; Mamba1 falls back to "
        "quamba1, as the official code does). quamba1: percentile-clipped per-tensor x, per-tensor B/C. naive: no "
        "rotation, per-tensor min-max scales everywhere, RTN weights (the baseline).")
    head_groups: int = Field(4, gt=0, description="Head clusters per SSD group (Ward clustering).")
    dim_groups: int = Field(4, gt=0, description="Channel groups per head group (k-means over sorted channel positions).")
    cluster_features: Literal["heads", "mean_profile"] = Field(
        "heads", description="The channel clustering's features: heads (official: each sorted position's unit-norm "
        "values in every head of the group); mean_profile: the group's mean sorted profile, 1-D (llmx before issue 67).")
    hadamard: bool = Field(True, description="Fold norms, rotate the residual stream and the out_proj input with "
                           "Walsh-Hadamard matrices (ignored by the naive recipe).")
    x_percentile: float = Field(0.9995, gt=0, le=1, description="quamba1 recipe: percentile of |x| for its scale.")
    quantize_lm_head: bool = Field(True, description="Quantize lm_head too (the official README's head-to-toe recipe).")
    quantize_embedding: bool = Field(False, description="Store the embedding as int4 rows, group_size columns per scale "
                                     "(the official --quantize_embedding flag, used by its 8B recipe).")
    group_size: int = Field(128, gt=0, description="W4: input channels per weight scale.")
    percdamp: float = Field(0.01, ge=0, description="GPTQ dampening, as a fraction of mean(diag H).")
    calib_samples: int = Field(32, gt=0, description="Calibration windows (official: 512).")
    calib_seq_len: int = Field(256, gt=1, description="Tokens per calibration window (official: 512).")
    calib_source: TextSource | None = Field(None, description="Calibration text; default: the run's data.source (train split).")
    save: bool = Field(True, description="Save the packed model as a run artifact (reloadable with --model).")
