"""Quamba2 (arXiv 2503.22879) on a Mamba / Mamba2 model, following the official recipe order:

1. convert transformers' mixers to llmx mixers; fold norms and rotate the residual stream (Sec. 4.3) unless the
   recipe is ``naive``;
2. A8, quamba2 recipe (Mamba2): sort-and-cluster x on calibration data and rearrange the weights (Sec. 4.1-4.2);
   then the online Hadamard before out_proj is switched on and its inverse fused into out_proj;
3. A8: calibrate static int8 scales on the full-precision model (x by head group x dim group, B/C per SSD group and
   the cached state per head group x dim group x state index for quamba2; percentile x and per-tensor B/C and state
   for quamba1; per-tensor min-max everywhere for naive);
4. weights: W8 per-tensor absmax; W4 GPTQ group 128 on in_proj / out_proj / lm_head, block by block on inputs that
   pass through the already-quantized blocks (naive: RTN); Mamba1's x_proj RTN and dt_proj always W8A8;
5. install packed QuantLinears (int8 inputs with static scales for A8) and the int8 points, then save.

Deviations from the official code: calibration defaults to 32 x 256 tokens of the run's data (``calib_samples``,
``calib_seq_len``; official 512 x 512 for scales and 128 x 1024 WikiText tokens for GPTQ, which here reuses the same
windows); the embedding stays in float unless ``quantize_embedding`` (the official flag; RTN int4 rows here); GPTQ's
Hessians are collected with the int8 points already installed; the int8 SSM is emulated (int8 values dequantized
into a float32 scan; the cached state is stored int8-rounded, in float).
"""

from __future__ import annotations

import torch

from llmx.core.context import RunContext
from llmx.core.models.linear import replace_module
from llmx.core.quant import apply
from llmx.core.quant.calibration import collect, forward_batches, sequential
from llmx.core.quant.formats import IntFormat, quantize
from llmx.core.quant.gptq import gptq
from llmx.core.quant.qlinear import QuantLinear
from llmx.errors import UsageError
from llmx.plugins.quamba2 import cluster, reorder
from llmx.plugins.quamba2.config import Quamba2Params
from llmx.plugins.quamba2.embedding import QuantEmbedding
from llmx.plugins.quamba2.head import QuantHead
from llmx.plugins.quamba2.mixers import Mamba2Mixer, MambaMixer, QuantMixer, convert
from llmx.plugins.quamba2.points import Int8Point, Observer
from llmx.plugins.quamba2.rotate import fold_and_rotate, fuse_output_hadamard

SSM_TYPES = ("mamba", "mamba2")


def check_model(model: torch.nn.Module, source: str) -> str:
    arch = getattr(getattr(model, "config", None), "model_type", None)
    if arch not in SSM_TYPES:
        raise UsageError(f"quamba2 quantizes Mamba and Mamba2 models; {source} is a {arch or type(model).__name__} model")
    return arch


@torch.no_grad()
def run(ctx: RunContext, p: Quamba2Params) -> dict:
    model = ctx.model
    arch = check_model(model, ctx.config.model)
    recipe = "quamba1" if (p.recipe == "quamba2" and arch == "mamba") else p.recipe
    if recipe != p.recipe:
        ctx.log.info("Mamba1 has no SSD groups: using the quamba1 recipe, as the official code does")
    a8 = p.bitspec.act == 8
    mixers = convert(model)
    rotated = p.hadamard and recipe != "naive"
    if rotated:
        fold_and_rotate(model)
    batches = apply.calibration(ctx, p)
    extra = {"recipe": recipe, "activations": "int8" if a8 else "float", "arch": arch, "rotated": rotated,
             "calib_tokens": int(batches.numel())}
    linears = target_linears(model, p.quantize_lm_head)
    clusters = cluster_and_reorder(ctx, model, mixers, batches, p) if a8 and recipe == "quamba2" else []
    if clusters:
        extra["x_scales_per_layer"] = sum(len(b) - 1 for b in clusters[0].dim_bounds)
    if rotated:
        fuse_output_hadamard(model)
    act_scales = calibrate(ctx, model, mixers, linears, batches, recipe, clusters, p) if a8 else {}
    quantize_weights(ctx, model, linears, batches, recipe, act_scales, p)
    if p.quantize_embedding:
        model.backbone.embeddings = QuantEmbedding.from_embedding(model.backbone.embeddings, p.group_size)
        extra["embedding_bytes"] = sum(b.nbytes for b in model.backbone.embeddings.buffers())
    return apply.finish(ctx, p, "quamba2", extra)


def target_linears(model: torch.nn.Module, lm_head: bool) -> dict[str, torch.nn.Linear]:
    names = ("in_proj", "out_proj", "x_proj", "dt_proj")
    out = {f"backbone.layers.{i}.mixer.{n}": getattr(layer.mixer, n) for i, layer in enumerate(model.backbone.layers)
           for n in names if hasattr(layer.mixer, n)}
    if lm_head:
        out["lm_head"] = model.lm_head
    return out


