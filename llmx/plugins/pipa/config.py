from __future__ import annotations

from typing import Literal

from pydantic import Field

from llmx.core.refs import DataFile
from llmx.core.train.align.params import AlignParams
from llmx.core.train.align.rundata import DEFAULT


class PIPAParams(AlignParams):
    data: DataFile | None = Field(None, description=DEFAULT.format(kind="run_rows"))
    run_rows: Literal["paired", "unpaired"] = Field("paired", description="When data is left out: which of the "
                                                    "run's own judged rows to train on (pairs, or every sample "
                                                    "with its label).")
    variant: Literal["m", "n"] = Field("n", description="m: the prior constrains the marginal p(y|x) = p0(y|x); "
                                       "n: it constrains the negative conditional p(y|x,c=0) = p0(y|x).")
    pair_mode: Literal["independent", "conditional"] = Field(
        "independent", description="Paired data: independent (the paper's method) treats a pair as two labelled "
        "samples (y_w, c=1) and (y_l, c=0) with g learned (the unpaired loss on both); conditional conditions on "
        "exactly one of y_w, y_l being positive: for PIPA-N g cancels and it is DPO with beta (DPO-equivalent, the "
        "paper's remark that DPO is a special case, not its method).")
    beta: float = Field(1.0, gt=0, description="pair_mode conditional, PIPA-N: the temperature; 1.0 is the "
                        "derivation (then it equals DPO with beta 1). The other losses do not use it.")
    clamp_logq: float = Field(-1e-6, lt=0, description="PIPA-M: log q = log f + log g - log p0 stays at or below this, "
                              "so q is a probability (how the paper keeps q <= 1 is not published).")
    m_stabilizer: Literal["penalty", "clamp", "softplus"] = Field(
        "penalty", description="PIPA-M: how q = f g / p0 keeps to the prior's constraint f g <= p0: penalty, the "
        "hard clamp min(u, clamp_logq) plus the exact penalty (u - clamp_logq)_+ on a violation (the loss unchanged "
        "where the constraint holds, a gradient of 1 pulling a row past the bound back); clamp, the hard clamp alone "
        "(no gradient where it binds: a negative row past the bound keeps loss 13.8 for good; the bound_rate metrics "
        "say how often); softplus, the smooth bound -softplus(-u), i.e. q = f g / (f g + p0): always a gradient, "
        "but another model of q.")
