from __future__ import annotations

from typing import Literal

from pydantic import Field

from llmx.core.train.align.params import AlignParams


class PIPAParams(AlignParams):
    variant: Literal["m", "n"] = Field("n", description="m: the prior constrains the marginal p(y|x) = p0(y|x); "
                                       "n: it constrains the negative conditional p(y|x,c=0) = p0(y|x).")
    beta: float = Field(1.0, gt=0, description="Paired PIPA-N temperature; 1.0 is the derivation (then it equals DPO "
                        "with beta 1). Unpaired and PIPA-M losses do not use it.")
    clamp_logq: float = Field(-1e-6, lt=0, description="PIPA-M: log q = log f + log g - log p0 is clamped here so q is "
                              "a probability (how the paper keeps q <= 1 is not published).")
