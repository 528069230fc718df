from __future__ import annotations

from pydantic import Field, model_validator

from llmx.core.spec import Params


class PerplexityParams(Params):
    source: str | None = Field(None, description="Text source; defaults to the run's data.source.")
    split: str = Field("validation", pattern="^(train|validation)$")
    seq_len: int | None = Field(None, gt=1, description="Window length; defaults to the run's data.seq_len.")
    stride: int | None = Field(None, gt=0, description="Window step; defaults to seq_len // 2 (sliding window).")
    max_tokens: int = Field(16384, gt=1, description="Tokens of the split to score.")
    batch_size: int = Field(8, gt=0)

    @model_validator(mode="after")
    def _stride(self) -> PerplexityParams:
        if self.stride and self.seq_len and self.stride > self.seq_len:
            raise ValueError("stride must not exceed seq_len")
        return self
