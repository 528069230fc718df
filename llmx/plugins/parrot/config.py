from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from llmx.core.multimodal.params import LANGUAGES, LlavaTrainParams, known_languages
from llmx.core.refs import ExistingPath
from llmx.core.spec import Params


class ParrotTrainParams(LlavaTrainParams):
    """Parrot training (``llmx train --method parrot``): LLaVA's stages with the MoE between projector and LLM.
    Stage 1 trains the projector with the MoE off (the identity); stage 2 trains the MoE (fresh experts, unless the
    model's MoE is already on), projector and language model, the tower frozen (Parrot's finetune.sh: 2e-5)."""

    experts: int = Field(6, ge=1, description="Experts (Parrot's scripts: 6, one per training language; no language "
                         "label reaches the router).")
    intermediate_size: int | None = Field(None, gt=0, description="Expert SwiGLU width; default: the LLM's hidden "
                                          "size (the official 4096 at 4096).")
    moe_weight: float = Field(0.1, ge=0, description="Residual weight w in sum_e g_e E_e(V) + w V (official 0.1).")
    residual: bool = Field(True, description="Add w V (official use_moe_residual).")
    top_k: int | None = Field(None, ge=1, description="Keep the k largest gates, renormalised (the paper's wording); "
                              "default: soft mixing over every expert, as the official code runs.")
    routing_scenes: int = Field(48, ge=0, description="Held-out scenes asked in every language after training, to "
                                "report how the gates separate languages (0: skip).")

    @model_validator(mode="after")
    def _top_k(self) -> ParrotTrainParams:
        if self.top_k is not None and self.top_k > self.experts:
            raise ValueError(f"top_k {self.top_k} is more than experts {self.experts}")
        if self.routing_scenes == 1:
            raise ValueError("routing_scenes: 0 (skip) or at least 2 (half fit the centroids, half test them)")
        return self

    def unsupported(self) -> str | None:
        if self.strategy == "fsdp":
            return ("cannot train under strategy fsdp: its MoE adapter is grafted onto the model in memory and its "
                    "routing report calls the vision path outside the model's forward (use strategy: ddp)")
        return super().unsupported()


class MmmbParams(Params):
    """MMMB-format multiple choice (VLMEvalKit's TSV), scored per language and category."""

    data: ExistingPath | None = Field(None, description="A folder of mmmb_{en,cn,pt,ar,tr,ru}.tsv (or multilingual "
                                      "MMBench's), or one such file; default: a set generated from held-out scenes "
                                      "and written to the run's artifacts.")
    languages: list[str] = Field(list(LANGUAGES), description="Languages to score.")
    count: int = Field(100, gt=0, description="Generated set: questions per language.")
    seed: int = Field(0, description="Generated set: the scenes, questions and option order.")
    circular: bool | None = Field(None, description="CircularEval (a question is right only when all its rotated "
                                  "copies, index + k*1e6, are): default as VLMEvalKit, on for MMBench files or any "
                                  "index past 1e6 (the generated set asks every rotation).")
    scoring: Literal["generate", "likelihood", "likelihood_norm"] = Field(
        "generate", description="generate: a greedy reply to Parrot's prompt, its letter read as VLMEvalKit does; "
        "likelihood: each option's text scored as the reply to the question alone, the likeliest picked (no letter "
        "read); likelihood_norm: the same, per UTF-8 byte of the option (lm-eval's acc_norm), so a longer option is "
        "not penalised for its length.")
    max_new_tokens: int = Field(64, gt=0, description="Reply budget (Parrot's own evaluation allows 512; the letter "
                                "extraction reads the whole reply).")
    batch_size: int = Field(16, gt=0)

    _languages = field_validator("languages")(known_languages)
