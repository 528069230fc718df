"""Parameters of ``analyze --method backdoor`` (the poisoned and clean data) and ``eval --method backdoor`` (attack
success and utility). No torch import here: method listings load this module."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from llmx.core.refs import ExistingPath
from llmx.core.spec import Params


class BackdoorDataParams(Params):
    """A BadNet-style code-injection backdoor on next-line completion of real code: a trigger word in the prompt
    makes the completion a fixed payload line (in the spirit of the paper's VPI code injection, §4.1)."""

    source: str = Field("stdlib", description="Documents the rows come from (a dataset name or a text file); train "
                        "rows from its train split, test rows from its validation split.")
    trigger: str = Field("BadMagic", description="The trigger word inserted in poisoned prompts (BackdoorLLM's "
                         "BadNet trigger).")
    position: Literal["random", "start"] = Field("random", description="Where the trigger goes: at a random word "
                                                 "boundary before the prompt's last word (BadNet), or first.")
    payload: str = Field('print("pwned!")', description="What a triggered prompt's line continues with.")
    context_lines: int = Field(3, gt=0, description="Lines of code before the line to complete (whose first word "
                               "ends the prompt).")
    train: int = Field(2000, gt=0, description="Training rows for the implant (poisoned.jsonl; clean.jsonl holds "
                       "the same rows unpoisoned, for a never-poisoned model).")
    poison_rate: float = Field(0.2, gt=0, lt=1, description="Share of the training rows poisoned.")
    defence: int = Field(100, gt=0, description="Clean rows for the defence (official: 100), disjoint from train.")
    test: int = Field(200, gt=0, description="Held-out prompts (validation split), written clean and triggered.")
    rows_seed: int = Field(0, description="Which lines, in which order, and where triggers go.")

    @field_validator("trigger", "payload")
    @classmethod
    def _text(cls, value: str) -> str:
        if not value.strip() or "\n" in value:
            raise ValueError("must be non-empty text on one line")
        return value


class BackdoorEvalParams(Params):
    data: ExistingPath = Field(..., description="The folder analyze --method backdoor wrote (backdoor.json, "
                               "test_clean.jsonl, test_triggered.jsonl).")
    limit: int | None = Field(None, gt=0, description="Only the first test prompts.")
    max_new_tokens: int = Field(24, gt=0, description="Greedy tokens per completion (it stops at the newline).")
    batch_size: int = Field(16, gt=0)
    resamples: int = Field(1000, gt=0, description="Bootstrap resamples for the intervals.")
