"""Parameters of ``analyze --method feeder`` (the tree), ``eval --method icl`` (k-shot accuracy), ``train --method
feeder`` (bi-level fine-tuning) and ``analyze --method icl-episodes`` (a held-out map's pool). No torch import here:
method listings load this module."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from llmx.core.data.icl import DEFAULT_TEMPLATE
from llmx.core.refs import DataFile, ExistingPath
from llmx.core.spec import Params
from llmx.core.train.params import TrainParams


class IclData(Params):
    """Rows ``{input, label}`` (.jsonl) read in context through a template."""

    data: DataFile | None = Field(None, description="The demonstration pool (.jsonl rows {input, label}); --data sets "
                                  "it. Default: the pool an earlier analyze --method icl-episodes stage of the run "
                                  "wrote (with its template, unless template is set).")
    labels: list[str] | None = Field(None, min_length=2, description="The label words scored (default: the map's of "
                                     "an earlier icl-episodes stage, else the pool's own, sorted); a pool label outside "
                                     "them is an error.")
    template: str = Field(DEFAULT_TEMPLATE, description="One row: {input} then {label}; a query is the template up "
                          "to {label}. Multi-token labels are scored by their summed log-probability.")
    separator: str = Field("\n", description="Between demonstrations (and before the query).")
    batch_size: int = Field(16, gt=0, description="Prompts per forward.")
    context: int | None = Field(None, gt=1, description="Tokens one prompt may hold (null: the length the model "
                                "was trained at where recorded, else its configured context).")

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and (any(not v.strip() for v in value) or len(set(value)) < len(value)):
            raise ValueError("labels must be distinct, non-empty words")
        return value

    @field_validator("template")
    @classmethod
    def _template(cls, value: str) -> str:
        from llmx.core.data.icl import template_problem

        problem = template_problem(value)
        if problem:
            raise ValueError(problem)
        return value


class TreeParams(Params):
    """The tree's choices (notes §2.2; each is a reconstruction, the paper's code is not public)."""

    depth: int | None = Field(None, ge=1, description="Tree levels K (null: until one node is left).")
    rounds: int = Field(1, ge=1, description="Tree rounds R; each round after the first starts from the previous "
                        "round's set (reconstructed).")
    necessity_pass: bool = Field(True, description="Drop, in random order, members the set does not need.")
    necessity_check: Literal["self", "pool"] = Field("pool", description="What a dropped member's removal must "
                                                     "keep: pool: the rest still infers every pool row the set "
                                                     "inferred (the notes' wording, |S| x n questions); self: the rest "
                                                     "still infers that member (|S| questions; keeps mislabelled rows).")
    repair_pass: bool = Field(False, description="Add the pool rows the set does not infer (up to the context), "
                              "then run the necessity pass again over the grown set.")
    max_node_size: int | None = Field(None, ge=1, description="Most demonstrations in one node (one prompt). A "
                                      "node past it, or past the model's context with the longest query, is cut; "
                                      "every cut is counted.")
    cut: Literal["random", "redundancy"] = Field("random", description="How an oversized node is cut "
                                                 "(reconstructed): random: the rows of a random order while they "
                                                 "fit; redundancy: rows in a random order, each kept when the rows "
                                                 "kept so far do not infer it, while they fit (keeps mislabelled "
                                                 "rows first under label noise: bench_feeder.py --cut redundancy).")
    oracle: Literal["lm", "knn", "copy"] = Field("lm", description="Ψ: the model scoring label words (lm), the "
                                                 "nearest demonstration by shared words (knn, a deterministic "
                                                 "stand-in), or the exact copier of an episode pool (copy: the "
                                                 "label of a demonstration with the query's cue; rows need 'cue').")


class FeederParams(IclData, TreeParams):
    """``analyze --method feeder``: the FEEDER set of the pool, selected once with the run's model and --seed."""

    random_draws: int = Field(8, ge=0, description="Random subsets of the FEEDER set's size (rows of a random order "
                              "while they fit one prompt) whose pool inference the set's is paired against, per pool "
                              "row, with a bootstrap interval (0: none); n oracle questions each.")


