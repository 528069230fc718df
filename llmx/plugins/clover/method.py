"""CLOVER stages: ``prune`` (orthogonalise, rank by singular value, slice) and ``train`` (singular-value cores)."""

from __future__ import annotations

import torch
from torch.nn.utils import parametrize

from llmx.core.context import RunContext
from llmx.errors import UsageError
from llmx.plugins.clover import transform as T
from llmx.plugins.clover.attention import attention_layers, convert, head_counts
from llmx.plugins.clover.config import CloverPruneParams, CloverTrainParams


def _layers(ctx: RunContext):
    layers = attention_layers(ctx.model)
    if not layers:
        raise UsageError(f"model '{ctx.config.model}' has no attention layers CLOVER supports (Llama-family or OPT)")
    return [convert(m) for _, m in layers]


def _targets(layers, requested: list[str] | None) -> list[str]:
    rope = hasattr(layers[0], "o_proj")  # Llama-family: RoPE sits between Q and K
    if requested is None:
        return ["vo"] if rope else ["qk", "vo"]
    if "qk" in requested and rope:
        raise UsageError("Q-K pruning needs a model without RoPE between Q and K (this one has RoPE); use targets: [vo]")
    return list(dict.fromkeys(requested))


def kv_bytes_per_token(layers, dtype_bytes: int) -> int:
    return sum(head_counts(a)[1] * (a.qk_dim + a.vo_dim) * dtype_bytes for a in layers)


@torch.no_grad()
def prune(ctx: RunContext, p: CloverPruneParams) -> dict:
    layers = _layers(ctx)
    targets = _targets(layers, p.targets)
    if p.layer_keep is not None and len(p.layer_keep) != len(layers):
        raise UsageError(f"layer_keep has {len(p.layer_keep)} entries; the model has {len(layers)} attention layers")
    elem = next(ctx.model.parameters()).element_size()
    before = {"params": sum(t.numel() for t in ctx.model.parameters()), "kv": kv_bytes_per_token(layers, elem)}
    kept_energy, total_energy = 0.0, 0.0
    for i, attn in enumerate(ctx.progress(layers, description=f"CLOVER {p.criterion}")):
        keeps = {}
        for target in targets:
            dim = attn.qk_dim if target == "qk" else attn.vo_dim
            keep = p.layer_keep[i] if p.layer_keep is not None else max(1, round(dim * (1 - p.ratio)))
            if keep > dim:
                raise UsageError(f"layer_keep[{i}] = {keep} exceeds the head dim {dim}")
            scores = (T.orthogonalize if p.criterion == "clover" else T.vanilla_scores)(attn, target, dim)
            keeps[target] = T.keep_indices(scores, keep)
            for s, idx in zip(scores, keeps[target], strict=True):
                kept_energy += float(s[idx].sum())
                total_energy += float(s.sum())
        T.prune(attn, keeps.get("qk"), keeps.get("vo"))
    after = {"params": sum(t.numel() for t in ctx.model.parameters()), "kv": kv_bytes_per_token(layers, elem)}
    out = {"criterion": p.criterion, "ratio": p.ratio, "targets": ",".join(targets),
           "qk_dim": layers[0].qk_dim, "vo_dim": layers[0].vo_dim, "params_before": before["params"],
           "params_after": after["params"], "kv_bytes_per_token_before": before["kv"],
           "kv_bytes_per_token_after": after["kv"], "score_mass_kept": kept_energy / max(total_energy, 1e-30)}
    if p.save:
        from llmx.core import models

        out["model_dir"] = str(models.save(ctx.model, ctx.tokenizer, ctx.artifact("model"),
                                           {"source": ctx.config.model, "method": "clover", "params": p.model_dump()}))
    return out


class Core(torch.nn.Module):
    """One trainable ``r x r`` matrix per KV group, applied to the rows of a projection (weight and bias)."""

    def __init__(self, groups: int, dim: int, like: torch.Tensor):
        super().__init__()
        self.core = torch.nn.Parameter(torch.eye(dim, dtype=like.dtype, device=like.device).repeat(groups, 1, 1))

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        g, r, _ = self.core.shape
        return (self.core @ w.reshape(g, r, -1)).reshape(w.shape)


def finetune(ctx: RunContext, p: CloverTrainParams) -> dict:
    """Freeze everything but one core per KV group and pair (on K for Q-K, on V for V-O), train, merge back."""
    from llmx.core.data import random_windows
    from llmx.core.eval.lm import mean_nll
    from llmx.core.train.distributed import is_main, world
    from llmx.core.train.stage import fit, prepare, release

    model = prepare(ctx, ctx.model, p)
    layers = _layers(ctx)
    targets = _targets(layers, p.targets)
    n_params = sum(t.numel() for t in model.parameters())
    if p.basis == "svd":
        with torch.no_grad():
            for attn in layers:
                for target in targets:
                    T.orthogonalize(attn, target, attn.qk_dim if target == "qk" else attn.vo_dim)
    for t in model.parameters():
        t.requires_grad_(False)
    cores = []
    for attn in layers:
        kv = head_counts(attn)[1]
        for target in targets:
            lin, dim = (attn.k_proj, attn.qk_dim) if target == "qk" else (attn.v_proj, attn.vo_dim)
            core = Core(kv, dim, lin.weight)
            for name in ("weight", "bias") if lin.bias is not None else ("weight",):
                parametrize.register_parametrization(lin, name, core)
            cores.append((lin, core))
    trainable = {f"core.{i}": c.core for i, (_, c) in enumerate(cores)}
    source = ctx.config.data.source
    count = p.steps * p.grad_accum * world()[1] * p.batch_size  # one window per example of every micro-batch
    train_windows = random_windows(ctx.tokenizer, source, count, p.seq_len, ctx.config.seed)
    held_out = random_windows(ctx.tokenizer, source, p.eval_windows, p.seq_len, ctx.config.seed, split="validation")
    seen = train_windows[: p.eval_windows]  # windows the first steps train on: the objective itself
    before, train_before = mean_nll(model.eval(), held_out), mean_nll(model, seen)

    device = next(model.parameters()).device

    def loss(i: int) -> torch.Tensor:  # micro-batch i: a pure function of i (exact resume, disjoint DDP shards)
        x = train_windows[i * p.batch_size:(i + 1) * p.batch_size].to(device)
        return model(input_ids=x, labels=x).loss

    result = fit(ctx, model, loss, p, params=trainable)
    release(model, p)
    after, train_after = mean_nll(model, held_out), mean_nll(model, seen)
    for lin, _ in cores:
        for name in list(lin.parametrizations):
            parametrize.remove_parametrizations(lin, name, leave_parametrized=True)
    merged = mean_nll(model, held_out)
    out = {"basis": p.basis, "targets": ",".join(targets), "trainable_params": sum(t.numel() for t in trainable.values()),
           "steps": result.steps, "train_nll_before": train_before, "train_nll_after": train_after,
           "val_nll_before": before, "val_nll_after": after, "val_nll_merged": merged,
           "params_before": n_params, "params_after": sum(t.numel() for t in model.parameters())}
    if p.save and is_main():
        from llmx.core import models

        out["model_dir"] = str(models.save(model, ctx.tokenizer, ctx.artifact("model"),
                                           {"source": ctx.config.model, "method": "clover-train",
                                            "params": p.model_dump()}))
    return out
