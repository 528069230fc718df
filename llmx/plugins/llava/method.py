"""``llmx train --method llava`` and ``llmx eval --method scenes-vqa``.

Training follows LLaVA-1.5's recipe on the shared loop: the conversation rendered by the model's chat template
(``USER: <image>\\n... ASSISTANT: ...</s>``), labels on the assistant turns only, the vision tower frozen; stage 1
trains ``multi_modal_projector`` alone, stage 2 also the language model (and its head), with an optional separate
projector rate. Rows are encoded and every image file decoded once before the first step, so a bad row fails the
run before anything trains or is written; pixels are computed per micro-batch.

``scenes-vqa`` writes ``answers.jsonl``, one row per question with its ``score`` (1/0, or the caption's F1), also
as ``accuracy``: the items ``llmx compare llava`` pairs, whose mean is the stage's ``accuracy``; ``item``: the digest
of the scene (its name and objects), the language, the question and the expected answer."""

from __future__ import annotations

import json
from typing import Any

from llmx.core import atomic
from llmx.core.context import RunContext
from llmx.core.eval.items import FIELD, item_id
from llmx.core.multimodal.model import vision_language
from llmx.core.multimodal.params import LlavaTrainParams
from llmx.errors import UsageError
from llmx.plugins.llava.config import ScenesVQAParams


def train(ctx: RunContext, p: LlavaTrainParams) -> dict[str, Any]:
    """The trained model, or with ``keep`` the weights an identical stage kept (``stagecache``)."""
    from llmx.core.multimodal.stage import run

    if not p.keep:
        return run(ctx, p, "llava")
    from safetensors.torch import load_file, save_file

    from llmx.core import stagecache

    digest = stagecache.key(ctx, p)

    def trained(dest) -> None:
        figures = run(ctx, p, "llava")
        tensors, tied, first = {}, {}, {}
        for name, t in ctx.model.state_dict().items():  # tied weights: stored once, the other names point to it
            if (ptr := t.data_ptr()) in first:
                tied[name] = first[ptr]
            else:
                first[ptr], tensors[name] = name, t.detach().contiguous()
        with atomic.folder(dest) as tmp:
            save_file(tensors, str(tmp / "weights.safetensors"))
            (tmp / "figures.json").write_text(json.dumps({"figures": figures, "tied": tied}))

    out = ctx.artifact("kept")
    hit = stagecache.provide("llava-train", digest, out, trained)
    record = json.loads((out / "figures.json").read_text())
    if hit:
        ctx.log.info("llava: the weights an identical stage kept (%s), not trained again", digest)
        model, kept = ctx.model, load_file(str(out / "weights.safetensors"), device=str(ctx.device))
        held = model.state_dict(keep_vars=True)
        if held.keys() != kept.keys() | record["tied"].keys():
            raise UsageError(f"{out}: the kept weights are not this model's; remove the entry or set keep: false")
        for name, t in held.items():  # as trained: dtypes too (a half-precision model trains float32 masters)
            t.data = kept[record["tied"].get(name, name)]
        from llmx.core.multimodal.train import cast_projector_input

        cast_projector_input(vision_language(model, ctx.tokenizer, ctx.config.model)[0])  # as training leaves it
        ctx.set_model(model.eval())
    return {**record["figures"], "kept_key": digest, "kept": hit}


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
        json.dumps({FIELD: item_id(c.where, repr(c.image), c.meta["language"], c.messages[0]["content"],
                                   c.messages[1]["content"]),
                    "language": c.meta["language"], "kind": c.meta["kind"], "question": c.messages[0]["content"],
                    "expected": c.messages[1]["content"], "reply": r, "score": s, "accuracy": s},
                   ensure_ascii=False) + "\n"
        for c, r, s in zip(convs, replies, scores, strict=True)))
    out: dict[str, Any] = {"format": p.format, "questions": len(convs), "accuracy": sum(scores) / len(scores)}
    table = per_language([c.meta["language"] for c in convs], scores, ctx.config.seed)
    for lang, row in table.items():
        out.update({f"accuracy_{lang}": row["accuracy"], f"ci_low_{lang}": row["ci_low"],
                    f"ci_high_{lang}": row["ci_high"]})
    if (mean := non_english_mean(table)) is not None:
        out["accuracy_non_english"] = mean
    return out
