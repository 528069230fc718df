"""``train --method lift``: the ``sft`` stage with ``LiftSparseAdamW`` over every ``nn.Linear`` weight inside the
decoder blocks (embeddings, the output head, norms and biases frozen, as the official ``--no_grad head``)."""

from __future__ import annotations

from typing import Any

import torch

from llmx.core.context import RunContext
from llmx.core.memory import peak_rss_bytes
from llmx.core.models.blocks import decoder_blocks
from llmx.core.train.sft.run import run as sft
from llmx.errors import UsageError
from llmx.plugins.lift.config import LiftParams
from llmx.plugins.lift.optimizer import LiftSparseAdamW


def linear_weights(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """The weights of the ``nn.Linear`` layers inside the decoder blocks, by parameter name."""
    try:
        blocks = decoder_blocks(model)
    except ValueError as exc:
        raise UsageError(f"lift: {exc}") from None
    inside = {id(m.weight) for block in blocks for m in block.modules() if isinstance(m, torch.nn.Linear)}
    named = {n: t for n, t in model.named_parameters() if id(t) in inside}
    if not named:
        raise UsageError(f"lift: {type(model).__name__} has no nn.Linear weights in its decoder blocks (GPT-2's "
                         "Conv1D layers are not nn.Linear)")
    return named


def check_filter_rank(named: dict[str, torch.nn.Parameter], p: LiftParams) -> None:
    if p.mask != "lift":
        return
    name, t = min(named.items(), key=lambda kv: min(kv[1].shape))
    if p.filter_rank > min(t.shape):
        raise UsageError(f"lift: filter_rank {p.filter_rank} exceeds the rank of {name} "
                         f"({t.shape[0]} x {t.shape[1]}): choose 1..{min(t.shape)}")


def tracing_data(ctx: RunContext, p: LiftParams) -> LiftParams:
    """``p`` with ``data`` (and ``eval_data`` where not given) set to the tracing task's programs, written to the
    run's artifacts as ``analyze --method tracing`` writes them (prompt, the answer line as the completion)."""
    from llmx.core import atomic
    from llmx.core.eval import tracing

    def write(split: str, count: int) -> str:
        rows = [{"prompt": r["prompt"], "completion": r["reference"], "answer": r["answer"]}
                for r in tracing.rows(split, 0)[:count]]
        return str(atomic.write_jsonl(ctx.artifact(f"tracing_{split}.jsonl"), rows))

    update = {"data": write("train", p.tracing_rows)}
    if p.eval_data is None:
        update["eval_data"] = write("validation", min(p.tracing_rows, 500))
    return p.model_copy(update=update)


def run(ctx: RunContext, p: LiftParams) -> dict[str, Any]:
    if p.data is None:
        p = tracing_data(ctx, p)
    held: dict[str, Any] = {}

    def optimise(model: torch.nn.Module):
        named = linear_weights(model)
        check_filter_rank(named, p)
        for t in model.parameters():
            t.requires_grad_(False)
        for t in named.values():
            t.requires_grad_(True)
        if p.shira:
            held["start"] = {n: t.detach().clone() for n, t in named.items()}
        held["named"] = named

        def factory(groups: list[dict], c) -> LiftSparseAdamW:
            held["opt"] = LiftSparseAdamW(groups, lr=c.lr, rank=p.rank, filter_rank=p.filter_rank, mask=p.mask,
                                          svd=p.svd, update_interval=p.update_interval, betas=c.betas, eps=p.eps,
                                          seed=ctx.config.seed)
            return held["opt"]

        return named, factory

    out = sft(ctx, p, "lift", optimise)
    opt: LiftSparseAdamW = held["opt"]
    supports = opt.supports()
    dense = sum(t.numel() for t in held["named"].values())
    out.update(trainable_params=sum(s.numel() for s in supports.values()), sparse_matrices=len(supports),
               density=sum(s.numel() for s in supports.values()) / dense, refreshes=opt.param_groups[0]["refreshes"],
               dense_grad="transient: built by autograd, freed at each optimiser step (not sparsified by hooks)",
               peak_rss_bytes=peak_rss_bytes())
    if torch.cuda.is_available() and next(iter(supports)).is_cuda:
        out["peak_cuda_bytes"] = torch.cuda.max_memory_allocated()
    if p.shira:
        from llmx.plugins.lift.shira import export

        out.update(export(ctx, ctx.model, held["named"], held["start"], supports, p))
    return out
