"""GuidedQuant (Kim et al., ICML 2025, arXiv 2505.07004) over a whole model.

1. End-loss saliency (Sec. 3.1): one LM-loss backward per calibration window through the FP model; per Linear, the
   squared output gradients averaged over ``num_groups`` contiguous output-channel groups, and the Fisher diagonal.
2. Hessians block by block (Sec. 3.2): ``H_g = sum_n s_ng x_n x_n^T``, float64, one per group, from FP inputs for
   LNQ and through the quantized blocks for GPTQ (``propagate``; as the official LNQ and GPTQ+GQ code);
   ``guided: false`` uses plain ``X X^T`` (the baselines).
3. Backend per layer: ``gptq`` (core GPTQ on each group's rows with its ``H_g``, one packed QuantLinear), ``lnq``
   (Sec. 4: SqueezeLLM seed, then C and P steps; a LUTLinear) or ``squeezellm`` (the seed alone).

Every layer's objective trace (the guided one under ``guided``) is logged; the summed objectives are reported.
"""

from __future__ import annotations

from typing import Any

import torch

from llmx.core.context import RunContext
from llmx.core.models.linear import replace_module
from llmx.core.quant import apply, saliency
from llmx.core.quant.calibration import block_of, sequential
from llmx.core.quant.gptq import GPTQResult, gptq
from llmx.core.quant.lut import LUTLinear
from llmx.errors import UsageError
from llmx.plugins.guidedquant import lnq
from llmx.plugins.guidedquant.config import GuidedQuantParams


def guided_gptq(w: torch.Tensor, hessians: torch.Tensor, fmt, p: GuidedQuantParams) -> GPTQResult:
    """Core GPTQ on each group of rows with its own Hessian, the results stacked (GuidedQuant's GPTQ + GQ)."""
    parts = [gptq(w[a:b], hessians[g].float(), fmt, p.block_size, p.percdamp, p.actorder, p.static_groups)
             for g, (a, b) in enumerate(saliency.group_bounds(w.shape[0], hessians.shape[0]))]
    return GPTQResult(*(torch.cat([getattr(r, f) for r in parts]) for f in ("codes", "scale", "zero", "weight")))


def guided_objective(w: torch.Tensor, q: torch.Tensor, hessians: torch.Tensor) -> float:
    return sum(lnq.objective(w[a:b], q[a:b], hessians[g])
               for g, (a, b) in enumerate(saliency.group_bounds(w.shape[0], hessians.shape[0])))


def codebook_layer(linear: torch.nn.Linear, hessians: torch.Tensor, fisher: torch.Tensor | None,
                   p: GuidedQuantParams) -> tuple[LUTLinear, list[float], float]:
    """SqueezeLLM's seed and, for ``lnq``, the alternating steps, group by group: the layer, the summed objective
    trace and the objective of what is stored (fp16 codebooks)."""
    w, bits = linear.weight.detach().double(), p.bitspec.weight
    weight = fisher.to(w.device, torch.float64) if fisher is not None else torch.ones_like(w)
    weight = weight + 1e-12 * float(weight.mean()) + 1e-30  # a row no gradient reached: plain k-means
    idx, codebook, trace, damped = [], [], [], []
    for g, (a, b) in enumerate(saliency.group_bounds(w.shape[0], hessians.shape[0])):
        h = lnq.damped(hessians[g].double(), p.damp_start)
        damped.append(h)
        seed = lnq.kmeans_1d(w[a:b], weight[a:b], 2**bits)
        if p.backend == "squeezellm":
            res = lnq.LNQResult(seed[1], seed[0], [lnq.objective(w[a:b], seed[0].gather(1, seed[1]), h)])
        else:
            res = lnq.lnq(w[a:b], h, seed, p.iterations, p.cd_cycles, p.cd_block, p.ridge)
        idx.append(res.idx)
        codebook.append(res.codebook)
        trace.append(res.trace)
    steps = max(len(t) for t in trace)
    summed = [sum(t[min(i, len(t) - 1)] for t in trace) for i in range(steps)]
    layer = LUTLinear.from_indices(linear, torch.cat(idx), torch.cat(codebook), bits)
    stored = guided_objective(w, layer.dequantized_weight(torch.float64), torch.stack(damped))
    return layer, summed, stored


