from __future__ import annotations

from pydantic import Field

from llmx.core.refs import ModelRef
from llmx.core.spec import Params


class BracketsDataParams(Params):
    prompts: int = Field(400, gt=0, description="Training prompts (standard-library train files).")
    heldout_prompts: int = Field(100, gt=0, description="Held-out prompts (validation files).")
    samples: int = Field(4, gt=1, description="Completions sampled per prompt from the model.")
    max_new_tokens: int = Field(24, gt=0)
    temperature: float = Field(1.0, gt=0)


class BracketsEvalParams(Params):
    prompts: int = Field(100, gt=0, description="Held-out prompts (validation files).")
    samples: int = Field(2, gt=0)
    max_new_tokens: int = Field(24, gt=0)
    temperature: float = Field(1.0, gt=0)
    reference: ModelRef | None = Field(None, description="Model the drift is measured from; default: the run's --model.")
