"""Parameters of ``train --method upcycle`` and ``analyze --method upcycling-law``. No torch import here: method
listings load this module."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from llmx.core.refs import ExistingPath
from llmx.core.spec import Params
from llmx.core.train.lm.params import LMParams


class UpcycleParams(LMParams):
    """The ``lm`` stage on the upcycled MoE. ``init: scratch`` trains the same MoE from a fresh init (the
    from-scratch baseline); upcycling a series checkpoint continues its run's data order by default."""

    num_experts: int = Field(8, ge=2, description="Experts per layer, each a copy of the dense FFN (official 8).")
    top_k: int = Field(2, ge=1, description="Experts per token (official 2).")
    router_init: Literal["normal", "zeros"] = Field("normal", description="The new router: N(0, router_std) or "
                                                    "zeros (every expert ties until the router learns).")
    router_std: float | None = Field(None, gt=0, description="Default: the model's initializer_range.")
    router_seed: int | None = Field(None, description="Seed of the router's draw (default: the run's seed, which "
                                    "also orders the data): another draw on the same data measures seed noise.")
    aux_loss_coef: float = Field(0.01, ge=0, description="Load-balancing loss weight (Switch's 0.01; the paper's "
                                 "value is not confirmed in the notes), saved in the MoE's config.")
    target: Literal["auto", "mixtral", "qwen2_moe"] = Field("auto", description="The transformers class: Mixtral "
                                                            "for Llama/Mistral, Qwen2-MoE for Qwen2 (q/k/v biases).")
    data_offset: int | Literal["source"] = Field("source", description="Tokens of the seeded data order to pass "
                                                 "over first. source: a --model that is an lm series checkpoint "
                                                 "continues that run's data (its tokens seen, same data, seq_len "
                                                 "and seed required); 0 otherwise and for init: scratch.")
    identity_tol: float | None = Field(None, gt=0, description="Largest logit error allowed between the upcycled "
                                       "MoE and the dense model before training (checked unless init is scratch); "
                                       "default 1e-4 in float32, 0.1 in 16-bit (summation order differs).")

    @model_validator(mode="after")
    def _checks(self) -> UpcycleParams:
        if self.data_offset != "source" and self.data_offset < 0:
            raise ValueError("data_offset must be >= 0 or 'source'")
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k {self.top_k} is above num_experts {self.num_experts}")
        if self.cooldown_from:
            raise ValueError("cooldown_from: a cooldown of an upcycled checkpoint is an lm run (--method lm), "
                             "not a second upcycling")
        return self


class LawParams(Params):
    """A grid of runs (jsonl) and how to fit, check and use the law."""

    runs: ExistingPath = Field(description="JSON lines: {kind: upcycled, D1, D2, loss, active_params, "
                               "dense_params} per upcycled point; {kind: moe|dense, tokens, loss, active_params} "
                               "per from-scratch point. active_params is what C = 6 N D counts.")
    form: Literal["interaction", "separable"] = Field("interaction", description="The law that predicts and "
                                                      "guides (both are always fitted): interaction is "
                                                      "E + A D1^-a1 D2^(-a2 + a3 ln D1), separable has a3 = 0.")
    token_unit: float | Literal["auto"] = Field("auto", description="Token counts are divided by this before "
                                                "fitting; auto: a power of ten near the median count.")
    huber_scale: float | Literal["auto"] = Field(1e-3, description="Huber f_scale on log-loss residuals (1e-3, "
                                                 "Chinchilla's delta); auto: 1.345 x the residuals' robust sd, from "
                                                 "a first fit at 1e-3.")
    holdout: Literal["largest_d2", "none"] = Field("largest_d2", description="largest_d2: fit the rows below the "
                                                   "largest D2 and predict that column.")
    bootstrap: int = Field(200, ge=0, description="Refits on resampled data for the intervals (0: none).")
    bootstrap_unit: Literal["run", "point"] = Field("run", description="run: a wild cluster bootstrap (one Webb "
                                                    "weight on each run's residuals; a run is the rows sharing a "
                                                    "'run' label, else a D1), whose checkpoints share noise; point: "
                                                    "rows resampled with replacement.")
    level: float = Field(0.95, gt=0, lt=1)
    power_alpha3: float | None = Field(0.03, description="Power check: synthetic grids from the fitted law with "
                                       "this alpha3 at the fit's residual noise; null: skip.")
    power_sims: int = Field(100, gt=0)
    power_noise: float | None = Field(None, gt=0, description="Log-loss noise sd of the power check (a measured "
                                      "run-to-run spread); default: the fit's residual sd.")
    sunk_dense: bool = Field(True, description="true (the paper's Figure 1 framing): the dense phase is already "
                             "paid for, C buys D2 only; false: C counts both phases.")
    dense_tokens: float | None = Field(None, gt=0, description="D1 of the dense model in hand when sunk_dense "
                                       "(default: the grid's largest D1).")
    budgets: list[float] = Field(default_factory=list, description="Compute budgets (FLOPs) for the guidance; "
                                 "default: 8 from the grid's smallest to 100x its largest.")

    @model_validator(mode="after")
    def _checks(self) -> LawParams:
        if self.huber_scale != "auto" and self.huber_scale <= 0:
            raise ValueError("huber_scale must be positive")
        if self.token_unit != "auto" and self.token_unit <= 0:
            raise ValueError("token_unit must be positive")
        if any(b <= 0 for b in self.budgets):
            raise ValueError("budgets must be positive")
        if self.dense_tokens is not None and not self.sunk_dense:
            raise ValueError("dense_tokens applies to sunk_dense: true")
        return self
