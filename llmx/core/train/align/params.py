"""Parameters every align method shares (the loop's, plus the preference data). No torch import here: method
listings load this module."""

from __future__ import annotations

from pydantic import Field

from llmx.core.train.params import TrainParams


class AlignParams(TrainParams):
    data: str = Field(description="Training preference data (.jsonl): paired, unpaired or step-level rows.")
    eval_data: str | None = Field(None, description="Held-out rows of the same kind; default: 10% of data, by row hash.")
    beta: float = Field(0.1, gt=0)
    max_len: int = Field(128, gt=8, description="Tokens per prompt + response (the prompt is cut from the left).")
