from __future__ import annotations

from typing import Literal

from pydantic import Field

from llmx.core.refs import DataFile
from llmx.core.train.align.params import AlignParams
from llmx.core.train.align.rundata import DEFAULT


class PairedParams(AlignParams):
    data: DataFile | None = Field(None, description=DEFAULT.format(kind="paired"))


class DPOParams(PairedParams):
    label_smoothing: float = Field(0.0, ge=0, lt=0.5, description="Conservative DPO smoothing (0 = plain DPO).")


class IPOParams(PairedParams):
    beta: float = Field(0.1, gt=0, description="IPO's tau: the target margin is 1 / (2 tau).")
    length_normalize: bool = Field(True, description="Per-token mean log-probs (TRL); false: sums (the paper).")


class SimPOParams(PairedParams):
    beta: float = Field(2.0, gt=0)
    gamma: float = Field(0.5, ge=0, description="Target reward margin.")


class KTOParams(AlignParams):
    data: DataFile | None = Field(None, description=DEFAULT.format(kind="unpaired"))
    reference_point: Literal["mismatched", "batch_self"] = Field(
        "mismatched", description="KTO's z_ref: mismatched (TRL's KL term: each prompt with another row's "
        "completion, mean log-ratio over every rank, clamped at 0; a second, gradient-free forward of policy and "
        "reference); batch_self, the mean log-ratio of the batch's own completions (no extra forward).")
    desirable_weight: float = Field(1.0, gt=0)
    undesirable_weight: float = Field(1.0, gt=0)
