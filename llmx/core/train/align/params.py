"""Parameters every align method shares (the loop's, plus the preference data). No torch import here: method
listings load this module."""

from __future__ import annotations

from pydantic import Field, model_validator

from llmx.core.refs import DataFile
from llmx.core.train.params import TrainParams


class AlignParams(TrainParams):
    data: DataFile = Field(description="Training preference data (.jsonl): paired, unpaired or step-level rows.")
    eval_data: DataFile | None = Field(None, description="Held-out rows of the same kind; default: 10% of data, by row hash.")
    beta: float = Field(0.1, gt=0)
    max_len: int = Field(128, gt=8, description="Tokens per prompt + response.")
    max_prompt_length: int | None = Field(None, gt=0, description="Prompt tokens kept (cut from the left), the same "
                                          "for both sides of a pair; then responses are cut from the right to fit "
                                          "max_len. Default: half of max_len.")
    precompute_ref_log_probs: bool = Field(False, description="Score every training and held-out row under the "
                                           "reference once, before training, instead of keeping a frozen copy of "
                                           "the weights (as TRL's option of that name).")
    disable_dropout: bool = Field(True, description="Turn the policy's dropout off while aligning (as TRL), so the "
                                  "policy and the reference score the same function.")

    @model_validator(mode="after")
    def _lengths(self) -> AlignParams:
        if self.max_prompt_length is not None and self.max_prompt_length >= self.max_len:
            raise ValueError(f"max_prompt_length ({self.max_prompt_length}) must be below max_len ({self.max_len})")
        return self