def cluster_and_reorder(ctx, model, mixers: list[QuantMixer], batches, p: Quamba2Params) -> list[cluster.Clustering]:
    """Sec. 4.1-4.2: the x statistic on calibration data, sort-and-cluster per layer, then the offline rearrangement."""
    observers = []
    for m in mixers:
        m.points["x"] = Observer()
        observers.append(m.points["x"])
    forward_batches(model, batches, progress=ctx.progress, description="sort-and-cluster statistics")
    out = []
    for m, obs in zip(mixers, observers, strict=True):
        del m.points["x"]
        c = cluster.sort_and_cluster(obs.meanabs, m.heads, m.head_dim, m.groups, p.head_groups, p.dim_groups,
                                     p.cluster_features)
        reorder.apply(m, c.head_index, c.within)
        out.append(c)
    return out


def calibrate(ctx, model, mixers: list[QuantMixer], linears: dict, batches, recipe: str,
              clusters: list[cluster.Clustering], p: Quamba2Params) -> dict[str, float]:
    """Static int8 scales: installs an ``Int8Point`` at every quantized point and returns each Linear's input scale
    (in_proj and out_proj inputs are quantized by their QuantLinears, from the same pass)."""
    for m in mixers:
        for name in set(m.POINTS) - {"in_proj_in", "ssm_out"}:
            m.points[name] = Observer(p.x_percentile if name == "x" and recipe == "quamba1" else None)
    stats = collect(model, linears, batches, with_hessian=False, progress=ctx.progress)
    act = {name: s.absmax / 127 for name, s in stats.items()}
    for i, m in enumerate(mixers):
        obs = dict(m.points)
        m.points.clear()
        scales = point_scales(m, obs, recipe, clusters[i] if clusters else None)
        for name, scale in scales.items():
            m.points[name] = Int8Point(scale, row=m.state if name == "state" else 1)
        if isinstance(m, MambaMixer):  # x_proj reads the quantized x with the same scale
            act[f"backbone.layers.{i}.mixer.x_proj"] = float(scales["x"])
    return act


def point_scales(m: QuantMixer, obs: dict[str, Observer], recipe: str, c: cluster.Clustering | None) -> dict:
    tensor = {n: o.tensor_scale() for n, o in obs.items()}
    if isinstance(m, Mamba2Mixer):
        gs = m.groups * m.state
        if recipe == "naive":
            conv_in = tensor["conv_in"].expand(m.inner + 2 * gs)
        else:  # in_proj writes x, B and C with separate output scales
            parts = obs["conv_in"].absmax.split([m.inner, gs, gs])
            conv_in = torch.cat([(t.max() / 127).expand(len(t)) for t in parts])
        out = {"conv_in": conv_in, "z": tensor["z"], "dt": tensor["dt"], "state": tensor["state"]}
        if recipe == "quamba2":
            out.update(x=cluster.grouped_scales(obs["x"].absmax, c, m.head_dim),
                       B=obs["B"].group_scale(m.groups), C=obs["C"].group_scale(m.groups),
                       state=cluster.grouped_scales(obs["state"].absmax, c, m.head_dim, m.state))
        else:
            x = obs["x"].percentile_scale() if recipe == "quamba1" else tensor["x"]
            out.update(x=x, B=tensor["B"], C=tensor["C"])
        return out
    x = obs["x"].percentile_scale() if recipe == "quamba1" else tensor["x"]
    return {"x": x, "xproj_out": tensor["xproj_out"], "dt": tensor["dt"], "z": tensor["z"], "state": tensor["state"]}


def weight_format(name: str, linear: torch.nn.Linear, bits: int, p: Quamba2Params) -> IntFormat:
    if bits == 8 or name.endswith("dt_proj"):
        return IntFormat(8, 0, True, full_range=False)  # per-tensor absmax / 127, as the official W8 code
    return IntFormat(4, p.group_size if p.group_size < linear.in_features else None, True, p.grid == "full")


def quantize_weights(ctx, model, linears: dict, batches, recipe: str, act_scales: dict[str, float], p: Quamba2Params):
    """W8: per-tensor RTN. W4: GPTQ on in_proj / out_proj / lm_head (RTN for the naive recipe and for Mamba1's
    x_proj); Mamba1's dt_proj is W8A8 under A8 and stays in float under W4A16, as in the official code."""
    bits, a8 = p.bitspec.weight, p.bitspec.act == 8
    if not a8:
        linears = {n: lin for n, lin in linears.items() if not n.endswith(("x_proj", "dt_proj"))}
    use_gptq = bits == 4 and recipe != "naive"

    def install(name: str, linear: torch.nn.Linear, codes, scale, zero, fmt: IntFormat) -> None:
        cls = QuantHead if name == "lm_head" else QuantLinear
        q = cls.from_codes(linear, codes, scale, zero, fmt, 8 if a8 else 16, act_scales.get(name) if a8 else None)
        replace_module(model, name, q)

    def quantize_block(block: dict, stats: dict) -> None:
        for name, linear in block.items():
            fmt = weight_format(name, linear, bits, p)
            if use_gptq and not name.endswith(("x_proj", "dt_proj")):
                res = gptq(linear.weight, stats[name].hessian.float(), fmt, percdamp=p.percdamp)
                install(name, linear, res.codes, res.scale, res.zero, fmt)
            else:
                install(name, linear, *quantize(linear.weight, fmt), fmt)

    if use_gptq:
        sequential(model, linears, batches, quantize_block, propagate="quantized", progress=ctx.progress)
    else:
        quantize_block(linears, {})
