"""RePer's three stages: build the reflection dialogues (analyze), train on them (align: RPL or a baseline), and
answer with the policy/critic loop (decode)."""

from __future__ import annotations

import json
from typing import Any

from llmx.core import atomic
from llmx.core.context import RunContext
from llmx.core.eval.items import FIELD, item_id
from llmx.errors import UsageError
from llmx.plugins.reper.config import BuildParams, CriticParams, RPLParams, TurnsParams

STATE = "reper_dialogues"  # the dialogues file an analyze stage wrote, for a later align stage of the run


def _policy(ctx: RunContext):
    from llmx.core.multimodal.model import vision_language

    return vision_language(ctx.model, ctx.tokenizer, ctx.config.model)


def _critic(ctx: RunContext, p: CriticParams):
    from llmx.plugins.reper.critic import ModelCritic, RuleCritic

    if p.critic == "rule":
        return RuleCritic(p.feedback, p.noise, ctx.config.seed)
    from llmx.core import models
    from llmx.core.multimodal.model import vision_language

    model, proc = vision_language(*models.load(p.critic_model, ctx.config.dtype, ctx.device), p.critic_model)
    return ModelCritic(model, proc, rationale=p.feedback == "rationale")


def build(ctx: RunContext, p: BuildParams) -> dict[str, Any]:
    """The dialogues, or those an identical build kept (``stagecache``: same model, earlier stages, params, seed,
    device, code); ``build_key`` names the build, the same in every run that shares it."""
    from llmx.core import stagecache

    out = ctx.artifact("dataset")
    digest = stagecache.key(ctx, p)  # a build takes the rule critic only (BuildParams): no other model to key on
    if stagecache.provide("reper-build", digest, out, lambda dest: _build(ctx, p, dest)):
        ctx.log.info("reper-build: the dialogues of an identical build (%s), not sampled again", digest)
    ctx.state[STATE] = str(out / "dialogues.jsonl")
    return {"data": ctx.state[STATE], **json.loads((out / "stats.json").read_text()), "build_key": digest}


def _build(ctx: RunContext, p: BuildParams, out) -> None:
    from llmx.core.multimodal.scenes import scenes
    from llmx.plugins.reper import build as B

    model, proc = _policy(ctx)
    model.eval()
    sc = scenes(p.scenes, "train", p.scene_seed, p.objects)
    captions = B.candidates(model, proc, sc, p.temperatures, p.candidates, p.max_new_tokens, p.batch_size,
                            ctx.config.seed, ctx.progress)
    rows, stats = B.dialogues(sc, captions, _critic(ctx, p), p.score_gap, p.min_score, p.max_turns, p.turn_weights,
                              ctx.config.seed)
    if not rows:
        raise UsageError(f"no scene passed the filter (best >= min_score {p.min_score}, best - worst >= score_gap "
                         f"{p.score_gap}); score histogram {stats['score_histogram']}")
    with atomic.folder(out) as tmp:
        (tmp / "images").mkdir()
        lines = []
        for k, d in enumerate(rows):
            d.image.image().save(tmp / B.image_name(k))
            lines.append(json.dumps(d.row(B.image_name(k)), ensure_ascii=False) + "\n")
        (tmp / "dialogues.jsonl").write_text("".join(lines))
        (tmp / "candidates.jsonl").write_text("".join(json.dumps({"scene": i, "captions": caps}) + "\n"
                                                      for i, caps in enumerate(captions)))
        (tmp / "stats.json").write_text(json.dumps(stats))


