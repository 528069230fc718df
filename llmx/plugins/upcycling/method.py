"""``llmx train --method upcycle``: the dense model becomes an E-expert top-k MoE (``core.models.upcycle``), its
logits are checked against the dense model's, then the shared ``lm`` stage trains it for D2 tokens with the checkpoint
series at ``save_at_tokens``. ``init: scratch`` trains the same MoE from a fresh init instead (the baseline)."""

from __future__ import annotations

from typing import Any

import torch

from llmx.core.context import RunContext
from llmx.core.models.upcycle import UpcycleConfig, parameter_counts, upcycle
from llmx.errors import RunFailed
from llmx.plugins.upcycling.config import UpcycleParams


@torch.no_grad()
def logit_error(dense: torch.nn.Module, moe: torch.nn.Module, seed: int, length: int = 64) -> float:
    """Largest |logit difference| on seeded token ids (eval mode, the MoE's device)."""
    gen = torch.Generator().manual_seed(seed)
    n = min(length, dense.config.max_position_embeddings)
    x = torch.randint(0, dense.config.vocab_size, (2, n), generator=gen).to(next(moe.parameters()).device)
    was = dense.training, moe.training
    dense.eval(), moe.eval()
    err = float((moe(input_ids=x).logits - dense(input_ids=x).logits).abs().max())
    dense.train(was[0]), moe.train(was[1])
    return err


def run(ctx: RunContext, p: UpcycleParams) -> dict[str, Any]:
    from llmx.core.train.lm import run as lm

    c = UpcycleConfig(num_experts=p.num_experts, top_k=p.top_k, router_init=p.router_init, router_std=p.router_std,
                      aux_loss_coef=p.aux_loss_coef, target=p.target, seed=ctx.config.seed)
    report: dict[str, Any] = {}

    def convert(dense: torch.nn.Module) -> torch.nn.Module:
        moe = upcycle(dense, c)
        report["dense_params"] = parameter_counts(dense)
        if p.init == "scratch":
            moe = lm.fresh(moe, ctx.config.seed)
        else:
            err = logit_error(dense, moe, ctx.config.seed)
            tol = p.identity_tol or (1e-4 if next(moe.parameters()).dtype == torch.float32 else 0.1)
            report["identity_max_logit_error"] = err
            if err > tol:
                raise RunFailed(f"upcycle: the upcycled MoE's logits differ from the dense model's by {err:.3g} "
                                f"(identity_tol {tol:g})")
        report["moe_params"] = parameter_counts(moe)
        report["architecture"] = type(moe).__name__
        return moe

    out = lm.run(ctx, p, method="upcycle", convert=convert)
    return {**out, **report, "num_experts": p.num_experts, "top_k": p.top_k, "router_init": p.router_init,
            "aux_loss_coef": p.aux_loss_coef, "data_offset": p.data_offset}
