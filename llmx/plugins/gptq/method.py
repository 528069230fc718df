"""GPTQ over a whole model: calibration Hessians block by block, then the core solver per layer. With
``log_objectives`` (a diagnostic, off by default: two ``[out, in] x [in, in]`` products per layer) it logs each
layer's objective ``tr(dW H dW^T)`` next to RTN's on the same Hessian and records their ratio in the metrics."""

from __future__ import annotations

import torch

from llmx.core.context import RunContext
from llmx.core.quant import apply
from llmx.core.quant.calibration import sequential
from llmx.core.quant.formats import fake_quantize, quantize
from llmx.core.quant.gptq import gptq, layer_objective
from llmx.plugins.gptq.config import GPTQParams


@torch.no_grad()
def run(ctx: RunContext, p: GPTQParams) -> dict:
    model = ctx.model
    batches = apply.calibration(ctx, p)
    trace: dict[str, dict[str, float]] = {}

    def quantize_block(block, stats):
        for name, linear in block.items():
            fmt = p.format(linear.in_features)
            if stats[name].hessian is None:  # no calibration token reached it: nothing to compensate against
                ctx.log.warning("GPTQ: %s saw no calibration tokens; round to nearest instead", name)
                apply.install(model, name, linear, *quantize(linear.weight, fmt), fmt, p, None)
                continue
            h = stats[name].hessian.float()
            res = gptq(linear.weight, h, fmt, p.block_size, p.percdamp, p.actorder, p.static_groups, p.group_scale)
            if p.log_objectives:
                trace[name] = {"gptq": res.objective(linear.weight, h),
                               "rtn": layer_objective(linear.weight, fake_quantize(linear.weight, fmt), h)}
            apply.install(model, name, linear, res.codes, res.scale, res.zero, fmt, p, stats[name].absmax)

    # no reference to the float layers kept here: each is freed once its block is quantized
    sequential(model, apply.target_linears(model, p.skip), batches, quantize_block, propagate=p.propagate,
               progress=ctx.progress, true_sequential=p.true_sequential)
    extra = {"calib_tokens": int(batches.numel()), "propagate": p.propagate, "true_sequential": p.true_sequential}
    if p.log_objectives:
        ratios = [t["gptq"] / t["rtn"] for t in trace.values() if t["rtn"] > 0]
        ctx.log.info("GPTQ/RTN layer objective: %s",
                     {n: round(t["gptq"] / max(t["rtn"], 1e-30), 4) for n, t in trace.items()})
        extra.update(objective_vs_rtn_mean=sum(ratios) / max(len(ratios), 1),
                     objective_vs_rtn_max=max(ratios, default=0.0))
    return apply.finish(ctx, p, "gptq", extra)
