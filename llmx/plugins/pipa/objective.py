"""PIPA (Li, Wang, Liu; ICML 2025): preference alignment as MLE of p(y | x, c=1) under a prior tied to the reference.

Data: paired, unpaired (answer level) or step-level. ``g = p(c=1 | x)`` is a linear head on the last prompt token's
hidden state (answer level) or on the hidden state before each step (step level), trained with the policy. The loss
forms are derived by Bayes' rule from the paper's priors (there is no official code): see ``llmx.core.preference``.
Step level sums the policy / reference log-ratio over each step's tokens and applies the unpaired loss per annotated
step (the notes leave ``step`` vs ``token`` ratios open; this is ``step``).
"""

from __future__ import annotations

import torch

from llmx.core import preference as P
from llmx.core.train.align.run import LogpBatch, run
from llmx.plugins.pipa.config import PIPAParams


class PIPA:
    kinds, needs_reference = ("paired", "unpaired", "step"), True

    def __init__(self, p: PIPAParams, kind: str):
        self.p = p
        conditional_n = kind == "paired" and p.variant == "n" and p.pair_mode == "conditional"
        self.g = None if conditional_n else ("step" if kind == "step" else "answer")

    def bound(self, pi, ref, g_logit):
        """Per row: 1 where the unbounded log q is above ``clamp_logq`` (where a hard clamp has no gradient)."""
        import torch.nn.functional as F

        return ((pi + F.logsigmoid(g_logit) - ref).detach() > self.p.clamp_logq).float()

    def bound_rates(self, pi, ref, g_logit, labels, mask=None) -> dict[str, torch.Tensor]:
        """How often the bound binds on positive and on negative rows (on a negative the hard clamp gives the
        largest loss and no gradient: such a row is never corrected)."""
        hit = self.bound(pi, ref, g_logit)
        mask = torch.ones_like(hit) if mask is None else mask
        pos, neg = labels * mask, (1 - labels) * mask
        return {"bound_rate_pos": (hit * pos).sum() / pos.sum().clamp(min=1),
                "bound_rate_neg": (hit * neg).sum() / neg.sum().clamp(min=1)}

    def loss(self, b: LogpBatch):
        p = self.p
        if b.kind == "paired" and p.pair_mode == "independent":  # (y_w, c=1) and (y_l, c=0), g learned
            pi, ref = b.sums(b.pi), b.sums(b.ref)
            g = b.g.repeat(2)
            labels = torch.cat([torch.ones_like(b.g), torch.zeros_like(b.g)])
            if p.variant == "n":
                per_row = P.pipa_n_loss(pi, ref, g, labels)
                stats = {"g": b.g.sigmoid()}
            else:
                per_row = P.pipa_m_loss(pi, ref, g, labels, p.clamp_logq, p.m_stabilizer)
                stats = {"g": b.g.sigmoid(), **self.bound_rates(pi, ref, g, labels)}
            return sum(b.halves(per_row)) / 2, stats
        if b.kind == "paired":
            (pw, pl), (rw, rl) = b.halves(b.sums(b.pi)), b.halves(b.sums(b.ref))
            if p.variant == "n":
                return P.pipa_n_paired_loss(pw, pl, rw, rl, p.beta), {"margin": (pw - rw) - (pl - rl)}
            return (P.pipa_m_paired_loss(pw, pl, rw, rl, b.g, p.clamp_logq, p.m_stabilizer),
                    {"g": b.g.sigmoid(), "bound_rate_chosen": self.bound(pw, rw, b.g),
                     "bound_rate_rejected": self.bound(pl, rl, b.g)})
        if b.kind == "unpaired":
            pi, ref = b.sums(b.pi), b.sums(b.ref)
            if p.variant == "n":
                return P.pipa_n_loss(pi, ref, b.g, b.labels), {"g": b.g.sigmoid()}
            return (P.pipa_m_loss(pi, ref, b.g, b.labels, p.clamp_logq, p.m_stabilizer),
                    {"g": b.g.sigmoid(), **self.bound_rates(pi, ref, b.g, b.labels)})
        pi, ref = b.step_sums(b.pi), b.step_sums(b.ref)
        stats = {"g": b.g.sigmoid().mean(-1)}
        if p.variant == "n":
            per_step = P.pipa_n_loss(pi, ref, b.g, b.labels)
        else:
            per_step = P.pipa_m_loss(pi, ref, b.g, b.labels, p.clamp_logq, p.m_stabilizer)
            stats.update(self.bound_rates(pi, ref, b.g, b.labels, b.step_mask))
        return (per_step * b.step_mask).sum(-1) / b.step_mask.sum(-1).clamp(min=1), stats


def pipa(ctx, p: PIPAParams) -> dict:
    from llmx.core.train.align.data import load
    from llmx.core.train.align.rundata import with_data

    p = with_data(ctx, p, p.run_rows)
    kind, _ = load(p.data)
    return {"variant": p.variant, "pair_mode": p.pair_mode, **run(ctx, p, PIPA(p, kind), "pipa")}