def run(ctx: RunContext, p: GuidedQuantParams) -> dict:
    model = ctx.model
    layers = apply.target_linears(model, p.skip)
    groups = p.num_groups if p.guided else 1
    narrow = {n: m.out_features for n, m in layers.items() if m.out_features < groups}
    if narrow:
        name, width = next(iter(narrow.items()))
        raise UsageError(f"num_groups {groups} is above {name}'s {width} output channels")
    outside = [n for n in layers if block_of(n) is None]
    if p.guided and outside:
        raise UsageError(f"guided Hessians are built block by block; {outside[0]} is in no decoder block (keep it in "
                         "skip)")
    batches = apply.calibration(ctx, p)
    needs_grad = p.guided or p.backend != "gptq"
    sal = saliency.collect(model, layers, batches, groups, p.saliency_scale, fisher=p.backend != "gptq",
                           per_token=p.guided, progress=ctx.progress) if needs_grad else None
    make_stats = (lambda n: saliency.GuidedStats(sal.tokens[n])) if p.guided else None
    traces: dict[str, list[float]] = {}
    stored: dict[str, float] = {}

    @torch.no_grad()
    def quantize_block(block: dict[str, torch.nn.Linear], stats: dict[str, Any]) -> None:
        for name, linear in block.items():
            h = stats[name].hessian
            if h is None:
                raise UsageError(f"{name} saw no calibration tokens; GuidedQuant needs its Hessian")
            if p.guided:
                stats[name].check_complete()
            h = h if p.guided else h.double()[None]
            if p.backend == "gptq":
                fmt = p.format(linear.in_features)
                res = guided_gptq(linear.weight.detach(), h, fmt, p)
                traces[name] = [guided_objective(linear.weight.detach(), res.weight, h)]
                stored[name] = traces[name][0]
                apply.install(model, name, linear, res.codes, res.scale, res.zero, fmt, p, None)
            else:
                fisher = sal.fisher.get(name) if sal is not None else None
                layer, traces[name], stored[name] = codebook_layer(linear, h, fisher, p)
                replace_module(model, name, layer)
            ctx.log.info("%s objective trace: %s", name, [f"{v:.6g}" for v in traces[name]])

    sequential(model, layers, batches, quantize_block, propagate=p.resolved_propagate, progress=ctx.progress,
               make_stats=make_stats)
    extra = {"backend": p.backend, "guided": p.guided, "num_groups": groups, "propagate": p.resolved_propagate,
             "calib_tokens": int(batches.numel()), "objective_kind": "guided H_g" if p.guided else "X X^T",
             "objective_seed": sum(t[0] for t in traces.values()), "objective": sum(min(t) for t in traces.values()),
             "objective_stored": sum(stored.values())}
    if p.backend == "gptq":
        return apply.finish(ctx, p, "guidedquant", extra)
    luts = [m for m in model.modules() if isinstance(m, LUTLinear)]
    params = sum(m.in_features * m.out_features for m in luts)
    stored = sum(t.numel() * t.element_size() for m in luts for k, t in m.state_dict().items() if k != "bias")
    out = {"bits": p.bits, "layers": len(luts), "quantized_params": params, "quantized_bytes": stored,
           "quantized_bytes_vs_fp16": stored / max(2 * params, 1),
           "weight_bits_per_element": 8 * stored / params if params else None,  # as the integer methods report it
           "bits_per_weight": 8 * stored / max(params, 1), **extra}
    return {**out, **apply.save(ctx, p, "guidedquant")} if p.save else out
