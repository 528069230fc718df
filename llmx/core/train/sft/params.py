"""Parameters of the ``sft`` stage. No torch import here: method listings load this module."""

from __future__ import annotations

from pydantic import Field, model_validator

from llmx.core.refs import DataFile
from llmx.core.train.params import TrainParams


class SFTParams(TrainParams):
    data: DataFile = Field(description="Training rows (.jsonl): {prompt, completion} or {messages: [{role, content}]}.")
    eval_data: DataFile | None = Field(None, description="Held-out rows; default: 10% of data, by row hash.")
    max_length: int = Field(256, gt=2, description="Tokens per row (prompt + completion); the completion is cut "
                            "from the right to fit.")
    max_prompt_length: int = Field(128, gt=0, description="Prompt tokens kept; the prompt is cut from the left.")
    completion_only: bool = Field(True, description="Loss on the completion (assistant) tokens only; false: on "
                                  "every token.")
    packing: bool = Field(False, description="Pack rows into max_length sequences; each row attends only to "
                          "itself (position ids restart per row).")
    eval_every: int | None = Field(None, gt=0, description="Held-out loss every N steps (and at the end).")
    epochs: float | None = Field(None, gt=0, description="Passes over the training rows: sets steps (rounded up, "
                                 "over batch_size x grad_accum x processes), as TRL's num_train_epochs.")
    warmup_ratio: float | None = Field(None, ge=0, lt=1, description="Warmup as a share of the steps (replaces "
                                       "warmup), as TRL's warmup_ratio.")

    @model_validator(mode="after")
    def _lengths(self) -> SFTParams:
        given = self.model_fields_set
        for a, b in (("steps", "epochs"), ("warmup", "warmup_ratio")):
            if {a, b} <= given and getattr(self, b) is not None:
                raise ValueError(f"{a} and {b} both set the schedule; give one")
            if a in given and b not in given:  # an explicit count replaces a method's default epochs or ratio
                setattr(self, b, None)
        if self.max_prompt_length >= self.max_length:
            raise ValueError(f"max_prompt_length ({self.max_prompt_length}) must be below max_length "
                             f"({self.max_length}), so every completion keeps a token")
        return self