def align(ctx: RunContext, p: RPLParams) -> dict[str, Any]:
    from llmx.core.multimodal import train as T
    from llmx.core.multimodal.model import image_tokens
    from llmx.core.train.stage import finish, fit, prepare
    from llmx.plugins.reper import train as R
    from llmx.plugins.reper.dialogues import load
    from llmx.plugins.reper.pack import pack

    path = p.data or ctx.state.get(STATE)
    if path is None:
        raise UsageError("no dialogues: pass data (a dialogues .jsonl), or run analyze --method reper first")
    dialogues = load(path, p.image_folder if p.data else None)
    model, proc = _policy(ctx)
    n = image_tokens(model)
    packs = [pack(proc, d, n, p.max_length, p.sigma) for d in dialogues]
    dropped = sum(len(d.answers) - len(pk.kept) for d, pk in zip(dialogues, packs, strict=True))
    if dropped:
        ctx.log.warning("%d earliest answers dropped so dialogues fit max_length %d", dropped, p.max_length)
    if cut := sum(pk.example.row.completion_cut for pk in packs):
        ctx.log.warning("%d last answers cut at max_length %d (they lose their EOS)", cut, p.max_length)
    tok = proc.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    params = T.trainable(model, 2)
    model = prepare(ctx, model, p)
    T.cast_projector_input(model)
    probe = [pk for pk in packs if len(pk.spans) > 1][:p.probe]
    before = R.turn_logps(model, probe, pad)
    loss, weight, trained_rows = R.objective(model, proc, dialogues, packs, p, ctx.config.seed, pad, n)
    result = fit(ctx, model, loss, p, p.loop_config(), params=params, weight=weight)
    after = R.turn_logps(model, probe, pad)
    out: dict[str, Any] = {"objective": p.objective, "dialogues": len(dialogues), "trained_rows": trained_rows,
                           "answers": sum(len(d.answers) for d in dialogues), "answers_dropped": dropped,
                           "answers_cut": cut}
    for k in before:
        out.update({f"logp_{k}_before": before[k], f"logp_{k}_after": after[k]})
    for q in model.parameters():  # the next stage gets the model as loaded, every tensor trainable
        q.requires_grad_(True)
    out.update(finish(ctx, model, p, "reper", result))
    out["trainable_params"] = sum(t.numel() for t in params.values())
    return out


def decode(ctx: RunContext, p: TurnsParams) -> dict[str, Any]:
    from llmx.core.multimodal.scenes import scenes
    from llmx.plugins.reper.build import QUESTION
    from llmx.plugins.reper.turns import converse, final, summary

    model, proc = _policy(ctx)
    model.eval()
    if p.data:
        from llmx.core.multimodal.conversations import load

        convs = load(p.data, p.image_folder)
        images, questions = convs, [c.messages[0]["content"] for c in convs]  # read per batch
    else:
        images = scenes(p.scenes, "test", p.scene_seed, p.objects)
        questions = [QUESTION] * len(images)
    critic = _critic(ctx, p)
    dialogues, dropped = converse(model, proc, images, questions, critic, p.max_trials, p.max_new_tokens,
                                  p.batch_size, ctx.progress)
    if dropped:
        ctx.log.warning("%d earlier answers left out of prompts that outgrew the context", dropped)
    atomic.write_jsonl(ctx.artifact("dialogues.jsonl"), [
        {"question": q, "turns": [{"answer": t.answer, "score": t.score, "feedback": t.feedback} for t in d]}
        for q, d in zip(questions, dialogues, strict=True)])
    out: dict[str, Any] = {"images": len(images), "max_trials": p.max_trials, "critic": p.critic, "noise": p.noise,
                           "answers_dropped": dropped}
    for t in range(p.max_trials):
        answers, scores = [d[t].answer for d in dialogues], [d[t].score for d in dialogues]
        if p.data:
            out[f"turn{t + 1}_critic_score"] = sum(scores) / len(scores)
        else:
            out.update({f"turn{t + 1}_{k}": v for k, v in summary(images, answers, scores, ctx.config.seed).items()})
    ends = [final(d, p.select) for d in dialogues]
    if not p.data:
        out.update({f"final_{k}": v for k, v in summary(images, [e.answer for e in ends], [e.score for e in ends],
                                                         ctx.config.seed).items()})
        atomic.write_jsonl(ctx.artifact("items.jsonl"), items(images, dialogues, ends))
    return out


def items(images: list, dialogues: list, ends: list) -> list[dict[str, Any]]:
    """One row per scene: its caption's figures at each turn and at the end (``final_f1`` and the rest average to
    the stage's ``final_*`` figures), the items a comparison pairs; ``item``: the digest of the scene's place and
    content (its objects)."""
    from llmx.plugins.reper.turns import caption_metrics

    rows = []
    for i, (scene, turns, end) in enumerate(zip(images, dialogues, ends, strict=True)):
        row: dict[str, Any] = {FIELD: item_id(i, repr(scene)), "scene": i}
        for t, turn in enumerate(turns, 1):
            row.update({f"turn{t}_{k}": v for k, v in caption_metrics(scene, turn.answer).items()})
        row.update({f"final_{k}": v for k, v in caption_metrics(scene, end.answer).items()})
        row["final_critic_score"] = end.score
        rows.append(row)
    return rows
