"""Parameters of ``analyze --method overtraining``. No torch import here: method listings load this module."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from llmx.core.refs import ExistingPath, TextSource
from llmx.core.spec import Params


class Checkpoint(Params):
    path: ExistingPath = Field(description="A model folder (a series checkpoint's checkpoint.json supplies what is "
                               "not given here).")
    tokens: int | None = Field(None, gt=0, description="Pre-training tokens seen (default: its checkpoint.json).")
    lr: float | None = Field(None, ge=0, description="Learning rate at the checkpoint (default: its checkpoint.json).")


class FinetuneParams(Params):
    """One recipe for every checkpoint: the same data order, steps and rates (the ``lm`` stage's packed windows
    through the shared loop)."""

    data: TextSource = Field("pydoc", description="Target corpus (its train split trains, its validation split "
                             "scores the target loss).")
    lrs: list[float] = Field([1e-4, 3e-4, 1e-3], description="Fixed rates, each run on every checkpoint; with "
                             "several, the per-checkpoint best (lowest target loss) is reported too (§3.4's lr "
                             "confound); []: no fine-tuning.")
    seeds: list[int] = Field([0], min_length=1, description="Data-order seeds (the order is the same for every "
                             "checkpoint).")
    steps: int = Field(100, gt=0)
    warmup: int = Field(10, ge=0)
    schedule: Literal["constant", "cosine", "linear"] = Field("constant", description="After warmup.")
    batch_size: int = Field(8, gt=0, description="Windows per micro-batch on each process.")
    grad_accum: int = Field(1, gt=0, description="Micro-batches per step; under torchrun keep batch_size x "
                            "grad_accum x world size fixed to keep the recipe.")
    seq_len: int = Field(128, gt=1)
    weight_decay: float = Field(0.0, ge=0)
    max_tokens: int | None = Field(None, gt=0, description="Cap on the target's training tokens.")
    eval_windows: int = Field(32, gt=0, description="Fixed held-out windows of the target's validation split.")


class OvertrainingParams(Params):
    """The series, the held-out pre-training loss, the Gaussian perturbations and the fine-tuning recipe."""

    series: ExistingPath | None = Field(None, description="A checkpoint series: its manifest.json or the folder "
                                        "holding it (an lm run with save_at_tokens). Default: the series an "
                                        "earlier lm stage of this run wrote.")
    checkpoints: list[Checkpoint] = Field(default_factory=list, description="Or the checkpoints as a list.")
    data: TextSource | None = Field(None, description="Pre-training text for L_pre (its validation split; the same "
                                    "windows at every T). Default: the series' own training source.")
    seq_len: int | None = Field(None, gt=1, description="Window length for L_pre (default: the series' seq_len, "
                                "else 128).")
    eval_windows: int = Field(64, gt=0, description="Held-out windows for L_pre.")
    gammas: list[float] = Field([0.5, 1.0, 2.0], min_length=1, description="Noise magnitudes gamma.")
    draws: int = Field(4, gt=0, le=1000, description="K noise draws per gamma; draw k uses one generator for every "
                       "checkpoint and gamma (the same pattern, scaled).")
    noise_scale: Literal["init_std", "param_rms", "absolute"] = Field(
        "init_std", description="sigma_p per tensor: the initialisation std (config.initializer_range, or init_std), "
        "the tensor's own RMS at that checkpoint, or 1.")
    init_std: float | None = Field(None, gt=0, description="sigma for init_std (default: the config's "
                                   "initializer_range).")
    perturb: Literal["matrices", "all"] = Field(
        "matrices", description="matrices: tensors of 2+ dims (embeddings, projections); all: also biases and norm "
        "gains, with additive noise (with init_std a gain's sigma is the init std, relative to its start at 1).")
    turn_k: float = Field(2.0, ge=0, description="A turning point counts when the loss after the minimum rises by "
                          "more than turn_k standard errors over draws or seeds ...")
    turn_rtol: float = Field(1e-3, ge=0, description="... and by more than turn_rtol of the loss.")
    finetune: FinetuneParams = Field(default_factory=FinetuneParams)

    @model_validator(mode="after")
    def _checks(self) -> OvertrainingParams:
        if any(lr <= 0 for lr in self.finetune.lrs):
            raise ValueError(f"finetune.lrs must be positive (got {self.finetune.lrs})")
        if any(g <= 0 for g in self.gammas):
            raise ValueError(f"gammas must be positive (got {self.gammas})")
        for name, values in (("gammas", self.gammas), ("finetune.lrs", self.finetune.lrs),
                             ("finetune.seeds", self.finetune.seeds)):
            if len(set(values)) != len(values):
                raise ValueError(f"{name} has a value twice ({values})")
        if self.series and self.checkpoints:
            raise ValueError("give series or checkpoints, not both")
        if self.noise_scale != "init_std" and self.init_std is not None:
            raise ValueError(f"init_std applies to noise_scale init_std, not {self.noise_scale}")
        return self
