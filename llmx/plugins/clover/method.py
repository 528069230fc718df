"""CLOVER's ``prune`` stage: orthogonalise, rank by singular value (or a baseline score), slice (Sec. 3.1-3.2)."""

from __future__ import annotations

import torch

from llmx.core.context import RunContext
from llmx.errors import UsageError
from llmx.plugins.clover import transform as T
from llmx.plugins.clover.attention import CloverAttention, convert_model, head_counts
from llmx.plugins.clover.config import CloverPruneParams


def pair_targets(layers: list[CloverAttention], requested: list[str] | None) -> list[str]:
    """The pairs to transform: Q-K only where no RoPE sits between Q and K."""
    rope = any(a.rope for a in layers)
    if requested is None:
        return ["vo"] if rope else ["qk", "vo"]
    if "qk" in requested and rope:
        raise UsageError("Q-K pruning needs a model without RoPE between Q and K (this one has RoPE); use targets: [vo]")
    return list(dict.fromkeys(requested))


def kv_bytes_per_token(layers, dtype_bytes: int) -> int:
    return sum(head_counts(a)[1] * (a.qk_dim + a.vo_dim) * dtype_bytes for a in layers)


def _width(attn: CloverAttention, target: str) -> int:
    return attn.qk_dim if target == "qk" else attn.vo_dim


@torch.no_grad()
def activation_norms(ctx: RunContext, layers: list[CloverAttention], p: CloverPruneParams) -> list[dict]:
    """Per layer, the L2 norm over the calibration tokens of every q, k and v output channel."""
    from llmx.core.data import random_windows

    windows = random_windows(ctx.tokenizer, ctx.config.data.source, p.calib_windows, p.calib_seq_len, ctx.config.seed,
                             splitting=ctx.config.data.splitting)
    sums = [{} for _ in layers]
    hooks = []
    for i, attn in enumerate(layers):
        for name in ("q", "k", "v"):
            def hook(_m, _inp, out, i=i, name=name):
                sq = out.detach().double().square().reshape(-1, out.shape[-1]).sum(0)
                sums[i][name] = sums[i].get(name, 0) + sq
            hooks.append(getattr(attn, f"{name}_proj").register_forward_hook(hook))
    device = next(ctx.model.parameters()).device
    try:
        for x in ctx.progress(windows.split(4), description="CLOVER activation norms"):
            ctx.model(input_ids=x.to(device))
    finally:
        for h in hooks:
            h.remove()
    return [{k: v.sqrt() for k, v in layer.items()} for layer in sums]


@torch.no_grad()
def prune(ctx: RunContext, p: CloverPruneParams) -> dict:
    layers = convert_model(ctx.model, ctx.config.model)
    targets = pair_targets(layers, p.targets)
    if p.layer_keep is not None and len(p.layer_keep) != len(layers):
        raise UsageError(f"layer_keep has {len(p.layer_keep)} entries; the model has {len(layers)} attention layers")
    for i, keep in enumerate(p.layer_keep or []):
        width = min(_width(layers[i], t) for t in targets)
        if keep > width:
            raise UsageError(f"layer_keep[{i}] = {keep} exceeds the layer's head width {width}")
    elem = next(ctx.model.parameters()).element_size()
    before = {"params": sum(t.numel() for t in ctx.model.parameters()), "kv": kv_bytes_per_token(layers, elem)}
    norms = activation_norms(ctx, layers, p) if p.criterion == "activation" else None

    def scores(i: int, attn: CloverAttention, target: str) -> list[torch.Tensor]:
        dim = _width(attn, target)
        if p.criterion == "clover":
            return T.orthogonalize(attn, target, dim)
        if p.criterion == "vanilla":
            return T.vanilla_scores(attn, target, dim)
        return T.activation_scores(attn, target, dim, norms[i])

    all_scores = {t: [scores(i, a, t) for i, a in enumerate(ctx.progress(layers, description=f"CLOVER {p.criterion} "
                                                                          f"{t}"))] for t in targets}
    counts = {}
    for t, per_layer in all_scores.items():
        if p.mode == "global":
            total = sum(s.numel() for layer in per_layer for s in layer)
            counts[t] = T.global_counts(per_layer, max(1, round(total * (1 - p.ratio))))
        else:
            counts[t] = [[p.layer_keep[i] if p.layer_keep else max(1, round(_width(layers[i], t) * (1 - p.ratio)))]
                         * len(layer) for i, layer in enumerate(per_layer)]
    kept_mass, total_mass, kept_dims = 0.0, 0.0, dict.fromkeys(targets, 0)
    for i, attn in enumerate(layers):
        keeps = {}
        for t in targets:
            group_scores, group_counts = all_scores[t][i], counts[t][i]
            width = max(1, max(group_counts))
            ranked = [torch.argsort(s, descending=True) for s in group_scores]
            T.zero_dims(attn, t, _width(attn, t), [r[c:width] for r, c in zip(ranked, group_counts, strict=True)])
            keeps[t] = [torch.sort(r[:width]).values for r in ranked]  # the zeroing's own ranking (ties included)
            for s, r, c in zip(group_scores, ranked, group_counts, strict=True):
                kept_mass += float(s[r[:c]].sum())
                total_mass += float(s.sum())
            kept_dims[t] += sum(group_counts)
        T.prune(attn, keeps.get("qk"), keeps.get("vo"))
    after = {"params": sum(t.numel() for t in ctx.model.parameters()), "kv": kv_bytes_per_token(layers, elem)}
    out = {"criterion": p.criterion, "mode": p.mode, "ratio": p.ratio, "targets": ",".join(targets),
           "qk_dim": max(a.qk_dim for a in layers), "vo_dim": max(a.vo_dim for a in layers),
           "layer_qk_dims": [a.qk_dim for a in layers], "layer_vo_dims": [a.vo_dim for a in layers],
           **{f"{t}_dims_kept": kept_dims[t] for t in targets},
           "params_before": before["params"], "params_after": after["params"],
           "kv_bytes_per_token_before": before["kv"], "kv_bytes_per_token_after": after["kv"],
           "score_mass_kept": kept_mass / max(total_mass, 1e-30)}
    if p.save:
        from llmx.core import models

        out["model_dir"] = str(models.save(ctx.model, ctx.tokenizer, ctx.artifact("model"),
                                           {"source": ctx.config.model, "method": "clover", "params": p.model_dump()}))
    return out
