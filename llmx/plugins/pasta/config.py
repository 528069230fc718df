"""Parameters of ``analyze --method pasta-annotate`` (Pasta-Lang rows from the standard library). No torch import
here: method listings load this module."""

from __future__ import annotations

from pydantic import Field, model_validator

from llmx.core.spec import Params


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
