"""Parameters of ``decode --method cosd`` and ``train --method cosd-tree``. No torch import here: method listings
load this module."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from llmx.core.eval.source import TaskSource
from llmx.core.refs import ExistingPath, ModelRef
from llmx.core.train.lm.params import LMParams


class PairParams(TaskSource):
    """The second model and the rows both models read (the run's --model is the draft)."""

    task: str | None = Field("api-facts", description="A registered generate task (llmx tasks); a file of rows "
                             "{prompt, answer} replaces it with task=null.")
    assistant: ModelRef | None = Field(None, description="The assistant model M_q (ref:NAME, a folder or a hub id); "
                                       "the run's --model drafts. Default: the one an earlier train --method "
                                       "cosd-assistant stage of the run trained.")
    split: str | None = Field(None, description="Default: the task's last split.")
    limit: int | None = Field(None, gt=0, description="Only the first rows (in the task's seeded order).")
    offset: int = Field(0, ge=0, description="Skip this many rows first (the examples a tree was fitted on).")
    use_cache: bool = Field(True, description="Reuse each model's KV cache, cropped back after a replacement; false "
                            "re-reads the whole text at every forward (the reference the cache is tested against).")


class CoSDParams(PairParams):
    strategy: Literal["cosd", "draft", "assistant", "speculative", "ensemble", "average"] = Field(
        "cosd", description="cosd; draft or assistant alone (greedy); speculative: transformers' lossless assisted "
        "decoding, target = assistant; ensemble: its lossy verification (assistant_ensemble_weight); average: "
        "token-level probability averaging, both models every step.")
    decision: Literal["rule", "tree", "mcsd"] = Field("rule", description="rule: replace iff x != y, P_p(x) < alpha "
                                                      "and P_q(y) > beta P_p(x) (the paper); tree: a CART from "
                                                      "train --method cosd-tree; mcsd: the released code's test on "
                                                      "the assistant's probability of the draft token.")
    alpha: float = Field(0.5, ge=0, description="Replace only where the draft's probability is below alpha.")
    beta: float = Field(0.5, ge=0, description="... and the assistant's top probability above beta times it.")
    tree: ExistingPath | None = Field(None, description="decision=tree: the JSON written by train --method cosd-tree.")
    draft_tokens: int = Field(5, gt=0, description="K, draft tokens per block (the paper does not fix it).")
    draft_temperature: float = Field(0.0, ge=0, description="0: greedy drafts; above 0 they are sampled (seeded).")
    average_weight: float = Field(0.5, ge=0, le=1, description="strategy=average: the assistant's weight w in "
                                  "(1 - w) P_p + w P_q.")
    ensemble_weight: float = Field(0.5, gt=0, lt=1, description="strategy=ensemble: transformers' "
                                   "assistant_ensemble_weight (the target's weight).")

    @field_validator("tree")
    @classmethod
    def _tree_file(cls, value: str | None) -> str | None:
        if value is not None:
            from llmx.errors import UsageError
            from llmx.plugins.cosd.cart import load

            try:
                load(value)
            except UsageError as exc:
                raise ValueError(exc.message) from None
        return value


class TreeTrainParams(PairParams):
    """``train --method cosd-tree``: features from a few examples with references, teacher-forced (the paper's §3.2)."""

    examples: int = Field(5, gt=0, description="Rows (with a reference answer) the tree learns from; decoding "
                          "scores the others (offset=examples in the decode stage).")
    max_depth: int = Field(2, ge=1, description="Tree depth (the paper does not give it).")
    min_samples_leaf: int = Field(1, ge=1)
    balanced: bool = Field(True, description="Weight the two labels equally (few labelled disagreements are "
                           "mostly one kind).")
    min_disagreements: int = Field(50, ge=0, description="Below this many labelled disagreements the file says "
                                   "fallback: decoding then uses the rule (alpha, beta) and reports it.")


class AssistantParams(LMParams):
    """``train --method cosd-assistant``: the ``lm`` stage on a copy of the run's model, kept as the assistant of the
    run's later cosd stages; the run's model (the draft) is left as it was. Two experts from one base, each
    fine-tuned on its own corpus (this stage, then ``lm``), make the paper's complementary-knowledge pair."""