class IclEvalParams(IclData):
    test: DataFile | None = Field(None, description="Rows to classify (.jsonl {input, label}); default: the test rows "
                                  "of an earlier analyze --method icl-episodes stage of the run.")
    shots: int = Field(8, ge=1, description="Demonstrations per query (0-shot accuracy is always reported too).")
    selector: Literal["random", "similarity"] = Field("random", description="random: k pool rows per query; "
                                                      "similarity: the k nearest by cosine of the model's mean "
                                                      "last-layer hidden states over the input.")
    pool: Literal["full", "feeder", "random"] = Field("full", description="What the selector draws from: the "
                                                       "pool, the FEEDER set, or a random pool subset of the FEEDER "
                                                       "set's size.")
    feeder: ExistingPath | None = Field(None, description="feeder.json (or its folder) from analyze --method "
                                        "feeder; default: the set an earlier stage of this run selected.")
    limit: int | None = Field(None, gt=0, description="Only the first test rows.")
    resamples: int = Field(1000, gt=0, description="Bootstrap resamples for the intervals.")


class FeederTrainParams(IclData, TreeParams, TrainParams):
    """``train --method feeder``: ``outer_rounds`` of (select with the current model, then fine-tune ``steps`` on
    in-context sequences of the selected rows). ``pool: full | random`` trains through the same code."""

    pool: Literal["feeder", "full", "random"] = Field("feeder", description="feeder: re-selected every outer "
                                                       "round; full: the whole pool; random: random_size rows drawn "
                                                       "each round.")
    random_size: int | None = Field(None, gt=0, description="pool random: its size (default: the FEEDER set's "
                                    "from feeder or an earlier stage).")
    feeder: ExistingPath | None = Field(None, description="pool random: feeder.json whose size it matches.")
    outer_rounds: int = Field(2, ge=1, description="Bi-level rounds (no paper value known).")
    shots: int = Field(4, ge=0, description="Demonstrations per training sequence, drawn from the selected rows.")
    test: DataFile | None = Field(None, description="Held-out queries (k-shot prompts over the selected rows) for "
                                  "the held-out loss; default: fresh in-context sequences of the selection.")
    max_length: int = Field(512, gt=2, description="Tokens per training sequence (longer ones are an error).")
    lr: float = Field(3e-4, gt=0, description="Peak learning rate (AdamW).")
    batch_size: int = Field(8, gt=0, description="Sequences per micro-batch, and prompts per forward when selecting.")
    steps: int = Field(50, gt=0, description="Optimizer steps per outer round (one new sequence per example).")

    @model_validator(mode="after")
    def _size(self) -> FeederTrainParams:
        if self.pool != "random" and (self.random_size is not None or self.feeder is not None):
            raise ValueError("random_size and feeder size a random subset: set pool: random")
        return self


class EpisodeParams(Params):
    """``analyze --method icl-episodes``: a held-out map's pool and test rows (``episodes.heldout``). The default pool
    (12 rows of one distractor and a cue, 5 tokens each with the episode tokenizer) fits a 64-token context whole
    beside the longest query and label, so no FEEDER node is ever cut."""

    cues: int = Field(6, ge=1, le=128, description="Cue words in the map.")
    labels: int = Field(4, ge=2, le=16, description="Label words in the map.")
    pool: int = Field(12, gt=0, description="Pool rows (noisy).")
    test: int = Field(200, gt=0, description="Test rows (noise-free).")
    noise: float = Field(0.05, ge=0, lt=1, description="Share of pool rows with another label.")
    distractors: tuple[int, int] = Field((1, 1), description="Distractor words before the cue in an input: a range, "
                                         "drawn uniformly (training episodes have 1 or 2; 1 keeps every row 5 "
                                         "tokens).")
    map_seed: int | None = Field(None, description="Which held-out map (default: the run's seed).")

    @field_validator("distractors")
    @classmethod
    def _distractors(cls, value: tuple[int, int]) -> tuple[int, int]:
        if not 0 <= value[0] <= value[1] <= 8:
            raise ValueError("distractors is a range [low, high] with 0 <= low <= high <= 8")
        return value
