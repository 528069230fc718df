from __future__ import annotations

from pydantic import Field, model_validator

from llmx.core.refs import TextSource
from llmx.core.spec import Params


class PerplexityParams(Params):
    source: TextSource | None = Field(None, description="Text source; defaults to the run's data.source.")
    split: str = Field("validation", pattern="^(train|validation)$")
    seq_len: int | None = Field(None, gt=1, description="Window length; defaults to the run's data.seq_len.")
    stride: int | None = Field(None, gt=0, description="Window step; defaults to seq_len // 2 (sliding window).")
    max_tokens: int = Field(16384, gt=1, description="Tokens of the split to score.")
    batch_size: int = Field(8, gt=0)

    def onload_problem(self) -> str | None:
        """None: forward passes only, so it runs with ``onload``."""
        return None

    @model_validator(mode="after")
    def _stride(self) -> PerplexityParams:
        if self.stride and self.seq_len and self.stride > self.seq_len:
            raise ValueError("stride must not exceed seq_len")
        return self


class SpeedParams(Params):
    prompt_len: int = Field(128, gt=0, description="Prompt tokens (taken from the run's data).")
    new_tokens: int = Field(64, gt=1, description="Tokens generated greedily per repeat.")
    batch_size: int = Field(1, gt=0)
    repeats: int = Field(5, gt=0, description="Timed repeats; the median is reported.")
    warmup: int = Field(1, ge=0, description="Untimed repeats first.")


class MemoryParams(Params):
    context_len: int = Field(512, gt=0, description="Tokens in the prompt whose cache is measured.")


class GenerateParams(Params):
    prompt: str = Field("def ", description="Prompt text.")
    max_new_tokens: int = Field(64, gt=0)
    samples: int = Field(1, gt=0)
    temperature: float = Field(0.0, ge=0, description="0 means greedy.")
    top_p: float = Field(0.95, gt=0, le=1)

    def onload_problem(self) -> str | None:
        """None: forward passes only, so it runs with ``onload``."""
        return None
