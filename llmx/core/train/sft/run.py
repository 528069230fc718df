"""The ``sft`` stage: encode and truncate every row once, pack when asked, train on the completion tokens with the
shared loop (a step's loss is the mean over all of its completion tokens, however it is split into micro-batches
and processes), and report the held-out completion loss before and after."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from llmx.core.context import RunContext
from llmx.core.data import holdout
from llmx.core.data.sampling import EpochOrder
from llmx.core.train import adapters
from llmx.core.train.loop import OptimizerFactory, adamw
from llmx.core.train.parallel import device_of
from llmx.core.train.sft import batch as B
from llmx.core.train.sft import data as D
from llmx.core.train.sft.encode import Encoded, encode
from llmx.core.train.sft.params import SFTParams
from llmx.core.train.stage import continue_adapter, finish, fit, prepare, trainable
from llmx.errors import UsageError

Optimise = Callable[[torch.nn.Module], tuple[dict[str, torch.nn.Parameter], OptimizerFactory]]
Objective = Callable[[torch.nn.Module, dict[str, torch.Tensor]], "torch.Tensor | tuple[torch.Tensor, dict]"]


@dataclass(frozen=True)
class Codec:
    """How the stage reads rows and batches them. ``encode`` returns an item with ``ids``, ``trained``,
    ``prompt_cut`` and ``completion_cut``, or None for a row it leaves out (counted); ``collate(items, pad, device)``
    gives model inputs whose ``labels`` are read shifted by one, as transformers' causal-LM loss reads them. A method
    whose rows carry their own masks and positions (Pasta-SFT) passes its own codec; packing needs the plain one."""

    load: Callable[[str], list]
    encode: Callable[[Any, Any, SFTParams], Any]
    collate: Callable[[list, int, Any], dict[str, Any]] = B.padded
    packs: bool = True


PLAIN = Codec(D.load, lambda tok, row, p: encode(tok, row, p.max_length, p.max_prompt_length, p.completion_only))


def heldout_loss(model, items: list[Encoded], pad_id: int, batch_size: int, collate=B.padded) -> float:
    """Mean NLL per trained token over the held-out rows (each row padded on its own batch, no packing)."""
    device = device_of(model)
    return B.labelled_nll(model, (collate(items[s:s + batch_size], pad_id, device)
                                  for s in range(0, len(items), batch_size)))


def dense(model: torch.nn.Module) -> tuple[dict[str, torch.nn.Parameter], OptimizerFactory]:
    """Every trainable tensor, with AdamW."""
    return trainable(model), adamw


def lm_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The SFT objective: the model's mean NLL over the labelled (completion) tokens."""
    return model(**batch).loss


def schedule(p: SFTParams, units: int) -> dict[str, int]:
    """The loop's steps and warmup: ``epochs`` passes over ``units`` sequences (rounded up to whole steps) and a
    ``warmup_ratio`` of them, where the params give them."""
    from math import ceil

    from llmx.core.train.distributed import world

    steps = ceil(p.epochs * units / (p.batch_size * p.grad_accum * world()[1])) if p.epochs else p.steps
    warmup = round(p.warmup_ratio * steps) if p.warmup_ratio is not None else p.warmup
    return {"steps": steps, "warmup": warmup, "decay_steps": round(p.decay_fraction * steps)}


def _continued(ctx: RunContext, p: SFTParams) -> str | None:
    """With ``lora.continue_adapter`` and an adapter folder as ``--model`` that no earlier stage has replaced: that
    adapter, trainable, as the run's model; returns its base (None: a new adapter is added as usual)."""
    folder = Path(str(ctx.config.model))
    if not (p.adapter == "lora" and p.lora.continue_adapter):
        return None
    if not (folder.is_dir() and adapters.is_adapter_folder(folder)):
        ctx.log.info("lora.continue_adapter: --model is not a LoRA adapter folder; adding a new adapter")
        return None
    if "model" in ctx.state:
        ctx.log.warning("lora.continue_adapter: an earlier stage replaced --model's adapter; adding a new one")
        return None
    return continue_adapter(ctx, folder, p)


MIN_HELDOUT = 10  # fewer automatically held-out rows than this: the held-out figures get a warning (as align's)


