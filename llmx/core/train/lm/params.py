"""Parameters of the ``lm`` stage. No torch import here: method listings load this module."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from llmx.core.refs import ExistingPath, TextSource
from llmx.core.train.params import TrainParams


class LMParams(TrainParams):
    data: TextSource | None = Field(None, description="Text source: stdlib, a .txt/.jsonl file, hf:NAME or a plugin "
                             "dataset; default: the run's data.source.")
    init: Literal["pretrained", "scratch"] = Field("pretrained", description="pretrained: continue from the model's "
                                                   "weights; scratch: a fresh init from its config (seeded).")
    seq_len: int = Field(128, gt=1, description="Tokens per window; documents are packed with an EOS between them.")
    max_tokens: int | None = Field(None, gt=0, description="Cap on the training tokens read from the source.")
    data_offset: int = Field(0, ge=0, description="Tokens of the seeded data order to pass over first (rounded down "
                             "to whole windows): a model converted from a checkpoint continues that run's data "
                             "instead of re-reading it.")
    lr: float = Field(1e-3, gt=0)
    warmup: int = Field(20, ge=0)
    steps: int = Field(200, gt=0)
    weight_decay: float = Field(0.1, ge=0)
    eval_every: int | None = Field(50, gt=0, description="Held-out loss every N steps (and at the end); null: never.")
    eval_windows: int = Field(32, gt=0, description="Fixed held-out windows of the validation split.")
    save_at_tokens: list[int] = Field(default_factory=list, description="Token budgets at which to save a loadable "
                                      "model folder (with its optimiser state) into the checkpoint series.")
    cooldown_from: ExistingPath | None = Field(None, description="A series checkpoint of a constant or wsd run: branch a "
                                      "decay from it (steps is then cooldown_fraction of the checkpoint's steps).")
    cooldown_fraction: float = Field(0.2, gt=0, le=1, description="Cooldown length as a fraction of the "
                                     "checkpoint's steps.")

    def unsupported(self) -> str | None:
        if self.strategy == "fsdp" and (self.save_at_tokens or self.cooldown_from):
            return ("cannot keep a checkpoint series under strategy fsdp: a series checkpoint is one whole-tensor "
                    "file (use strategy: ddp)")
        return super().unsupported()

    @model_validator(mode="after")
    def _series(self) -> LMParams:
        if any(t <= 0 for t in self.save_at_tokens):
            raise ValueError("save_at_tokens entries must be positive")
        if self.cooldown_from and self.init == "scratch":
            raise ValueError("cooldown_from continues a checkpoint; it cannot start from scratch")
        return self
