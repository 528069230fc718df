"""CLOVER's ``train`` stage (Sec. 3.3; official ``clover_finetuning.py``): freeze the model, put a trainable ``r x r``
core behind each head's (or MLP block's) frozen orthonormal vectors, train, merge the cores back into plain weights.

Where the cores sit (``targets``, the official scope by default):
- ``q``: per query head, ``[W_q | b_q] = R^T Q^T`` (QR, bias folded in); ``Q^T`` frozen, ``R^T`` trains. The core acts
  before RoPE, so it is valid on RoPE models; merged, it is an ordinary ``W_q``.
- ``qk`` (no RoPE between Q and K): the pair's SVD; both sides orthonormal, ``diag(S)`` trains on the K side.
- ``vo``: per KV head the V-O SVD, ``diag(S)`` trains on the V side. Under GQA the official code uses the QR of V
  instead (``gqa_vo: qr``, default); ``gqa_vo: svd`` stacks the group's output blocks (exact as well).
- ``up``: the MLP up projection (``up_proj``, OPT's ``fc1``, GPT-2's ``c_fc``) in QR blocks of ``hidden / heads / 2``
  rows (the official block, which is head_dim / 2 unless a config sets head_dim apart).
Dropout (official 0.05) acts on the frozen vectors' output, before the core. ``basis: raw`` keeps the current
vectors with identity cores (the vanilla baseline); ``tuner: lora | pissa`` trains a PEFT adapter on the same
projections instead, at the largest rank within the cores' parameter budget, with the official PiSSA script's alpha
(2r) and the same dropout. Each micro-batch seeds its own dropout masks, so a resumed or torchrun run is exact.
"""

from __future__ import annotations

import torch

from llmx.core.context import RunContext
from llmx.errors import UsageError
from llmx.plugins.clover import transform as T
from llmx.plugins.clover.attention import CloverAttention, convert_model, head_counts
from llmx.plugins.clover.config import CloverTrainParams
from llmx.plugins.clover.method import pair_targets

UP_NAMES = ("up_proj", "fc1", "c_fc")


class CoreLinear(torch.nn.Module):
    """A frozen projection whose output, per block of ``r`` channels, goes through dropout and then a trainable
    ``r x r`` core (``y_b = C_b z_b``); ``merged()`` folds the cores into the projection."""

    def __init__(self, base: torch.nn.Module, cores: torch.Tensor, dropout: float):
        super().__init__()
        self.base = base.requires_grad_(False)
        self.core = torch.nn.Parameter(cores.detach().float().clone())
        self.dropout = torch.nn.Dropout(dropout)
        self.train(base.training)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.dropout(self.base(x))
        g, r, _ = self.core.shape
        y = torch.einsum("...gr,gsr->...gs", z.unflatten(-1, (g, r)), self.core.to(z.dtype))
        return y.flatten(-2)

    @torch.no_grad()
    def merged(self) -> torch.nn.Module:
        g, r, _ = self.core.shape
        core = self.core.double()
        T.set_rows(self.base, (core @ T.rows_of(self.base).double().reshape(g, r, -1)).reshape(g * r, -1))
        if self.base.bias is not None:
            self.base.bias.copy_((core @ self.base.bias.double().reshape(g, r, 1)).flatten().to(self.base.bias.dtype))
        return self.base


def up_layers(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str]]:
    """(parent, attribute) of every MLP up projection held as a layer (MoE experts fused into one tensor are not)."""
    from transformers.pytorch_utils import Conv1D

    return [(m, n) for m in model.modules() for n in UP_NAMES
            if isinstance(getattr(m, n, None), (torch.nn.Linear, Conv1D))]


def up_block(model: torch.nn.Module) -> int:
    """Rows per up-projection core: the official ``hidden / heads / 2``."""
    return model.config.hidden_size // model.config.num_attention_heads // 2


def tune_targets(layers: list[CloverAttention], model: torch.nn.Module, requested: list[str] | None) -> list[str]:
    rope = any(a.rope for a in layers)
    if requested is None:
        return ["q" if rope else "qk", "vo"] + (["up"] if up_layers(model) else [])
    pair_targets(layers, [t for t in requested if t in ("qk", "vo")])
    if "up" in requested and not up_layers(model):
        raise UsageError(f"target up: this model has no MLP up projection layer ({', '.join(UP_NAMES)}); MoE "
                         "experts fused into one tensor are not supported")
    return list(dict.fromkeys(requested))


