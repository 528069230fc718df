"""A generated scene set as recipe fields (no torch import: method listings load this module)."""

from __future__ import annotations

from pydantic import Field, field_validator

from llmx.core.multimodal.languages import LANGUAGES
from llmx.core.spec import Params

FORMATS = ("open", "choice", "caption")


def _weights(value: dict[str, float], known: tuple[str, ...], what: str) -> dict[str, float]:
    from llmx.core.names import did_you_mean

    for k, w in value.items():
        if k not in known:
            raise ValueError(f"unknown {what} '{k}'.{did_you_mean(k, known)} Known: {', '.join(known)}")
        if w < 0:
            raise ValueError(f"{what} '{k}': a weight must be non-negative")
    kept = {k: w for k, w in value.items() if w > 0}
    if not kept:
        raise ValueError(f"give at least one {what} a positive weight")
    return kept


class SceneSet(Params):
    """Conversations about generated digit scenes (``core/multimodal``): each row's language and format drawn by
    weight. Train scenes use the first 80% of the digit images, test scenes the rest (unseen handwriting)."""

    count: int = Field(4000, gt=0, description="Conversations.")
    languages: dict[str, float] = Field({"en": 1.0}, description=f"Language weights over {', '.join(LANGUAGES)} "
                                        "(MMMB's set), e.g. {en: 0.9, zh: 0.02, ...}.")
    formats: dict[str, float] = Field({"open": 1.0, "choice": 1.0}, description="Weights of open questions (a "
                                      "word answers), multiple choice (a letter answers) and captions.")
    seed: int = Field(0, description="The scenes and questions drawn.")

    @field_validator("languages")
    @classmethod
    def _languages(cls, value: dict[str, float]) -> dict[str, float]:
        return _weights(value, LANGUAGES, "language")

    @field_validator("formats")
    @classmethod
    def _formats(cls, value: dict[str, float]) -> dict[str, float]:
        return _weights(value, FORMATS, "format")

    def conversations(self, split: str):
        from llmx.core.multimodal.qa import conversations

        return conversations(self.count, split, self.seed, self.languages, self.formats)
