"""RePer's recipe fields (no torch import: method listings load this module)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from llmx.core.refs import DataFile, ExistingPath
from llmx.core.spec import Params
from llmx.core.train.params import TrainParams

TEMPERATURES = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0, 1.2, 1.4]  # the paper's 8 captions per image


class CriticParams(Params):
    critic: Literal["rule", "model"] = Field("rule", description="rule: the ground-truth rubric on generated scenes "
                                             "(a stand-in for the paper's GPT-4o / LLaVA-Critic); model: critic_model "
                                             "asked with the rubric, for real images.")
    critic_model: str | None = Field(None, description="critic: model: a LLaVA folder or ref:NAME.")
    feedback: Literal["rationale", "kind", "score"] = Field("rationale", description="What the critic's turn holds "
                                                            "besides the score: its rationale naming each error (the "
                                                            "paper's critics name them), only each error's kind (an "
                                                            "object is missing, a colour is wrong: no object named, "
                                                            "so a better answer cannot be copied from it; rule "
                                                            "critic), or nothing.")
    noise: float = Field(0.0, ge=0, le=1, description="The rule critic's weakness: each error omitted or "
                         "misreported (half each) with this probability.")

    @model_validator(mode="after")
    def _critic(self) -> CriticParams:
        if self.critic == "model" and not self.critic_model:
            raise ValueError("critic: model needs critic_model (a LLaVA folder or ref:NAME)")
        if self.critic == "model" and self.feedback == "kind":
            raise ValueError("feedback: kind names the rubric's error kinds: it takes the rule critic")
        if self.critic == "model" and self.noise:
            raise ValueError("noise weakens the rule critic; a model critic is as weak as it is")
        return self


class SceneParams(Params):
    scenes: int = Field(200, gt=0, description="Generated digit scenes (train split for the dataset, test split for "
                        "decoding: unseen handwriting).")
    scene_seed: int = Field(0, description="The scenes drawn.")
    objects: int | None = Field(None, ge=1, le=4, description="Digits per scene (default: 1 to 4, drawn).")


class BuildParams(CriticParams, SceneParams):
    """The Visual Reflection Dataset (``llmx analyze --method reper``): captions sampled from the model at each of
    ``temperatures``, scored by the critic, assembled worst to best into 1 to ``max_turns`` turns with the critic's
    feedback between them; written as dialogues.jsonl with the scenes as PNG files beside it."""

    temperatures: list[float] = Field(TEMPERATURES, min_length=1, description="One caption per temperature (0 is "
                                      "greedy).")
    candidates: Literal["policy", "corrupt"] = Field("policy", description="policy: the model's own captions (the "
                                                     "paper); corrupt: the true caption with k elements dropped, "
                                                     "changed or invented, k = 0..len(temperatures)-1 (widens a "
                                                     "narrow score spread; the notes' small-scale design).")
    score_gap: float = Field(4, ge=0, description="Keep an image when best - worst reaches this (the paper's ablation "
                             "best, on 10 points).")
    min_score: float = Field(6, ge=1, le=10, description="...and the best reaches this (the paper's value is not "
                             "public).")
    max_turns: int = Field(3, ge=1, le=8, description="Answers per dialogue at most.")
    turn_weights: list[float] | None = Field(None, description="Weights of 1..max_turns answers per dialogue "
                                             "(default: equal; the paper's split is about 36/26/38%).")
    max_new_tokens: int = Field(160, gt=0)
    batch_size: int = Field(16, gt=0)

    @model_validator(mode="after")
    def _build(self) -> BuildParams:
        if self.critic != "rule":
            raise ValueError("building dialogues on generated scenes takes the rule critic")
        if self.turn_weights is not None and (len(self.turn_weights) != self.max_turns or min(self.turn_weights) < 0
                                              or not sum(self.turn_weights)):
            raise ValueError(f"turn_weights: {self.max_turns} non-negative weights, not all 0")
        if any(t < 0 for t in self.temperatures):
            raise ValueError("temperatures must be >= 0")
        return self


class RPLParams(TrainParams):
    """Reflective perceptual learning (``llmx align --method reper``) on dialogues, with its baselines on the same
    rows and loop: ``sft_all`` (plain SFT on every answer, the paper's behavioural-collapse case), ``sft_best`` (SFT
    on each dialogue's best answer alone), ``dpo`` (best vs worst answer to the question) and ``lipo`` (LiPO-lambda
    on every answer of a dialogue as a list of answers to the question). Stage 2's trainable set (projector and
    language model; the vision tower frozen)."""

    data: DataFile | None = Field(None, description="Dialogues (.jsonl, the analyze stage's format); default: the "
                                  "dialogues an earlier analyze stage of this run wrote.")
    image_folder: ExistingPath | None = Field(None, description="Where data's image paths start; default: data's "
                                              "folder.")
    objective: Literal["rpl", "sft_all", "sft_best", "dpo", "lipo"] = Field("rpl")
    alpha: float = Field(8.0, ge=0, description="The unlikelihood weight (not stated; the ablation favours 8-10). "
                         "0 is sigma-weighted SFT.")
    sigma: Literal["linear", "score", "data"] = Field("linear", description="Turn reward: t/T (the README: rising "
                                                      "linearly), the normalised critic score, or each answer's own "
                                                      "'sigma'.")
    granularity: Literal["token", "sequence"] = Field("token", description="Unlikelihood per token (derived, as "
                                                      "Welleck et al.) or on the response's joint probability "
                                                      "(the paper's formula as written).")
    reduction: Literal["mean", "sum"] = Field("mean", description="Token level: average each term over the response, "
                                              "or sum it.")
    ul_tokens: Literal["all", "differing"] = Field("all", description="Token level: the unlikelihood term on every "
                                                   "token of a response but its EOS (which the best answer shares), "
                                                   "or, differing, only on tokens absent from the dialogue's best "
                                                   "answer (a derived variant).")
    eps: float = Field(1e-6, gt=0, lt=1, description="Floor of 1 - p inside log(1 - p).")
    beta: float = Field(0.1, gt=0, description="objective dpo or lipo: the beta of the rewards beta (log pi - log "
                        "pi_ref).")
    lipo_labels: Literal["winrate", "score"] = Field("winrate", description="objective lipo: each answer's label, "
                                                     "the share of its list's other answers it beats by the critic's "
                                                     "score (LiPO's labels from a pairwise judge; by turn order where "
                                                     "a row has no scores) or the score mapped from 1-10 to 0-1.")
    max_length: int = Field(1024, gt=8, description="Tokens per dialogue, image tokens included; longer dialogues "
                            "lose their earliest answers.")
    probe: int = Field(64, ge=0, description="Dialogues (of 2+ answers) whose per-turn mean log-prob is reported "
                       "before and after training.")
    lr: float = Field(2e-5, gt=0, description="LLaVA-1.5's stage-2 rate (the paper's is not public).")
    batch_size: int = 8
    steps: int = 100

    @model_validator(mode="after")
    def _full_weights(self) -> RPLParams:
        if self.adapter != "none":
            raise ValueError("reper trains the projector and the language model's own weights: adapter must be none")
        if self.image_folder and not self.data:
            raise ValueError("image_folder is where data's image paths start: give data too")
        return self


class TurnsParams(CriticParams, SceneParams):
    """Multi-turn reflective inference (``llmx decode --method reper``): the policy answers, the critic replies, the
    policy answers again given the whole dialogue, up to ``max_trials`` answers; metrics per turn against the
    scenes' ground truth."""

    max_trials: int = Field(3, ge=1, description="Answers per image (the paper: up to 3).")
    select: Literal["last", "best"] = Field("last", description="The final answer: the last (the paper) or the "
                                            "critic's best.")
    scenes: int = Field(100, gt=0, description="Held-out test scenes (unseen handwriting).")
    scene_seed: int = Field(1000, description="The test scenes drawn.")
    data: DataFile | None = Field(None, description="LLaVA-format conversations whose first human turn (with its "
                                  "image) is asked instead of scenes; needs critic: model.")
    image_folder: ExistingPath | None = None
    max_new_tokens: int = Field(160, gt=0)
    batch_size: int = Field(16, gt=0)

    @model_validator(mode="after")
    def _data(self) -> TurnsParams:
        if self.data and self.critic == "rule":
            raise ValueError("the rule critic reads generated scenes' ground truth: with data, use critic: model")
        return self
