from __future__ import annotations

from typing import Literal

from pydantic import Field

from llmx.core.refs import DataFile
from llmx.core.train.align.params import AlignParams
from llmx.core.train.align.rundata import DEFAULT


class ConfPOParams(AlignParams):
    data: DataFile | None = Field(None, description=DEFAULT.format(kind="paired"))
    base: Literal["simpo", "dpo"] = Field("simpo", description="simpo: the official code; dpo: the same selection on "
                                          "the DPO log-ratio (derived, not in the public code).")
    beta: float = Field(1.5, gt=0, description="Official default with SimPO: 1.5.")
    gamma: float = Field(1.6, ge=0, description="SimPO margin (official default 1.6).")
    reduction: Literal["sum", "mean"] = Field("sum", description="base dpo: how the selected tokens' log-ratios combine.")
