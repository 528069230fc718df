"""Parameters of ``analyze --method pasta-annotate`` (Pasta-Lang rows from the standard library). No torch import
here: method listings load this module."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from llmx.core.refs import DataFile
from llmx.core.spec import Params
from llmx.core.train.params import TrainParams
from llmx.core.train.sft.params import SFTParams


class AnnotateParams(Params):
    """Classes and runs of module-level functions whose independent members become async chunks (notes §2)."""

    max_chars: int = Field(1200, gt=0, description="Most characters in a row's prompt plus plain response.")
    max_method_lines: int = Field(12, gt=0, description="Longest method or function kept (lines, decorators "
                                  "included); a class with a longer one is skipped.")
    min_chunks: int = Field(2, ge=1, description="Fewest async chunks in a row (fewer: no parallelism to learn).")
    max_chunks: int = Field(6, ge=1, description="Most async chunks in a row (and functions in one run's row).")
    functions: bool = Field(True, description="Also rows of consecutive short module-level functions.")
    limit: int | None = Field(None, gt=0, description="Most rows (files in sorted order).")

    @model_validator(mode="after")
    def _chunks(self) -> AnnotateParams:
        if self.min_chunks > self.max_chunks:
            raise ValueError(f"min_chunks ({self.min_chunks}) is above max_chunks ({self.max_chunks})")
        return self


class PastaSFTParams(SFTParams):
    """``train --method pasta``: Pasta-SFT on annotated rows (``analyze --method pasta-annotate``), the model and its
    tokenizer equipped with the six tag tokens first (new embedding rows: the mean of the old)."""

    data: DataFile | None = Field(None, description="Annotated rows (.jsonl: prompt, response); default: the "
                                  "train.jsonl an earlier analyze --method pasta-annotate stage of the run wrote.")
    annotated: bool = Field(True, description="true: Pasta-SFT (the interpreter's masks and positions); false: "
                            "Baseline-SFT on the same rows with the tags stripped, through the same code.")
    max_length: int = Field(384, gt=2, description="Tokens per row (prompt + annotated response); a longer row is "
                            "left out whole.")

    @model_validator(mode="after")
    def _layout_rules(self) -> PastaSFTParams:
        if not self.completion_only:
            raise ValueError("completion_only: false is not supported: the Pasta layout trains the response only")
        if "max_prompt_length" in self.model_fields_set:
            raise ValueError("max_prompt_length is not used: a row past max_length is left out whole, never cut")
        return self


class PastaDecodeParams(Params):
    """``decode --method pasta``: the interpreter over the prompts of annotated rows (notes §2, "Interpreter")."""

    data: DataFile | None = Field(None, description="Rows with a 'prompt' (.jsonl); default: the validation.jsonl "
                                  "an earlier analyze --method pasta-annotate stage of the run wrote.")
    limit: int | None = Field(None, gt=0, description="First N rows.")
    positions: Literal["predicted", "oracle", "fixed"] = Field("predicted", description="Where the main stream "
                                                               "resumes after a promise: its predicted tokens; the "
                                                               "oracle (a first pass's true chunk lengths, decoded "
                                                               "again: reconstructed); or fixed_tokens.")
    fixed_tokens: int = Field(32, ge=0, description="N for every promise with positions: fixed.")
    max_threads: int = Field(8, ge=1, description="Async threads at once; later promises wait in a queue.")
    max_chunk_tokens: int = Field(256, ge=2, description="A chunk is closed at this length.")
    max_new_tokens: int = Field(384, gt=0, description="Response tokens over every thread: past it the main thread "
                                "ends and open chunks close.")
    judge: str | None = Field(None, description="A model scoring each plain response given its prompt (per-token "
                              "NLL), e.g. ref:llama-bench; none: quality is the parse rate only.")
    attention: Literal["mask", "segments"] = Field("mask", description="mask: the model's own attention on a 4-D "
                                                   "mask; segments: attention from the visibility tables (a CuPy "
                                                   "kernel on CUDA with CuPy, its SDPA reference elsewhere).")
    repeats: int = Field(1, ge=1, description="Decodes per prompt for wall-clock; above 1 the first is a warm-up "
                         "and the median of the rest is reported.")


class BonbonParams(TrainParams):
    """``align --method pasta-bonbon``: BoNBoN rounds on a Pasta-SFT model (notes §2, "Stage 2")."""

    data: DataFile | None = Field(None, description="Rows whose prompts are sampled (.jsonl); default: the "
                                  "train.jsonl an earlier analyze --method pasta-annotate stage of the run wrote.")
    prompts: int = Field(32, gt=0, description="Prompts per round (the first N rows).")
    samples: int = Field(10, ge=2, description="Responses sampled per prompt (the paper: 10).")
    temperature: float = Field(1.0, gt=0)
    lam: float = Field(1.0, ge=0, description="λ in speedup + λ·quality (inf: quality first, speedup breaks ties).")
    alpha: float = Field(0.5, ge=0, le=1, description="Weight of the SFT loss on the best; 1-α weights IPO.")
    tau: float | None = Field(None, gt=0, description="IPO's τ; none: BoNBoN's 1/(2 (n-1) H_(n-1)) for n samples.")
    rounds: int = Field(1, ge=1, description="Sample-then-train rounds; each samples from the current policy.")
    judge: str | None = Field(None, description="A model scoring the plain responses (per-token NLL) for quality; "
                              "none: quality is parse validity alone.")
    max_new_tokens: int = Field(384, gt=0, description="Response tokens over every thread, per sample.")
    max_chunk_tokens: int = Field(256, ge=2)
    max_threads: int = Field(8, ge=1)

    def unsupported(self) -> str | None:
        if self.strategy == "fsdp":
            return ("cannot train under strategy fsdp: each process samples its own prompts with the policy, a "
                    "different number of forwards on each, which a sharded policy cannot run (use strategy: ddp)")
        return super().unsupported()

