"""ConfPO (Yoon et al., ICML 2025): optimise only the preference-critical tokens, those whose probability under the
training policy is below the response's arithmetic-mean probability; the selection is detached, and an example with
an empty selection on either side contributes zero (still counted in the batch mean), as in the official code."""

from __future__ import annotations

from llmx.core import preference as P
from llmx.core.train.align.run import LogpBatch, run
from llmx.core.train.align.rundata import with_data
from llmx.plugins.confpo.config import ConfPOParams


class ConfPO:
    kinds, g = ("paired",), None

    def __init__(self, p: ConfPOParams):
        self.p = p
        self.needs_reference = p.base == "dpo"

    def loss(self, b: LogpBatch):
        (tw, tl), (mw, ml) = b.halves(b.pi), b.halves(b.mask)
        if self.p.base == "simpo":
            loss, stats = P.confpo_simpo_loss(tw, mw, tl, ml, self.p.beta, self.p.gamma)
        else:
            rw, rl = b.halves(b.ref)
            loss, stats = P.confpo_dpo_loss(tw, rw, mw, tl, rl, ml, self.p.beta, self.p.reduction)
        frac = (stats["selected_w"] + stats["selected_l"]) / (mw.sum(-1) + ml.sum(-1)).clamp(min=1)
        return loss, {"selected_fraction": frac}


def confpo(ctx, p: ConfPOParams) -> dict:
    p = with_data(ctx, p, "paired")
    return {"base": p.base, **run(ctx, p, ConfPO(p), "confpo")}
