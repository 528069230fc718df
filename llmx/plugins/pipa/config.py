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
    pair_mode: Literal["conditional", "independent"] = Field(
        "conditional", description="Paired data: conditional conditions on exactly one of y_w, y_l being positive "
        "(the notes' derivation: g cancels, and PIPA-N is DPO with beta); independent treats a pair as two labelled "
        "samples (y_w, c=1) and (y_l, c=0) with g learned (the unpaired loss on both). Which one the paper's paired "
        "results use is not settled by the notes.")
    beta: float = Field(1.0, gt=0, description="Paired PIPA-N temperature; 1.0 is the derivation (then it equals DPO "
                        "with beta 1). Unpaired and PIPA-M losses do not use it.")
    clamp_logq: float = Field(-1e-6, lt=0, description="PIPA-M: log q = log f + log g - log p0 stays at or below this, "
                              "so q is a probability (how the paper keeps q <= 1 is not published).")
    m_stabilizer: Literal["clamp", "softplus"] = Field(
        "clamp", description="PIPA-M: how log q is kept below 0: clamp, a hard min(u, clamp_logq), exact where q < 1 "
        "but without gradient where it binds (the bound_rate metric says how often); softplus, the smooth bound "
        "-softplus(-u), i.e. q = f g / (f g + p0): always a gradient, but another model of q.")
