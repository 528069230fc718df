"""Recipe fields of the multimodal stages: a generated scene set and LLaVA's training stages (no torch import: method
listings load this module)."""

from __future__ import annotations

import os

from pydantic import Field, field_validator, model_validator

from llmx.core.multimodal.languages import LANGUAGES
from llmx.core.refs import DataFile, ExistingPath
from llmx.core.spec import Params
from llmx.core.train.params import TrainParams

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


def known_languages(value: list[str]) -> list[str]:
    """A non-empty list of MMMB's six language codes (a pydantic validator's body)."""
    bad = [lang for lang in value if lang not in LANGUAGES]
    if bad or not value:
        raise ValueError(f"languages: {', '.join(bad) or 'none given'}; known: {', '.join(LANGUAGES)}")
    return value


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


STAGE_LR = {1: 1e-3, 2: 2e-5}  # LLaVA-1.5's pretrain.sh and finetune.sh


class LlavaTrainParams(TrainParams):
    """LLaVA training (``llmx train --method llava``): stage 1 trains the projector, stage 2 the projector and the
    language model; the vision tower is frozen in both. Loss on the responses (gpt turns) only."""

    stage: int = Field(2, ge=1, le=2, description="1: projector only (feature alignment); 2: projector and language "
                                 "model (visual instruction tuning).")
    data: DataFile | None = Field(None, description="LLaVA-format conversations (.json array or .jsonl): {image, "
                                  "conversations: [{from: human|gpt, value}]} with <image> in a human turn; default: "
                                  "the generated scene set below.")
    image_folder: ExistingPath | None = Field(None, description="Where data's image paths start; default: data's "
                                              "folder.")
    scenes: SceneSet = Field(default_factory=SceneSet, description="Generated conversations when data is not given "
                             "(held-out rows from test scenes).")
    eval_rows: int = Field(96, ge=0, description="Held-out conversations (test scenes, or 10% of data by row hash).")
    lr: float | None = Field(None, gt=0, description="Default by stage: 1e-3 (stage 1), 2e-5 (stage 2), LLaVA-1.5's "
                             "rates at 7B; a toy model trains in a few hundred steps only at higher rates.")
    mm_projector_lr: float | None = Field(None, gt=0, description="The projector's own rate (LLaVA-1.5's "
                                          "mm_projector_lr); default: lr.")
    max_length: int = Field(2048, gt=2, description="Tokens per conversation, image tokens included; a prompt that "
                            "does not fit is an error naming its row.")
    batch_size: int = 16
    steps: int = 300
    warmup: int | None = Field(None, ge=0, description="Linear warmup steps; default: 3% of the steps (LLaVA-1.5's "
                               "warmup_ratio), at least one.")
    min_lr_ratio: float = Field(0.0, ge=0, le=1, description="Final rate of the cosine, as a fraction (LLaVA-1.5: 0).")
    keep: bool = Field(False, description="Keep the trained weights in the stage cache: a run with the same model, "
                       "earlier stages, params, seed, device and dtype loads them instead of training (the arms of a "
                       "comparison that open with one base stage train it once per seed). Needs save: false; the "
                       "entry and each run's artifacts hold a copy of the weights (plan the disk at real sizes).")

    @property
    def rate(self) -> float:
        return self.lr if self.lr is not None else STAGE_LR[self.stage]

    def llava_loop(self):
        """The loop as LLaVA-1.5's Trainer runs it: the stage's rate, 3% warmup, cosine to 0, AdamW betas (0.9, 0.999)."""
        warmup = self.warmup if self.warmup is not None else max(1, round(0.03 * self.steps))
        return self.loop_config(lr=self.rate, warmup=warmup, betas=(0.9, 0.999))

    @model_validator(mode="after")
    def _full_weights(self) -> LlavaTrainParams:
        if self.adapter != "none":
            raise ValueError("llava trains the projector and the language model's own weights: adapter must be none")
        if self.image_folder and not self.data:
            raise ValueError("image_folder is where data's image paths start: give data too")
        if self.keep and self.save:
            raise ValueError("keep passes the trained model to the next stages only: set save: false")
        if self.keep and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise ValueError("keep is for one process: under torchrun each rank would decide alone whether to train")
        return self
