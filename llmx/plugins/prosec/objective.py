"""ProSec's training step: the shared align stage on its pairs with SimPO, DPO or ConfPO (the math is in
``llmx.core.preference``)."""

from __future__ import annotations

import json
from pathlib import Path

from llmx.core import preference as P
from llmx.core.train.align.run import LogpBatch, run
from llmx.errors import UsageError
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


def run_pairs(run_dir: Path) -> str:
    """The pairs file of the latest finished analyze --method prosec of the run in ``run_dir``."""
    from llmx.core import runs

    metrics = Path(run_dir) / runs.METRICS
    for stage in reversed(json.loads(metrics.read_text())["stages"] if metrics.is_file() else []):
        if stage["metrics"].get("pairs_file"):
            return stage["metrics"]["pairs_file"]
    raise UsageError("no pairs: pass data, or put analyze --method prosec before this stage in the same run")


def align(ctx, p: ProsecAlignParams) -> dict:
    if not p.data:
        p = p.model_copy(update={"data": run_pairs(ctx.run_dir)})
    head = {"loss": p.loss, "beta": p.scale, "gamma": p.margin}
    if p.empty == "skip" and not any(line.strip() for line in Path(p.data).read_text().splitlines()):
        ctx.log.warning("%s holds no pairs: the model is left as it is (empty: skip)", p.data)
        return {**head, "pairs": 0, "steps": 0}
    return {**head, **run(ctx, p, Objective(p), "prosec")}
