"""Parameters of ``train --method fope`` and ``eval --method length``. No torch import here: method listings load
this module."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from llmx.core.refs import TextSource
from llmx.core.spec import Params
from llmx.core.train.lm.params import LMParams


class FopeParams(LMParams):
    """The ``lm`` stage on a Llama-family model whose position step is ``position`` (official 60M defaults where
    they fit: cosine to 0.1 of the peak, weight decay 0.1)."""

    position: Literal["fope", "rope", "alibi"] = Field("fope", description="fope: Fourier position embedding; rope: "
                                                       "transformers' own rotary attention; alibi: linear biases on "
                                                       "the scores (no rotation).")
    init: Literal["scratch", "continue"] = Field("scratch", description="scratch: a fresh init from the model's "
                                                 "config and tokenizer (seeded); continue: keep its weights (a FoPE "
                                                 "model at a longer train_len grows its coefficients).")
    train_len: int = Field(64, gt=1, description="Training window (tokens); FoPE's floor is 2 pi / train_len.")
    theta: float | None = Field(None, gt=1, description="RoPE base; default: the model's rope_theta (official 1e4).")
    sigma: float = Field(0.3, ge=0, description="Gain of the xavier-normal part of the coefficients (official 0.3 "
                         "at 60M, 0.4 at 180M, 0.6 at 1.2B); 0: the step-eye alone (the clip-only ablation).")
    floor_clip: bool = Field(True, description="Zero the frequencies below 2 pi / train_len (false: the "
                             "Fourier-only ablation).")
    ignore_zero: bool = Field(True, description="Drop the zeroed frequencies and pad the free dims with sin = cos = "
                              "1 (official); false: every rotary dim is a Fourier series over every frequency.")
    fourier_dim: int | Literal["all"] | None = Field(None, description="Fourier output dims: default the official "
                                                     "min(D, head_dim // 4); all: one per kept frequency; an int "
                                                     "caps it (the official fourier_dim is another thing: the "
                                                     "basis size).")
    learnable: bool = Field(False, description="Train the coefficients (official: frozen).")
    schedule: Literal["cosine", "linear", "constant", "wsd"] = "cosine"
    seq_len: int | None = Field(None, description="Set by train_len; must equal it if given.")

    @model_validator(mode="after")
    def _window(self) -> FopeParams:
        if self.seq_len is not None and self.seq_len != self.train_len:
            raise ValueError(f"seq_len {self.seq_len} differs from train_len {self.train_len}: set train_len only")
        self.seq_len = self.train_len
        if isinstance(self.fourier_dim, int) and self.fourier_dim < 1:
            raise ValueError("fourier_dim must be at least 1, 'all' or omitted")
        if self.position != "fope" and self.learnable:
            raise ValueError("learnable applies to position: fope only")
        if self.fourier_dim is not None and not self.ignore_zero:
            raise ValueError("fourier_dim applies with ignore_zero: true (without it every rotary dim is a series)")
        return self


class LengthParams(Params):
    """Length generalisation of any causal LM: perplexity at several window lengths, loss by position bucket and a
    copy probe."""

    source: TextSource | None = Field(None, description="Held-out text; default: the run's data.source.")
    split: str = Field("validation", pattern="^(train|validation)$")
    train_len: int | None = Field(None, gt=1, description="The model's training length T; default: the one its "
                                  "llmx.json records (train_len of a fope run, seq_len of an lm run).")
    lengths: list[int] | None = Field(None, description="Window lengths; default T, 2T, 4T, 8T. None shorter than T.")
    windows: int = Field(16, gt=0, description="Non-overlapping windows at the longest length; every length scores "
                         "the same tokens.")
    batch_size: int = Field(4, gt=0)
    copy_len: int | None = Field(None, gt=1, description="Tokens of the copied segment; default min(T / 2, 32), at least 2.")
    copy_distances: list[int] | None = Field(None, description="How far back the segment sits (tokens from its start "
                                             "to the repeat's); default T/2, T, 2T, 4T that fit the longest length.")
    copy_samples: int = Field(16, gt=0)
    yarn_factor: float | None = Field(None, gt=1, description="Evaluate a RoPE model with YaRN (transformers' "
                                      "rope_parameters: factor, original_max_position_embeddings T, beta_fast 32, "
                                      "beta_slow 1, the official comparison), training-free.")
    yarn_attention_factor: float | None = Field(None, gt=0, description="YaRN's attention temperature; default "
                                                "transformers' (the YaRN paper's 0.1 ln(factor) + 1); 1.0: none, "
                                                "as the official FoPE code's YaRN.")

    @model_validator(mode="after")
    def _lists(self) -> LengthParams:
        if self.yarn_attention_factor is not None and self.yarn_factor is None:
            raise ValueError("yarn_attention_factor applies with yarn_factor")
        for name in ("lengths", "copy_distances"):
            values = getattr(self, name)
            if values is not None and (not values or min(values) < 2 or len(set(values)) != len(values)):
                raise ValueError(f"{name} must be distinct integers of at least 2")
        return self
