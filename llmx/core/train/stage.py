"""What every training stage does around the loop: fp32 master weights, gradient checkpointing, an optional LoRA
adapter, the loop with the run's metrics / checkpoints / resume, then saving (rank 0 only) and handing the trained
model on to the next stage."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from llmx.core.context import RunContext
from llmx.core.train import adapters, parallel
from llmx.core.train.distributed import is_main
from llmx.core.train.loop import OptimizerFactory, StepState, TrainConfig, TrainResult, adamw, train
from llmx.core.train.params import LoopParams, TrainParams
from llmx.errors import UsageError


def prepare(ctx: RunContext, model: torch.nn.Module, p: LoopParams) -> torch.nn.Module:
    """The model to train: gradient checkpointing when asked, the LoRA adapter when asked (a model that already
    carries one keeps it), and float32 master weights for the trained tensors (a half-precision model is upcast where
    it trains, with a warning: a LoRA adapter's frozen base stays as loaded; bf16-mixed autocasts the compute).
    Under fsdp the model comes sharded (``parallel.shard``): it never sits whole on the device."""
    if p.gradient_checkpointing:
        if not getattr(model, "supports_gradient_checkpointing", False):
            raise UsageError(f"{type(model).__name__} does not support gradient checkpointing")
        model._llmx_use_cache = model.config.use_cache
        model.config.use_cache = False
        checkpointing(model, True)
    if isinstance(p, TrainParams) and p.adapter == "lora" and not adapters.is_peft(model):
        model = adapters.wrap(model, p.lora)
        if p.gradient_checkpointing:
            model.enable_input_require_grads()
    low = [t for t in trainable(model).values() if t.dtype != torch.float32]
    if low:
        ctx.log.warning("training keeps float32 master weights: upcasting the %s trained tensors (precision: "
                        "bf16-mixed runs the compute in bfloat16)", ", ".join(sorted({str(t.dtype) for t in low})))
    if p.strategy == "fsdp":  # loaded in CPU memory (RunContext): sharded onto the device unit by unit, upcast there
        parallel.shard(model, ctx.device, p.precision, p.offload)
        return model
    for t in low:
        t.data = t.data.float()
    return model


def continue_adapter(ctx: RunContext, folder: Path, p: TrainParams) -> str:
    """Load a LoRA adapter folder on its base with the adapter trainable and unmerged (training goes on in the same
    tensors); returns the base model's name, which the trained adapter is saved against."""
    import json

    from llmx.core import models

    if not adapters.is_adapter_folder(folder):
        raise UsageError(f"{folder} is not a LoRA adapter folder (no {adapters.ADAPTER_CONFIG}) to continue")
    base = adapters.base_of(folder, models.read_metadata(folder).get("source"))
    saved = json.loads((folder / adapters.ADAPTER_CONFIG).read_text())
    if (saved.get("r"), saved.get("lora_alpha")) != (p.lora.r, p.lora.alpha):
        ctx.log.warning("continuing the adapter of %s (r %s, alpha %s); lora.* settings here are ignored", folder,
                        saved.get("r"), saved.get("lora_alpha"))
    ctx.set_model(*adapters.attach(folder, base, ctx.config.dtype, ctx.device, trainable=True))
    return base


def checkpointing(model: torch.nn.Module, on: bool) -> None:
    """Activation (gradient) checkpointing, non-reentrant, through transformers' current API or its older name."""
    if hasattr(model, "activation_checkpointing_enable"):
        if on:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.activation_checkpointing_disable()
    elif on:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_disable()


def release(model: torch.nn.Module, p: LoopParams) -> None:
    """Undo what ``prepare`` switched on for training only (gradient checkpointing, and the cache it turned off)."""
    if p.gradient_checkpointing:
        checkpointing(model, False)
        held = model.get_base_model() if adapters.is_peft(model) else model
        model.config.use_cache = held.__dict__.pop("_llmx_use_cache", True)


def trainable(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    return {n: t for n, t in model.named_parameters() if t.requires_grad}


def fit(ctx: RunContext, model: torch.nn.Module, loss: Callable[[int], Any], p: LoopParams,
        config: TrainConfig | None = None, evaluate: Callable[[], float] | None = None,
        params: dict[str, torch.nn.Parameter] | None = None, resume: str | None = None,
        after_step: Callable[[StepState], None] | None = None,
        weight: Callable[[int], float] | None = None,
        lr_scale: Callable[[str], float] | None = None, optimizer: OptimizerFactory = adamw,
        extras: dict[str, torch.nn.Module] | None = None,
        frozen: list[torch.nn.Module] | None = None, unused: bool = False) -> TrainResult:
    """The shared loop with this stage's metrics file, checkpoint folder and resume point, under the data-parallel
    engine of ``p.strategy`` (``core/train/parallel.py``): ``extras`` are modules trained beside the model (their
    tensors named ``<key>.<name>`` in ``params``), ``frozen`` models that only score (sharded with the policy under
    fsdp); ``unused``: a micro-batch may leave some trained tensors without a gradient. A ``p.resume`` checkpoint
    must come from a run of the same model and params (a cooldown branch, ``resume`` passed here, changes the
    schedule by design and is not checked)."""
    import dataclasses

    from llmx.core.train import parallel
    from llmx.core.train.distributed import from_main

    checked = p.resume is not None and resume in (None, p.resume)
    resume = resume or p.resume
    identity = {"model": model_identity(ctx.config.model), "params": _identity_params(p)}
    named = params if params is not None else trainable(model)
    engine = parallel.wrap(model, p.strategy, p.precision, p.offload, extras, frozen, unused)
    if engine.sharded:
        named = parallel.resolve(named, model, extras)
        if params is not None:  # the caller's dict too, else it keeps every unsharded original alive
            params.update(named)
    c = dataclasses.replace(config or p.loop_config(), seed=ctx.config.seed)
    try:
        return train(model, named, loss, c, evaluate=evaluate, progress=ctx.progress,
                     metrics_file=ctx.artifact("metrics.jsonl"),
                     checkpoint_dir=Path(from_main(str(ctx.artifact("checkpoints")))),  # every rank writes there
                     resume=Path(resume) if resume else None, after_step=after_step, weight=weight,
                     identity=identity, verify_resume=checked, lr_scale=lr_scale, optimizer=optimizer,
                     engine=engine)
    finally:
        engine.release()


RESUMABLE = ("resume", "steps", "stop_after", "save", "keep_checkpoints", "checkpoint_every", "eval_every",
             "eval_windows", "save_at_tokens", "gradient_checkpointing", "merge", "strategy",
             "offload")  # may change on resume: same maths


def _identity_params(p: LoopParams) -> dict[str, Any]:
    """The params a resumed run must share with its checkpoint: all but those a resume may change, with paths
    resolved (``./corpus.txt`` and ``corpus.txt`` are one file). ``grad_accum`` counts as the micro-batches of a
    step over all processes, so a resume at another world size with the same global batch is the same run."""
    from llmx.core.refs import absolute
    from llmx.core.train.distributed import world

    def norm(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: norm(x) for k, x in v.items() if k not in RESUMABLE}
        return absolute(v) if isinstance(v, str) else v

    return norm(p.model_dump(mode="json") | {"grad_accum": p.grad_accum * world()[1]})


def model_identity(name: str | None) -> str:
    """A model by what it is: a folder llmx saved by its manifest's digest (another model copied to the same path is
    another model), any other folder by its resolved path, a named source (tiny:, ref:, a hub id) by its name."""
    from llmx.core import manifest

    path = Path(str(name)).expanduser()
    if not path.is_dir():
        return str(name)
    for listing in (path / manifest.SAVED, path / manifest.MANIFEST):
        if listing.is_file():
            return f"{path.resolve()}@{manifest.sha256(listing)[:16]}"
    return str(path.resolve())


def save_trained(ctx: RunContext, model: torch.nn.Module, path: Path, p: TrainParams, method: str,
                 files: dict[str, bytes] | None = None, source: str | None = None, weights: Any = None) -> Path:
    """The model folder, or the adapter folder for a model with a LoRA adapter (its ``save_pretrained``);
    ``source`` (default: the run's model) is the base an adapter folder loads on."""
    from llmx.core import models

    meta = {"source": source or ctx.config.model, "method": method, "params": p.model_dump(mode="json")}
    base = Path(str(meta["source"]))
    if adapters.is_peft(model) and base.is_dir() and adapters.is_adapter_folder(base):
        ctx.log.warning("this adapter was trained on %s, a base merged with another adapter: llmx loads it "
                        "(--model); PEFT's base_model_name_or_path names only the first base", base)
    cache = getattr(model, "_llmx_use_cache", None)  # a save during training keeps the model's own cache setting
    if cache is not None:
        model.config.use_cache = cache
    try:
        return models.save(model, ctx.tokenizer, path, meta, files, weights=weights)
    finally:
        if cache is not None:
            model.config.use_cache = False


def finish(ctx: RunContext, model: torch.nn.Module, p: TrainParams, method: str, result: TrainResult,
           source: str | None = None) -> dict[str, Any]:
    """Save the trained model (the adapter folder, or the merged model with ``lora.merge``) and hand the merged
    model to the following stages; return the figures every training stage reports."""
    out: dict[str, Any] = {"steps": result.steps, "final_loss": result.last_loss,
                           "trainable_params": sum(t.numel() for t in trainable(model).values()),
                           "optimizer_bytes": result.optimizer_bytes, "train_seconds": round(result.seconds, 3)}
    if result.resumed_from:
        out["resumed_from"] = result.resumed_from
    release(model, p)
    if parallel.is_sharded(model):
        out.update(_finish_sharded(ctx, model, p, method, source))
        return out
    if p.adapter == "lora":
        if p.save and not p.lora.merge and is_main():
            out["adapter_dir"] = str(save_trained(ctx, model, ctx.artifact("adapter"), p, method, source=source))
        model = adapters.merge(model)
    if p.save and is_main() and (p.adapter == "none" or p.lora.merge):
        out["model_dir"] = str(save_trained(ctx, model, ctx.artifact("model"), p, method, source=source))
    ctx.set_model(model.eval())
    return out


def _finish_sharded(ctx: RunContext, model: torch.nn.Module, p: TrainParams, method: str,
                    source: str | None) -> dict[str, Any]:
    """``finish`` under fsdp: every rank takes part in the save (each tensor gathered in turn, rank 0 writes it into
    sharded safetensors: ``core/models/shards.py``), and the stages that follow get the saved model, loaded whole
    by every rank (as the training began: the shards stay with the training). With ``save: false`` the folder is
    a scratch one, removed once loaded."""
    import shutil

    from llmx.core import models
    from llmx.core.models import shards
    from llmx.core.train.distributed import barrier, from_main

    main, out = is_main(), {}
    kept = {"adapter": p.save and p.adapter == "lora" and not p.lora.merge,
            "model": p.save and (p.adapter == "none" or p.lora.merge)}
    folder = {k: ctx.artifact(k if kept[k] else f"handoff/{k}") for k in ("adapter", "model")}
    if p.adapter == "lora":  # the adapter's tensors only: small, gathered whole
        state = {k: parallel.full(v).detach().cpu() for k, v in model.state_dict().items() if "lora_" in k}
        if main:
            save_trained(ctx, model, folder["adapter"], p, method, source=source,
                         weights=lambda tmp: model.save_pretrained(tmp, state_dict=state))
            if p.lora.merge:
                merged, _ = adapters.load(folder["adapter"], source or ctx.config.model, ctx.config.dtype, "cpu")
                save_trained(ctx, merged, folder["model"], p, method, source=source)
        saved = folder["model"] if p.lora.merge else folder["adapter"]
    else:
        def weights(tmp: Path) -> None:
            model.config.save_pretrained(tmp)
            if getattr(model, "generation_config", None) is not None:
                model.generation_config.save_pretrained(tmp)
            shards.write(model.state_dict().items(), tmp, gather=parallel.full)

        if main:
            save_trained(ctx, model, folder["model"], p, method, source=source, weights=weights)
        else:
            shards.write(model.state_dict().items(), None, gather=parallel.full)
        saved = folder["model"]
    for k, keep in kept.items():
        if keep:
            out[f"{k}_dir"] = str(folder[k])
    saved = Path(from_main(str(saved)))  # rank 0's run folder
    ctx.set_model(models.load(str(saved), dtype=ctx.config.dtype, device=ctx.device)[0].eval())
    barrier()
    if main:
        shutil.rmtree(ctx.artifact("handoff"), ignore_errors=True)
    return out
