from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from llmx.core.multimodal.params import LANGUAGES, known_languages
from llmx.core.spec import Params


class ScenesVQAParams(Params):
    """Per-language accuracy on held-out digit scenes (test-split handwriting), greedy answers."""

    languages: list[str] = Field(list(LANGUAGES), description="Languages to ask in.")
    count: int = Field(100, gt=0, description="Questions per language.")
    format: Literal["choice", "open", "caption"] = Field("choice", description="choice: options A-D, the reply "
                                                         "post-processed to one letter (MMMB); open: the reply parsed "
                                                         "to the word it names; caption: F1 of the caption's tuples.")
    seed: int = Field(0, description="The scenes and questions asked (the same for every model).")
    max_new_tokens: int | None = Field(None, gt=0, description="Default: 4 (choice), 8 (open), 160 (caption).")
    batch_size: int = Field(16, gt=0)

    _languages = field_validator("languages")(known_languages)
