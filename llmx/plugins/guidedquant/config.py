from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from llmx.core.quant.params import WeightQuantParams


class GuidedQuantParams(WeightQuantParams):
    BITS: ClassVar[tuple[str, ...]] = ("w2a16", "w3a16", "w4a16")

    bits: str = Field("w2a16", description="w2a16, w3a16 or w4a16 (weight-only).")
    backend: Literal["lnq", "gptq", "squeezellm"] = Field(
        "lnq", description="lnq: per-row fp16 codebooks by alternating closed-form codebooks and coordinate descent; "
        "gptq: core GPTQ on each group's Hessian (integer grid, group_size as GPTQ); squeezellm: the Fisher-weighted "
        "k-means seed alone.")
    guided: bool = Field(True, description="Saliency-weighted Hessians H_g (GuidedQuant); false: plain X X^T.")
    num_groups: int = Field(4, gt=0, description="Contiguous output-channel groups, one Hessian each (official 4).")
    saliency_scale: float = Field(1e3, gt=0, description="Gradients are scaled by this before squaring (official 1e3).")
    propagate: Literal["fp", "quantized"] | None = Field(
        None, description="Hessians from full-precision inputs or through the already-quantized blocks. Default: as "
        "the official code, fp for lnq / squeezellm, quantized for gptq.")
    iterations: int = Field(3, gt=0, description="LNQ: C steps (each after a P step but the first).")
    cd_cycles: int = Field(4, gt=0, description="LNQ: coordinate-descent passes per P step.")
    cd_block: int = Field(128, gt=0, description="LNQ: columns per lazy cross-term update.")
    ridge: float = Field(1e-7, ge=0, description="LNQ: ridge of the closed-form codebook solve.")
    damp_start: float = Field(1e-5, gt=0, description="Damping (x mean diag, tenfold) only if Cholesky fails.")
    block_size: int = Field(128, gt=0, description="GPTQ backend: columns per lazy-update block.")
    percdamp: float = Field(0.01, ge=0, description="GPTQ backend: dampening, as a fraction of mean(diag H).")
    actorder: bool = Field(False, description="GPTQ backend: quantize columns by descending diag(H).")
    static_groups: bool = Field(False, description="GPTQ backend: fix group scales before the updates.")

    @property
    def resolved_propagate(self) -> str:
        return self.propagate or ("quantized" if self.backend == "gptq" else "fp")

    def onload_problem(self) -> str | None:
        """Plain Hessians are built block by block (``onload`` works); saliency needs a backward pass through the
        whole model."""
        if self.guided or self.backend != "gptq":
            return "its saliency is a backward pass through the whole model (onload takes backend gptq, guided false)"
        return None

    @model_validator(mode="after")
    def _per_tensor(self) -> GuidedQuantParams:
        if self.backend == "gptq" and self.group_size == 0:
            raise ValueError("the gptq backend splits rows into groups: per-tensor scales (group_size 0) cannot follow")
        return self