def run(ctx: RunContext, p: SFTParams, method: str = "sft", optimise: Optimise = dense,
        objective: Objective = lm_loss, codec: Codec = PLAIN, token_weighted: bool = True) -> dict[str, Any]:
    """The stage; ``optimise(model)`` picks the trained tensors and their optimiser (a sparse fine-tuning method
    passes its own), ``objective(model, batch)`` turns a micro-batch (ids, mask, labels) into its loss (a method
    with a regulariser passes its own), ``codec`` reads and batches the rows. ``token_weighted=False``: micro-batches
    weigh equally (HF's Trainer before transformers 4.46, as an official trainer that runs on it)."""
    if p.packing and not codec.packs:
        raise UsageError(f"{method} rows carry their own attention masks: set packing: false")
    source = _continued(ctx, p)
    rows = codec.load(p.data)
    train_rows, held_rows = (rows, codec.load(p.eval_data)) if p.eval_data else holdout(rows)
    if not p.eval_data and len(held_rows) < MIN_HELDOUT:
        ctx.log.warning("held-out split of %s: %d of %d rows (10%% of them, by hash), too few for the held-out figures "
                        "to mean much; pass eval_data for a held-out set of its own", p.data, len(held_rows), len(rows))
    tok = ctx.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    left_out = 0

    def enc(rs: list) -> list:
        nonlocal left_out
        out = [codec.encode(tok, r, p) for r in rs]
        left_out += sum(e is None for e in out)
        return [e for e in out if e is not None]

    items, held = enc(train_rows), enc(held_rows)
    if not items:
        raise UsageError(f"{p.data}: no row fits max_length {p.max_length}")
    if left_out:
        ctx.log.warning("left out %d rows longer than max_length %d", left_out, p.max_length)
    cut_prompt, cut_completion = sum(e.prompt_cut for e in items), sum(e.completion_cut for e in items)
    if cut_prompt or cut_completion:
        ctx.log.warning("truncated %d of %d prompts from the left (max_prompt_length %d) and %d completions from the "
                        "right (max_length %d)", cut_prompt, len(items), p.max_prompt_length, cut_completion,
                        p.max_length)
    model = prepare(ctx, ctx.model, p)
    device = device_of(model)
    if p.packing:
        B.check_packing(model, len(tok))
        shuffled = EpochOrder(len(items), ctx.config.seed).perm(0)
        units = B.pack([items[k] for k in shuffled], p.max_length)
    else:
        units = items
    order = EpochOrder(len(units), ctx.config.seed)
    targets = [sum(u.trained) for u in units]  # trained tokens per unit (a row's first token never is one)

    def loss(i: int) -> torch.Tensor:  # micro-batch i: a pure function of i (exact resume, disjoint DDP shards)
        chosen = [units[k] for k in order.batch(i, p.batch_size)]
        t = B.packed(chosen, pad, p.max_length, device) if p.packing else codec.collate(chosen, pad, device)
        return objective(model, t)

    before = heldout_loss(model, held, pad, p.batch_size, codec.collate) if held else None
    evaluate = (lambda: heldout_loss(model, held, pad, p.batch_size, codec.collate)) if held else None
    params, optimizer = optimise(model)
    plan = schedule(p, len(units))
    result = fit(ctx, model, loss, p, p.loop_config(eval_every=p.eval_every if held else None, **plan),
                 evaluate=evaluate,
                 weight=(lambda i: sum(targets[k] for k in order.batch(i, p.batch_size))) if token_weighted else None,
                 params=params, optimizer=optimizer)
    out: dict[str, Any] = {"train_rows": len(items), "eval_rows": len(held), "packing": p.packing,
                           "sequences": len(units), "prompts_truncated": cut_prompt,
                           "completions_truncated": cut_completion, "rows_left_out": left_out,
                           "trained_tokens_per_epoch": sum(sum(e.trained) for e in items), "warmup": plan["warmup"]}
    if p.epochs:
        out["epochs"] = p.epochs
    if held:
        out.update(heldout_loss_before=before, heldout_loss=heldout_loss(model, held, pad, p.batch_size, codec.collate))
    else:
        ctx.log.warning("no held-out rows (pass eval_data): held-out figures are not measured")
    out.update(finish(ctx, model, p, method, result, source=source))
    return out
