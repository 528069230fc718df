from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from llmx.core.spec import Params
from llmx.core.train.params import LoopParams

Target = Literal["qk", "vo"]


class CloverPruneParams(Params):
    ratio: float = Field(0.5, ge=0.0, lt=1.0, description="Fraction of each head's dims removed (0 = transform only).")
    layer_keep: list[int] | None = Field(None, description="Per-layer budget: dims kept per head, one entry per "
                                         "attention layer (overrides ratio).")
    targets: list[Target] | None = Field(None, description="Pairs to prune: vo, and qk where no RoPE sits between Q "
                                         "and K. Default: every pair the architecture allows.")
    criterion: Literal["clover", "vanilla"] = Field("clover", description="clover: SVD of the pair's product; "
                                                    "vanilla: the original dims ranked by their norm product.")
    save: bool = Field(True, description="Save the pruned model (smaller head dims) as a run artifact.")

    @model_validator(mode="after")
    def _budget(self) -> CloverPruneParams:
        if self.layer_keep is not None and any(k < 1 for k in self.layer_keep):
            raise ValueError("layer_keep entries must be at least 1")
        return self


class CloverTrainParams(LoopParams):
    basis: Literal["svd", "raw"] = Field("svd", description="svd: CLOVER (orthogonalise, then train a core between "
                                         "the frozen singular vectors); raw: the same budget on the current vectors "
                                         "(the vanilla baseline).")
    targets: list[Target] | None = Field(None, description="Pairs whose cores train (default: all the model allows).")
    lr: float = Field(1e-3, gt=0)
    schedule: Literal["cosine", "linear", "constant", "wsd"] = "linear"
    min_lr_ratio: float = Field(0.0, ge=0, le=1)
    seq_len: int = Field(128, gt=1)
    eval_windows: int = Field(32, gt=0, description="Held-out windows for the loss before and after.")
    save: bool = Field(True, description="Save the merged model (no extra parameters) as a run artifact.")
