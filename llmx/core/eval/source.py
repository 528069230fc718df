"""Which rows an evaluation reads: a registered task (``llmx tasks``) or a ``.jsonl`` file of rows, with the decoding
settings every task stage shares. No torch import here: method listings load this module."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from llmx.core.refs import DataFile
from llmx.core.spec import Params


class TaskSource(Params):
    """Which rows: a registered task (``llmx tasks``) or a ``.jsonl`` file of rows."""

    task: str | None = Field(None, description="A registered task (llmx tasks).")
    file: DataFile | None = Field(None, description="A .jsonl of rows instead: {prompt, choices, answer: index} "
                                  "(multiple choice) or {prompt, answer: text} (generate, exact match).")
    answer_pattern: str | None = Field(None, description="File tasks with text answers: a regex whose last match "
                                       "(its first group) is the answer; default: the completion's first line.")
    delimiter: str = Field(" ", description="Multiple-choice file tasks: the text between prompt and choice (as "
                           "lm-eval's target_delimiter).")
    rows_seed: int = Field(0, description="The order a task's rows are drawn in: the same prompts for every run, "
                           "whatever its seed (which seeds the sampling).")
    max_new_tokens: int | None = Field(None, gt=0, description="Default: the task's.")
    stop: list[str] | None = Field(None, description="Stop strings; default: the task's.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling (with temperature > 0).")
    batch_size: int = Field(8, gt=0)
    judge_workers: int | None = Field(None, gt=0, description="Judges run at once (code runs in the sandbox); "
                                      "default: the CPU count.")
    unsafe_unconfined: bool = Field(False, description="Tasks that run model-written code (humaneval): run it with "
                                    "resource limits only, without the kernel's confinement, where this machine "
                                    "cannot confine it (unsafe: the code can write, spawn and connect as you).")

    @field_validator("task")
    @classmethod
    def _known(cls, name: str | None) -> str | None:
        if name is not None:
            from llmx.core.plugins import host
            from llmx.errors import UsageError

            try:
                return host().task(name).name
            except UsageError as exc:
                raise ValueError(exc.message) from None
        return name

    @model_validator(mode="after")
    def _one_source(self):
        if (self.task is None) == (self.file is None):
            raise ValueError("give exactly one of task (a registered task) or file (a .jsonl of rows)")
        return self

    def spec(self):
        """The task's ``TaskSpec``: the registered one, or one made from the file."""
        from llmx.core.eval import files
        from llmx.core.plugins import host

        return host().task(self.task) if self.task else files.spec(self.file, self.answer_pattern, self.delimiter)

    def requirements(self) -> tuple[str, ...]:
        from llmx.core.plugins import host

        return host().task(self.task).requires if self.task else ()
