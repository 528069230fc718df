"""Parameters of ``train --method lift``. No torch import here: method listings load this module."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from llmx.core.refs import DataFile
from llmx.core.train.sft.params import SFTParams


class LiftParams(SFTParams):
    """The ``sft`` stage with LIFT's sparse optimiser in place of AdamW (official defaults where they fit a small
    model: the budget rank and filter rank scale with the width, see each field)."""

    data: DataFile | None = Field(None, description="Training rows (.jsonl): {prompt, completion} or {messages: "
                                  "[{role, content}]}. Default: the tracing task's first tracing_rows training "
                                  "programs, written to the run's artifacts (eval_data, unless given: as many of "
                                  "its validation programs, at most 500).")
    tracing_rows: int = Field(2000, gt=0, le=10_000, description="data left out: tracing training programs "
                              "(bench_lift.py's 2,000, the paper's small-data regime).")
    lr: float = Field(2e-4, gt=0, description="Peak learning rate (official: 2e-4 on the math configs).")
    warmup: int = Field(10, ge=0, description="Linear warmup steps (official: 3% of the steps).")
    schedule: Literal["cosine", "linear", "constant", "wsd"] = Field(
        "linear", description="After warmup (official: linear decay).")
    grad_clip: float | None = Field(None, gt=0, description="Clip the dense gradient's global norm (official: no "
                                    "clipping, an accelerate loop).")
    rank: int = Field(8, gt=0, description="Budget: each matrix trains min(rank (m + n), m n) entries, a rank-`rank` "
                      "LoRA's parameter count (official 128 at width 4096, about 5%; 8 is about 6% at width 256).")
    filter_rank: int = Field(8, ge=1, description="Rank f of the SVD filter whose largest entries are the principal "
                             "weights (official 32 to 128 at widths 2048 to 4096); at most min(m, n) of every matrix.")
    mask: Literal["lift", "magnitude", "random"] = Field(
        "lift", description="lift: top-k of |rank-f reconstruction|; magnitude: top-k of |W| (magnitude sparse FT); "
        "random: k uniform entries, drawn again at each refresh (random sparse FT). Only the selection differs.")
    svd: Literal["full", "lowrank"] = Field("full", description="full: exact fp32 SVD; lowrank: torch.svd_lowrank "
                                            "with q = 2f (the official lift_rand_sparse variant).")
    update_interval: int = Field(400, ge=0, description="Select the supports again every N optimiser steps (after "
                                 "gradient accumulation; official 400); 0: never.")
    eps: float = Field(1e-6, gt=0, description="Adam's epsilon (official 1e-6).")
    shira: bool = Field(False, description="Also save the final support and the update on it as a PEFT SHiRA "
                        "adapter (a static mask: SHiRA has no refresh; updates made on entries that left the support "
                        "are not in it, and the run reports the share it keeps).")

    @model_validator(mode="after")
    def _sparse(self) -> LiftParams:
        if self.weight_decay:
            raise ValueError("lift keeps weight decay at 0 (the official setting), so entries outside the support "
                             "stay exactly as they were")
        if self.adapter != "none":
            raise ValueError("lift trains a sparse support of the weights themselves: adapter must be none")
        return self

    def requirements(self) -> tuple[str, ...]:
        return ("peft",) if self.shira else ()

    def unsupported(self) -> str | None:
        if self.strategy == "fsdp":
            return ("cannot train under strategy fsdp: LIFT's optimiser selects the top entries of each whole weight "
                    "matrix's low-rank approximation, and FSDP holds a shard of it on each process (use strategy: "
                    "ddp)")
        return super().unsupported()
