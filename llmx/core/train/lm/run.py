"""The ``lm`` stage: causal-LM training from scratch or continued, on any text source, with held-out loss, a
checkpoint series at token budgets and cooldown branches (``series``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from llmx.core import models
from llmx.core.context import RunContext
from llmx.core.models.upcycle import balance_loss_kwargs
from llmx.core.train import adapters
from llmx.core.train.distributed import world
from llmx.core.train.lm import series
from llmx.core.train.lm.data import TokenWindows, fingerprint
from llmx.core.train.lm.params import LMParams
from llmx.core.train.parallel import device_of
from llmx.core.train.stage import continue_adapter, finish, fit, prepare, save_trained
from llmx.errors import UsageError


def fresh(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """A new model of the same architecture, initialised from its config with ``seed``."""
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        new = AutoModelForCausalLM.from_config(model.config, dtype=torch.float32)
    return new.to(next(model.parameters()).device)


def run(ctx: RunContext, p: LMParams, method: str = "lm",
        convert: Callable[[torch.nn.Module], torch.nn.Module] | None = None,
        continues: str | None = None) -> dict[str, Any]:
    """Train; ``convert`` (a plugin's architecture change: FoPE's position step, say) is applied to the model to
    train, after a scratch init and before the optimiser sees it; ``method`` names the stage in what it saves;
    ``continues`` is the data fingerprint of the run whose data order ``data_offset`` continues (refused if the
    training stream differs)."""
    from llmx.core.data import fixed_windows, token_stream
    from llmx.core.eval.lm import mean_nll

    info = series.read_info(p.cooldown_from) if p.cooldown_from else None
    source = _branch(ctx, p) if p.cooldown_from else ctx.config.model
    data = p.data or ctx.config.data.source
    tok, model = ctx.tokenizer, ctx.model
    if p.init == "scratch":
        model = fresh(model, ctx.config.seed)
    if convert is not None:
        model = convert(model)
    stream = token_stream(tok, data, "train", p.max_tokens, ctx.config.data.splitting)
    stream_print = fingerprint(stream)
    if continues is not None and continues != stream_print:
        raise UsageError(f"data_offset: the training data differs from the source run's (fingerprint "
                         f"{stream_print} vs {continues}); set data_offset to a number")
    offset = _offset(p, info)
    windows = TokenWindows(stream, p.seq_len, ctx.config.seed, offset // p.seq_len)
    held = fixed_windows(token_stream(tok, data, "validation", 8 * p.eval_windows * p.seq_len,
                                      ctx.config.data.splitting), p.seq_len,
                         p.eval_windows)
    _, size = world()
    tps = p.batch_size * p.seq_len * p.grad_accum * size
    config = p.loop_config(eval_every=p.eval_every)
    shape = {"schedule": p.schedule, "lr": p.lr, "warmup": p.warmup, "steps": p.steps,
             "decay_steps": config.decay_steps, "min_lr_ratio": p.min_lr_ratio, "weight_decay": p.weight_decay,
             "tokens_per_step": tps, "seq_len": p.seq_len, "batch_size": p.batch_size, "grad_accum": p.grad_accum,
             "world_size": size, "seed": ctx.config.seed, "model": source, "init": p.init,
             "data": {"source": data, "fingerprint": stream_print, "tokens": len(stream),
                      "offset": offset}}
    if info is not None:
        config = series.cooldown(info, shape, p.cooldown_fraction, config)
        shape.update(schedule="wsd", steps=config.steps, decay_steps=config.decay_steps, lr=config.lr,
                     warmup=config.warmup, cooldown_from=p.cooldown_from)
    at = series.budget_steps(p.save_at_tokens, tps, config.steps)
    moe = balance_loss_kwargs(model)  # before prepare wraps it
    model = prepare(ctx, model, p)
    device = device_of(model)
    before = mean_nll(model.eval(), held)

    def loss(i: int) -> torch.Tensor:
        x = windows.batch(i, p.batch_size).to(device)
        return model(input_ids=x, labels=x, **moe).loss

    resume = p.resume or p.cooldown_from
    folder = ctx.artifact("series")
    writer = series.Series(folder, shape, at,
                           lambda path, files: save_trained(ctx, model, path, p, method, files, source=source),
                           series.carried(p.resume))
    result = fit(ctx, model, loss, p, config, evaluate=lambda: mean_nll(model, held), resume=resume,
                 after_step=writer if at else None)
    out = finish(ctx, model, p, method, result, source=source)
    out.update({"init": p.init, "train_tokens": len(stream), "tokens_per_step": tps,
                "tokens_seen": result.steps * tps, "data_fingerprint": shape["data"]["fingerprint"],
                "heldout_loss_before": before, "heldout_loss": mean_nll(ctx.model, held)})
    if writer.entries:
        out["series"] = str(folder / series.MANIFEST)
        out["series_checkpoints"] = len(writer.entries)
    if info is not None:
        out.update(cooldown_from=p.cooldown_from, branch_step=int(info["step"]), cooldown_steps=config.decay_steps)
    return out


def _offset(p: LMParams, info: dict[str, Any] | None) -> int:
    """The data offset: a cooldown branch keeps its checkpoint run's."""
    then = int(info["run"]["data"].get("offset", 0)) if info is not None else None
    if then is None or p.data_offset in (0, then):
        return then or p.data_offset
    raise UsageError(f"cooldown_from: data_offset is {p.data_offset} here and {then} in the checkpoint's run")


def _branch(ctx: RunContext, p: LMParams) -> str:
    """Load a cooldown's checkpoint: a model folder, or an adapter folder on its base (the adapter stays trainable,
    unmerged, so the restored optimiser state meets the same tensors). Returns the base model's name."""
    folder = Path(p.cooldown_from)
    if not adapters.is_adapter_folder(folder):
        if p.adapter == "lora":
            raise UsageError("cooldown_from: the checkpoint is a full model; a LoRA run branches from a LoRA checkpoint")
        ctx.set_model(*models.load(str(folder), dtype="float32", device=ctx.device))
        return str(folder)
    if p.adapter != "lora":
        raise UsageError("cooldown_from: the checkpoint is a LoRA adapter; set adapter: lora")
    return continue_adapter(ctx, folder, p)
