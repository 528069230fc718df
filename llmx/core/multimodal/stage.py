"""A LLaVA training stage on the shared loop, for any method that trains a LLaVA model on image conversations
(``llava``, ``parrot``): rows from a LLaVA-format file or a generated scene set, every row encoded and every image
decoded before the first step (a bad row fails the run before anything trains or is written), stage 1's or stage 2's
trainable set, the stage's rates, held-out loss before and after, then saving and handing the model on."""

from __future__ import annotations

from typing import Any

from llmx.core.context import RunContext
from llmx.core.multimodal.model import vision_language
from llmx.core.multimodal.params import LlavaTrainParams


def rows(p: LlavaTrainParams) -> tuple[list, list]:
    """(train, held-out) conversations: ``data`` split by row hash, or the scene set's train and test scenes."""
    from llmx.core.data import holdout
    from llmx.core.multimodal import conversations

    if p.data:
        data = conversations.load(p.data, p.image_folder)
        train_rows, held = holdout(data, key=lambda c: repr(c.messages) + (c.image.name if c.image else ""))
        return train_rows, held[:p.eval_rows]
    return p.scenes.conversations("train"), p.scenes.model_copy(update={"count": p.eval_rows}).conversations("test")


def run(ctx: RunContext, p: LlavaTrainParams, method: str) -> dict[str, Any]:
    """Train ``ctx.model`` as ``p`` says and return the stage's figures; the trained model is saved as ``method``."""
    from llmx.core.multimodal import train as T
    from llmx.core.multimodal.batch import examples
    from llmx.core.multimodal.model import image_tokens
    from llmx.core.train.stage import finish, fit, prepare

    model, proc = vision_language(ctx.model, ctx.tokenizer, ctx.config.model)
    train_rows, held_rows = rows(p)
    n = image_tokens(model)
    items = examples(proc, train_rows, n, p.max_length)
    held = examples(proc, held_rows, n, p.max_length) if held_rows else []
    if cut := sum(e.row.completion_cut for e in items):
        ctx.log.warning("%d of %d responses cut at max_length %d (they lose their EOS)", cut, len(items), p.max_length)
    pad = proc.tokenizer.pad_token_id if proc.tokenizer.pad_token_id is not None else proc.tokenizer.eos_token_id
    params = T.trainable(model, p.stage)  # frozen first, so prepare() upcasts only what trains
    model = prepare(ctx, model, p)
    T.cast_projector_input(model)
    before = T.heldout_loss(model, held, pad, p.batch_size) if held else None
    result = fit(ctx, model, T.loss_fn(model, items, p.batch_size, ctx.config.seed, pad), p,
                 p.llava_loop(), params=params,
                 weight=T.weights(items, p.batch_size, ctx.config.seed), lr_scale=T.lr_scale(p.rate, p.mm_projector_lr),
                 unused=True)  # a text-only micro-batch leaves the projector without a gradient
    out: dict[str, Any] = {"stage": p.stage, "lr": p.rate, "mm_projector_lr": p.mm_projector_lr or p.rate,
                           "train_rows": len(items), "eval_rows": len(held), "image_tokens": n,
                           "responses_cut": cut,
                           "trained_tokens_per_epoch": sum(sum(e.row.trained) for e in items)}
    if held:
        out.update(heldout_loss_before=before, heldout_loss=T.heldout_loss(model, held, pad, p.batch_size))
    for q in model.parameters():  # the next stage of a pipeline gets the model as loaded, every tensor trainable
        q.requires_grad_(True)
    out.update(finish(ctx, model, p, method, result))
    out["trainable_params"] = sum(t.numel() for t in params.values())
    return out
