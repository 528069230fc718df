"""``llmx train --method llava`` and ``llmx eval --method scenes-vqa``.

Training follows LLaVA-1.5's recipe on the shared loop: the conversation rendered by the model's chat template
(``USER: <image>\\n... ASSISTANT: ...</s>``), labels on the assistant turns only, the vision tower frozen; stage 1
trains ``multi_modal_projector`` alone, stage 2 also the language model (and its head), with an optional separate
projector rate. Rows are encoded and every image file decoded once before the first step, so a bad row fails the
run before anything trains or is written; pixels are computed per micro-batch."""

from __future__ import annotations

import json
from typing import Any

from llmx.core import atomic
from llmx.core.context import RunContext
from llmx.core.multimodal.model import vision_language
from llmx.plugins.llava.config import LlavaTrainParams, ScenesVQAParams


def _rows(ctx: RunContext, p: LlavaTrainParams):
    from llmx.core.data import holdout
    from llmx.core.multimodal import conversations

    if p.data:
        rows = conversations.load(p.data, p.image_folder)
        train_rows, held = holdout(rows, key=lambda c: repr(c.messages) + (c.image.name if c.image else ""))
        return train_rows, held[:p.eval_rows]
    return p.scenes.conversations("train"), p.scenes.model_copy(update={"count": p.eval_rows}).conversations("test")


def train(ctx: RunContext, p: LlavaTrainParams) -> dict[str, Any]:
    from llmx.core.multimodal import train as T
    from llmx.core.multimodal.batch import examples
    from llmx.core.multimodal.model import image_tokens
    from llmx.core.train.stage import finish, fit, prepare

    model, proc = vision_language(ctx.model, ctx.tokenizer, ctx.config.model)
    train_rows, held_rows = _rows(ctx, p)
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
                 weight=T.weights(items, p.batch_size, ctx.config.seed), lr_scale=T.lr_scale(p.rate, p.mm_projector_lr))
    out: dict[str, Any] = {"stage": p.stage, "lr": p.rate, "mm_projector_lr": p.mm_projector_lr or p.rate,
                           "train_rows": len(items), "eval_rows": len(held), "image_tokens": n,
                           "responses_cut": cut,
                           "trained_tokens_per_epoch": sum(sum(e.row.trained) for e in items)}
    if held:
        out.update(heldout_loss_before=before, heldout_loss=T.heldout_loss(model, held, pad, p.batch_size))
    for q in model.parameters():  # the next stage of a pipeline gets the model as loaded, every tensor trainable
        q.requires_grad_(True)
    out.update(finish(ctx, model, p, "llava", result))
    out["trainable_params"] = sum(t.numel() for t in params.values())
    return out


def evaluate(ctx: RunContext, p: ScenesVQAParams) -> dict[str, Any]:
    from llmx.core.multimodal.answer import generate, judge, non_english_mean, per_language
    from llmx.core.multimodal.model import image_tokens
    from llmx.core.multimodal.qa import conversations

    model, proc = vision_language(ctx.model, ctx.tokenizer, ctx.config.model)
    convs = [c for lang in p.languages for c in conversations(p.count, "test", p.seed + 1000, {lang: 1.0},
                                                               {p.format: 1.0})]  # one scene list, asked in each
    budget = p.max_new_tokens or {"choice": 4, "open": 8, "caption": 160}[p.format]
    replies = generate(model, proc, convs, image_tokens(model), budget, p.batch_size, progress=ctx.progress)
    scores = [judge(c, r) for c, r in zip(convs, replies, strict=True)]
    atomic.write_text(ctx.artifact("answers.jsonl"), "".join(
        json.dumps({"language": c.meta["language"], "kind": c.meta["kind"], "question": c.messages[0]["content"],
                    "expected": c.messages[1]["content"], "reply": r, "score": s}, ensure_ascii=False) + "\n"
        for c, r, s in zip(convs, replies, scores, strict=True)))
    out: dict[str, Any] = {"format": p.format, "questions": len(convs), "accuracy": sum(scores) / len(scores)}
    table = per_language(convs, scores, ctx.config.seed)
    for lang, row in table.items():
        out.update({f"accuracy_{lang}": row["accuracy"], f"ci_low_{lang}": row["ci_low"],
                    f"ci_high_{lang}": row["ci_high"]})
    if (mean := non_english_mean(table)) is not None:
        out["accuracy_non_english"] = mean
    return out