def _install(ctx: RunContext, layers: list[CloverAttention], targets: list[str], p: CloverTrainParams
             ) -> list[tuple[torch.nn.Module, str, CoreLinear]]:
    """Replace every target projection by a ``CoreLinear``; the model computes the same function at init."""
    orthogonal = p.basis == "orthogonal"
    installed = []

    def put(parent: torch.nn.Module, name: str, block: int, svd: list[torch.Tensor] | None = None) -> None:
        """Cores for ``parent.name`` in blocks of ``block`` rows: diag(S) of an SVD done, else QR (orthogonal)
        or identities (raw)."""
        base = getattr(parent, name)
        rows = T.rows_of(base)
        if svd is not None:
            cores = torch.stack([s.diag() for s in svd])
        elif orthogonal:
            cores = T.qr_blocks(base, block)
        else:
            cores = torch.eye(block, dtype=torch.float64, device=rows.device).repeat(rows.shape[0] // block, 1, 1)
        layer = CoreLinear(base, cores, p.dropout)
        setattr(parent, name, layer)
        installed.append((parent, name, layer))

    for attn in ctx.progress(layers, description="CLOVER cores"):
        heads, kv = head_counts(attn)
        if "q" in targets:
            put(attn, "q_proj", attn.qk_dim)
        if "qk" in targets:
            put(attn, "k_proj", attn.qk_dim, T.orthogonalize(attn, "qk", attn.qk_dim, scaled=False) if orthogonal
                else None)
        if "vo" in targets:
            svd = orthogonal and not (kv < heads and p.gqa_vo == "qr")
            put(attn, "v_proj", attn.vo_dim, T.orthogonalize(attn, "vo", attn.vo_dim, scaled=False) if svd else None)
    if "up" in targets:
        block = up_block(ctx.model)
        for parent, name in up_layers(ctx.model):
            out = T.rows_of(getattr(parent, name)).shape[0]
            if block < 1 or out % block:
                raise UsageError(f"target up: {out} up-projection rows do not split into blocks of hidden/heads/2 = "
                                 f"{block}")
            put(parent, name, block)
    return installed


def _core_budget(layers: list[CloverAttention], model: torch.nn.Module, targets: list[str]) -> int:
    """The trainable parameters CLOVER's cores would have on these targets."""
    total = 0
    for a in layers:
        heads, kv = head_counts(a)
        total += ("q" in targets) * heads * a.qk_dim ** 2 + ("qk" in targets) * kv * a.qk_dim ** 2
        total += ("vo" in targets) * kv * a.vo_dim ** 2
    if "up" in targets:
        total += sum(T.rows_of(getattr(m, n)).shape[0] * up_block(model) for m, n in up_layers(model))
    return total


def _peft_modules(targets: list[str], model: torch.nn.Module) -> list[str]:
    names = {"q": ["q_proj"], "qk": ["k_proj"], "vo": ["v_proj"], "up": sorted({n for _, n in up_layers(model)})}
    return [n for t in targets for n in names[t]]


def _adapter(ctx: RunContext, layers, targets: list[str], p: CloverTrainParams) -> tuple[torch.nn.Module, int]:
    """LoRA / PiSSA through PEFT on the cores' projections, at ``p.rank`` or the cores' budget."""
    from llmx.core.train import adapters
    from llmx.core.train.params import LoraParams

    modules = _peft_modules(targets, ctx.model)
    per_rank = sum(sum(T.rows_of(m).shape) for name, m in ctx.model.named_modules()
                   if name.rsplit(".", 1)[-1] in modules and hasattr(m, "weight"))
    budget = _core_budget(layers, ctx.model, targets)
    rank = p.rank or max(1, budget // per_rank)
    lora = LoraParams(r=rank, alpha=2.0 * rank, dropout=p.dropout, target_modules=modules, init=p.tuner)  # official
    return adapters.wrap(ctx.model, lora), rank


def finetune(ctx: RunContext, p: CloverTrainParams) -> dict:
    from llmx.core import models
    from llmx.core.data import random_windows
    from llmx.core.eval.lm import mean_nll
    from llmx.core.train import adapters
    from llmx.core.train.distributed import is_main, world
    from llmx.core.train.stage import fit, prepare, release

    layers = convert_model(ctx.model, ctx.config.model)
    targets = tune_targets(layers, ctx.model, p.targets)
    n_params = sum(t.numel() for t in ctx.model.parameters())
    for t in ctx.model.parameters():
        t.requires_grad_(False)
    out = {"tuner": p.tuner, "basis": p.basis, "targets": ",".join(targets)}
    if p.tuner == "clover":
        with torch.no_grad():
            installed = _install(ctx, layers, targets, p)
        model = ctx.model
    else:
        model, out["rank"] = _adapter(ctx, layers, targets, p)
        installed = []
    model = prepare(ctx, model, p)
    trainable = {n: t for n, t in model.named_parameters() if t.requires_grad}
    source = ctx.config.data.source
    count = p.steps * p.grad_accum * world()[1] * p.batch_size  # one window per example of every micro-batch
    train_windows = random_windows(ctx.tokenizer, source, count, p.seq_len, ctx.config.seed,
                                   splitting=ctx.config.data.splitting)
    held_out = random_windows(ctx.tokenizer, source, p.eval_windows, p.seq_len, ctx.config.seed, split="validation",
                              splitting=ctx.config.data.splitting)
    seen = train_windows[: p.eval_windows]  # windows the first steps train on: the objective itself
    before, train_before = mean_nll(model.eval(), held_out), mean_nll(model, seen)
    device = next(model.parameters()).device

    def loss(i: int) -> torch.Tensor:  # micro-batch i: a pure function of i (exact resume, disjoint DDP shards)
        x = train_windows[i * p.batch_size:(i + 1) * p.batch_size].to(device)
        torch.manual_seed(ctx.config.seed * 1_000_003 + i)  # its dropout masks too
        return model(input_ids=x, labels=x).loss

    result = fit(ctx, model, loss, p, params=trainable)
    release(model, p)
    after, train_after = mean_nll(model.eval(), held_out), mean_nll(model, seen)
    for parent, name, layer in installed:
        setattr(parent, name, layer.merged())
    if adapters.is_peft(model):
        model = adapters.merge(model)
    ctx.set_model(model.eval())
    out.update({"trainable_params": sum(t.numel() for t in trainable.values()),
                "core_budget": _core_budget(layers, model, targets), "steps": result.steps,
                "train_nll_before": train_before, "train_nll_after": train_after, "val_nll_before": before,
                "val_nll_after": after, "val_nll_merged": mean_nll(model, held_out), "params_before": n_params,
                "params_after": sum(t.numel() for t in model.parameters())})
    if p.save and is_main():
        out["model_dir"] = str(models.save(model, ctx.tokenizer, ctx.artifact("model"),
                                           {"source": ctx.config.model, "method": "clover-train",
                                            "params": p.model_dump()}))
    return out
