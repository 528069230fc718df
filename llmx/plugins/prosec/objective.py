"""ProSec's training step: the shared align stage on its pairs with SimPO, DPO or ConfPO (the math is in
``llmx.core.preference``)."""

from __future__ import annotations

from llmx.core import preference as P
from llmx.core.train.align.run import LogpBatch, run
from llmx.plugins.prosec.config import ProsecAlignParams


class Objective:
    kinds, g = ("paired",), None

    def __init__(self, p: ProsecAlignParams):
        self.p = p
        self.needs_reference = p.loss == "dpo"

    def loss(self, b: LogpBatch):
        p = self.p
        if p.loss == "dpo":
            (pw, pl), (rw, rl) = b.halves(b.sums(b.pi)), b.halves(b.sums(b.ref))
            return P.dpo_loss(pw, pl, rw, rl, p.scale, 0.0), {"reward_margin": (pw - rw) - (pl - rl)}
        if p.loss == "simpo":
            w, lose = b.halves(b.means(b.pi))
            return P.simpo_loss(w, lose, p.scale, p.margin), {"avg_logp_margin": w - lose}
        (tw, tl), (mw, ml) = b.halves(b.pi), b.halves(b.mask)
        loss, stats = P.confpo_simpo_loss(tw, mw, tl, ml, p.scale, p.margin)
        return loss, {"selected_fraction": (stats["selected_w"] + stats["selected_l"]) / (mw.sum(-1) + ml.sum(-1)).clamp(min=1)}


def align(ctx, p: ProsecAlignParams) -> dict:
    return {"loss": p.loss, "beta": p.scale, "gamma": p.margin, **run(ctx, p, Objective(p), "prosec")}
