from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from llmx.core.quant.params import WeightQuantParams


class GPTQParams(WeightQuantParams):
    block_size: int = Field(128, gt=0, description="Columns per lazy-update block.")
    percdamp: float = Field(0.01, ge=0, description="Dampening, as a fraction of mean(diag H).")
    actorder: bool = Field(False, description="Quantize columns by descending diag(H); with groups, scales are static.")
    static_groups: bool = Field(False, description="Fix group scales from the original weights before the updates.")
    group_scale: Literal["block_start", "updated"] = Field(
        "block_start", description="Non-static groups: a group's range from its columns as they stood when the current "
        "lazy block began (the reference code) or as updated so far, the block's own updates included. The same "
        "when every group starts a block (group_size a multiple of block_size).")
    log_objectives: bool = Field(False, description="Diagnostic only (changes no result): each layer's objective "
                                 "tr(dW H dW^T) for GPTQ and for RTN on the same Hessian, logged, with their mean and "
                                 "max ratio in the metrics (objective_vs_rtn_mean/max). Two [out, in] x [in, in] "
                                 "products per layer, so off by default.")
    propagate: Literal["quantized", "fp"] = Field("quantized", description="Hessians from inputs that pass through the "
                                                  "already-quantized blocks (GPTQ, Quamba) or through the FP model.")
    true_sequential: bool = Field(False, description="Quantize a block's layers group by group in call order (q/k/v, "
                                  "o, gate/up, down), each group's Hessian from inputs through the block's already "
                                  "quantized groups (the reference llama.py's --true-sequential; off there too). "
                                  "One block pass per group; needs propagate: quantized.")

    @model_validator(mode="after")
    def _true_sequential(self) -> GPTQParams:
        if self.true_sequential and self.propagate != "quantized":
            raise ValueError("true_sequential recomputes a block's inputs from its quantized layers: use propagate: "
                             "quantized")
        return self

    def onload_problem(self) -> str | None:
        """None: GPTQ calibrates and quantizes block by block, so it runs with ``onload`` (see RunConfig)."""
        return None
