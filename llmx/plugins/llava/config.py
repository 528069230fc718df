from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from llmx.core.multimodal.params import LANGUAGES, SceneSet
from llmx.core.refs import DataFile, ExistingPath
from llmx.core.spec import Params
from llmx.core.train.params import TrainParams

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
        return self


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

    @model_validator(mode="after")
    def _known(self) -> ScenesVQAParams:
        bad = [lang for lang in self.languages if lang not in LANGUAGES]
        if bad or not self.languages:
            raise ValueError(f"languages: {', '.join(bad) or 'none given'}; known: {', '.join(LANGUAGES)}")
        return self
