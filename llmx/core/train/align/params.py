"""Parameters every align method shares. No torch import here: method listings load this module."""

from __future__ import annotations

from pydantic import Field

from llmx.core.spec import Params


class AlignParams(Params):
    data: str = Field(description="Training preference data (.jsonl): paired, unpaired or step-level rows.")
    eval_data: str | None = Field(None, description="Held-out rows of the same kind; default: 10% of data, by row hash.")
    beta: float = Field(0.1, gt=0)
    steps: int = Field(100, gt=0)
    lr: float = Field(1e-4, gt=0)
    warmup: int = Field(10, ge=0)
    batch_size: int = Field(8, gt=0, description="Examples per micro-batch.")
    grad_accum: int = Field(1, gt=0)
    max_len: int = Field(128, gt=8, description="Tokens per prompt + response (the prompt is cut from the left).")
    checkpoint_every: int | None = Field(None, gt=0, description="Save a resumable checkpoint every N steps.")
    resume: str | None = Field(None, description="A checkpoint file or folder (its 'latest') to resume from.")
    save: bool = Field(True, description="Save the aligned model as a run artifact.")
