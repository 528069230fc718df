from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from llmx.core.eval.source import TaskSource
from llmx.core.refs import ExistingPath, ModelRef
from llmx.core.spec import Params


class TaskEvalParams(TaskSource):
    split: str | None = Field(None, description="Default: the task's last split.")
    limit: int | None = Field(None, gt=0, description="Only the first rows (in the task's seeded order).")
    samples: int | None = Field(None, gt=0, description="Completions per prompt; default: the task's.")
    temperature: float | None = Field(None, ge=0, description="0 is greedy; default: the task's.")
    k: list[int] = Field([1], description="pass@k for each k up to samples.")
    resamples: int = Field(1000, gt=0, description="Bootstrap resamples for the intervals.")
    compare: ModelRef | None = Field(None, description="Also run this model on the same prompts and seeds: the "
                                     "paired difference (this run's model minus it) with its interval.")
    kl: bool = Field(False, description="KL of the samples from kl_reference (generate tasks, temperature 1).")
    kl_reference: ModelRef | None = Field(None, description="Default: the run's --model (before its stages).")

    @field_validator("k")
    @classmethod
    def _positive(cls, ks: list[int]) -> list[int]:
        if not ks or any(k < 1 for k in ks):
            raise ValueError("k must list positive integers")
        return ks

    @model_validator(mode="after")
    def _kl_sampling(self):
        if (self.kl or self.kl_reference) and (self.temperature not in (None, 1.0) or self.top_p != 1.0):
            raise ValueError("kl estimates KL on the model's own samples: it needs temperature 1 and top_p 1")
        return self


class TaskDataParams(TaskSource):
    splits: list[str] | None = Field(None, description="Default: every split of the task.")
    limit: int | dict[str, int] | None = Field(None, description="Rows per split (one number, or per split name).")
    samples: int = Field(4, gt=1, description="Completions sampled per prompt and judged.")
    temperature: float = Field(1.0, gt=0)


class TracingEvalParams(TaskEvalParams):
    task: str | None = Field("tracing", description="The tracing task (a file of rows replaces it: task=null).")


class TracingDataParams(Params):
    train: int = Field(2000, ge=0, description="Training programs (the split has 10,000).")
    validation: int = Field(200, ge=0, description="Validation programs (of 500).")
    test: int = Field(500, ge=0, description="Test programs (of 1,000).")
    rows_seed: int = Field(0, description="Which programs of each split, in which order.")


class LmEvalParams(Params):
    tasks: list[str] = Field(..., min_length=1, description="lm-evaluation-harness task names (or groups).")
    include_path: ExistingPath | None = Field(None, description="A folder of your own task YAML files.")
    num_fewshot: int | None = Field(None, ge=0)
    limit: float | None = Field(None, gt=0, description="Rows per task (a count, or a fraction below 1).")
    batch_size: int = Field(8, gt=0)
    log_samples: bool = Field(True, description="Write each task's per-row results as samples_<task>.jsonl.")
    confirm_unsafe_code: bool = Field(False, description="Let tasks that execute model-written code (lm-eval's "
                                      "humaneval, mbpp) run it, unsandboxed, in lm-eval's own way.")

    @field_validator("tasks", mode="before")
    @classmethod
    def _split(cls, value):
        return [t.strip() for t in value.split(",") if t.strip()] if isinstance(value, str) else value
