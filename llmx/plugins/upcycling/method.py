"""``llmx train --method upcycle``: the dense model becomes an E-expert top-k MoE (``core.models.upcycle``), its
logits are checked against the dense model's, then the shared ``lm`` stage trains it for D2 tokens with the checkpoint
series at ``save_at_tokens``. ``init: scratch`` trains the same MoE from a fresh init instead (the baseline)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from llmx.core.context import RunContext
from llmx.core.models.upcycle import UpcycleConfig, parameter_counts, upcycle
from llmx.core.train.checkpoint import INFO
from llmx.errors import RunFailed, UsageError
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


def source_offset(ctx: RunContext, p: UpcycleParams) -> tuple[int, str | None]:
    """``data_offset: source``: where the run that saved ``--model`` (a series checkpoint) stopped reading, and its
    data fingerprint (the lm stage refuses another stream); (0, None) for any other model and for init: scratch."""
    info = Path(ctx.config.model) / INFO
    if p.init == "scratch" or not info.is_file():
        return 0, None
    saved = json.loads(info.read_text())
    run = saved["run"]
    for key, mine in (("seq_len", p.seq_len), ("seed", ctx.config.seed)):
        if mine != run[key]:
            raise UsageError(f"data_offset source: {key} is {mine!r} here and {run[key]!r} in the run that saved "
                             f"{ctx.config.model}; set data_offset to a number")
    return int(saved["tokens_seen"]) + int(run["data"].get("offset", 0)), run["data"]["fingerprint"]


def run(ctx: RunContext, p: UpcycleParams) -> dict[str, Any]:
    from llmx.core.train.lm import run as lm

    continues = None
    if p.data_offset == "source":
        offset, continues = source_offset(ctx, p)
        p = p.model_copy(update={"data_offset": offset})

    c = UpcycleConfig(num_experts=p.num_experts, top_k=p.top_k, router_init=p.router_init, router_std=p.router_std,
                      aux_loss_coef=p.aux_loss_coef, target=p.target,
                      seed=ctx.config.seed if p.router_seed is None else p.router_seed)
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

    out = lm.run(ctx, p, method="upcycle", convert=convert, continues=continues)
    return {**out, **report, "num_experts": p.num_experts, "top_k": p.top_k, "router_init": p.router_init,
            "aux_loss_coef": p.aux_loss_coef, "data_offset": p.data_offset, "router_seed": c.seed}
