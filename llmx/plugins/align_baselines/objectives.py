"""DPO, SimPO and KTO objectives over a LogpBatch (the math is in ``llmx.core.preference``)."""

from __future__ import annotations

from llmx.core import preference as P
from llmx.core.train.align.run import LogpBatch, run
from llmx.core.train.align.rundata import with_data
from llmx.plugins.align_baselines.config import DPOParams, IPOParams, KTOParams, SimPOParams


class DPO:
    kinds, needs_reference, g = ("paired",), True, None

    def __init__(self, p: DPOParams):
        self.p = p

    def loss(self, b: LogpBatch):
        (pw, pl), (rw, rl) = b.halves(b.sums(b.pi)), b.halves(b.sums(b.ref))
        loss = P.dpo_loss(pw, pl, rw, rl, self.p.beta, self.p.label_smoothing)
        return loss, {"reward_margin": (pw - rw) - (pl - rl)}


class IPO:
    """IPO on per-token mean log-probs (as TRL's ``loss_type="ipo"``; ``length_normalize: false`` uses sums, as the
    paper's sequence log-likelihoods)."""

    kinds, needs_reference, g = ("paired",), True, None

    def __init__(self, p: IPOParams):
        self.p = p

    def loss(self, b: LogpBatch):
        pool = b.means if self.p.length_normalize else b.sums
        (pw, pl), (rw, rl) = b.halves(pool(b.pi)), b.halves(pool(b.ref))
        return P.ipo_loss(pw, pl, rw, rl, self.p.beta), {"margin": (pw - rw) - (pl - rl)}


class SimPO:
    kinds, needs_reference, g = ("paired",), False, None

    def __init__(self, p: SimPOParams):
        self.p = p

    def loss(self, b: LogpBatch):
        w, lose = b.halves(b.means(b.pi))
        return P.simpo_loss(w, lose, self.p.beta, self.p.gamma), {"avg_logp_margin": w - lose}


class KTO:
    """TRL's KTO (Ethayarajh et al. 2024, eq. 7); the reference point ``z_ref`` is TRL's KL estimate on mismatched
    pairs (``reference_point: mismatched``) or the batch's own completions (``batch_self``), over every rank."""

    kinds, needs_reference, g = ("unpaired",), True, None

    def __init__(self, p: KTOParams):
        self.p = p
        self.kl_pairs = p.reference_point == "mismatched"

    def loss(self, b: LogpBatch):
        pi, ref = b.sums(b.pi), b.sums(b.ref)
        z = P.kto_kl_estimate(b.kl_pi, b.kl_ref) if self.kl_pairs else P.kto_kl_estimate(pi, ref)
        loss = P.kto_loss(pi, ref, b.labels, z, self.p.beta, self.p.desirable_weight, self.p.undesirable_weight)
        return loss, {"kl_estimate": z.expand_as(pi)}


def dpo(ctx, p: DPOParams) -> dict:
    p = with_data(ctx, p, "paired")
    return run(ctx, p, DPO(p), "dpo")


def ipo(ctx, p: IPOParams) -> dict:
    p = with_data(ctx, p, "paired")
    return run(ctx, p, IPO(p), "ipo")


def simpo(ctx, p: SimPOParams) -> dict:
    p = with_data(ctx, p, "paired")
    return run(ctx, p, SimPO(p), "simpo")


def kto(ctx, p: KTOParams) -> dict:
    p = with_data(ctx, p, "unpaired")
    return run(ctx, p, KTO(p), "kto")
