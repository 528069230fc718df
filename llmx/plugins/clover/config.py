from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from llmx.core.spec import Params
from llmx.core.train.params import LoopParams

Target = Literal["qk", "vo"]
TuneTarget = Literal["q", "qk", "vo", "up"]


class CloverPruneParams(Params):
    ratio: float = Field(0.5, ge=0.0, lt=1.0, description="Fraction of the head dims removed (0 = transform only).")
    mode: Literal["uniform", "global"] = Field("uniform", description="uniform: every head keeps the same number of "
                                               "dims; global: the dims with the highest scores over all heads and "
                                               "layers are kept (the paper's quantile), each layer sliced to its "
                                               "widest head and the rest of its pruned dims zeroed.")
    layer_keep: list[int] | None = Field(None, description="uniform: dims kept per head, one entry per attention "
                                         "layer (overrides ratio).")
    targets: list[Target] | None = Field(None, description="Pairs to prune: vo, and qk where no RoPE sits between Q "
                                         "and K. Default: every pair the architecture allows.")
    criterion: Literal["clover", "vanilla", "activation"] = Field(
        "clover", description="clover: SVD of the pair's product; vanilla: the original dims ranked by their weight "
        "norm product; activation: the original dims ranked by activation norms on calibration data.")
    calib_windows: int = Field(16, gt=0, description="activation: calibration windows of the run's data.")
    calib_seq_len: int = Field(128, gt=1, description="activation: tokens per calibration window.")
    save: bool = Field(True, description="Save the pruned model (smaller head dims) as a run artifact.")

    @model_validator(mode="after")
    def _budget(self) -> CloverPruneParams:
        if self.layer_keep is not None and any(k < 1 for k in self.layer_keep):
            raise ValueError("layer_keep entries must be at least 1")
        if self.layer_keep is not None and self.mode == "global":
            raise ValueError("layer_keep sets a per-layer budget; global pruning sets one budget (ratio)")
        return self


class CloverTrainParams(LoopParams):
    tuner: Literal["clover", "lora", "pissa"] = Field(
        "clover", description="clover: train r x r cores between frozen vectors (Sec. 3.3); lora / pissa: the PEFT "
        "baselines on the same projections at the same (or a given) trainable-parameter budget.")
    basis: Literal["orthogonal", "raw"] = Field(
        "orthogonal", description="clover: orthogonal = CLOVER (QR of Q and up blocks, SVD of the Q-K / V-O "
        "pairs, cores initialised to R or diag(S)); raw = identity cores on the current vectors (vanilla + FT).")
    targets: list[TuneTarget] | None = Field(
        None, description="Where cores train: q (pre-RoPE query QR, per head), qk (the Q-K pair, no RoPE), vo, up "
        "(the MLP up projection in blocks of head_dim/2). Default (official): q or qk, vo, and up where the model "
        "has an up projection layer.")
    gqa_vo: Literal["qr", "svd"] = Field("qr", description="V-O under GQA: qr = QR of V per KV head (official); "
                                         "svd = the V-O SVD with the group's output blocks stacked.")
    dropout: float = Field(0.05, ge=0, lt=1, description="Dropout on the frozen vectors' output before the core "
                           "(official 0.05).")
    rank: int | None = Field(None, gt=0, description="lora / pissa rank (default: the largest whose trainable "
                             "parameters do not exceed the CLOVER cores' on the same targets).")
    lr: float = Field(1e-3, gt=0, description="Peak learning rate (llmx default for small models; official 1e-4 on "
                      "LLaMA-2-7B).")
    warmup: int = Field(10, ge=0, description="Linear warmup steps (official 100 over 3 epochs).")
    schedule: Literal["cosine", "linear", "constant", "wsd"] = Field("linear", description="After warmup (official: "
                                                                     "linear to 0).")
    min_lr_ratio: float = Field(0.0, ge=0, le=1)
    seq_len: int = Field(128, gt=1, description="Tokens per window (llmx default; official max length 1024).")
    eval_windows: int = Field(32, gt=0, description="Held-out windows for the loss before and after.")
    save: bool = Field(True, description="Save the merged model (no extra parameters) as a run artifact.")

    @model_validator(mode="after")
    def _targets(self) -> CloverTrainParams:
        if self.targets is not None and {"q", "qk"} <= set(self.targets):
            raise ValueError("targets q and qk both train the query side: choose one")
        if self.rank is not None and self.tuner == "clover":
            raise ValueError("rank is the lora / pissa rank; CLOVER's cores are head_dim x head_dim")
        return self

    def unsupported(self) -> str | None:
        if self.strategy == "fsdp":
            return ("cannot train under strategy fsdp: it merges its trained cores into the whole projection weights "
                    "after training, which FSDP holds as shards (use strategy: ddp)")
        return super().unsupported()

    def requirements(self) -> tuple[str, ...]:
        return ("peft",) if self.tuner != "clover" else ()
