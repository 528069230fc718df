"""``llmx eval --method mmmb``: MMMB-format multiple choice (``mmmb``) per language and category, answered by
generation in Parrot's prompt (the letter read from the reply) or by likelihood (``likelihood``: each option's text
scored).

Writes ``answers.jsonl`` (one row per TSV row: the prompt, the reply or each option's log-likelihood, the option
picked, its score) and ``questions.jsonl`` (one row per question after CircularEval, its ``accuracy``: the items
``llmx compare parrot`` pairs; their mean is the stage's ``accuracy``; ``item``: the digest of the question's index,
language, text, hint, options, answer and image bytes, those of its unrotated row). With Parrot's MoE on, how well
the gates tell the questions' languages apart (``routing.by_question``) goes into the metrics and ``routing.json``."""

from __future__ import annotations

import json
from typing import Any

from llmx.core import atomic
from llmx.core.context import RunContext
from llmx.core.eval.items import FIELD, item_id
from llmx.core.multimodal.model import vision_language
from llmx.errors import UsageError
from llmx.plugins.parrot.config import MmmbParams


def question_id(q) -> str:
    """The ``item`` of an MMMB question (``mmmb.Item``): what is asked, about which image, never its file or line."""
    import hashlib

    return item_id(q.index, q.language, q.question, q.hint, q.options, q.answer, hashlib.sha1(q.image).hexdigest())


def answer(ctx: RunContext, p: MmmbParams, model, proc, items: list) -> tuple[list[str], list[dict], list[int | None]]:
    """Each row's prompt (the user turn after its image), what the model said (its reply, or each option's
    log-likelihood) and the option it picked (None: none could be read)."""
    if p.scoring in ("likelihood", "likelihood_norm"):
        from llmx.plugins.parrot import likelihood

        scores = likelihood.loglikelihoods(model, proc, items, p.batch_size, ctx.progress)
        if p.scoring == "likelihood_norm":
            normed = [likelihood.per_byte(v, it.options) for v, it in zip(scores, items, strict=True)]
            said = [{"loglikelihoods": v, "per_byte": n} for v, n in zip(scores, normed, strict=True)]
            return [it.asked() for it in items], said, [likelihood.pick(n) for n in normed]
        return [it.asked() for it in items], [{"loglikelihoods": v} for v in scores], [likelihood.pick(v) for v in scores]
    from llmx.core.multimodal.answer import reply
    from llmx.core.multimodal.model import IMAGE_TOKEN
    from llmx.plugins.parrot import mmmb

    prompts = [it.prompt() for it in items]
    replies = reply(model, proc, [[{"role": "user", "content": f"{IMAGE_TOKEN}\n{q}"}] for q in prompts], items,
                    p.max_new_tokens, batch_size=p.batch_size, progress=ctx.progress)
    return prompts, [{"reply": r} for r in replies], mmmb.score(items, replies)[0]


def evaluate(ctx: RunContext, p: MmmbParams) -> dict[str, Any]:
    from llmx.core.multimodal.answer import non_english_mean, per_language
    from llmx.plugins.parrot import mmmb

    model, proc = vision_language(ctx.model, ctx.tokenizer, ctx.config.model)
    data = p.data or mmmb.write(ctx.artifact("mmmb"), p.count, p.seed, p.languages)[0].parent
    items = mmmb.read(data, p.languages)
    if not items:
        raise UsageError(f"{data}: no questions in {', '.join(p.languages)}")
    circular = p.circular if p.circular is not None else mmmb.circular(data, items)
    prompts, said, picks = answer(ctx, p, model, proc, items)
    scores = [float(k == it.answer) for k, it in zip(picks, items, strict=True)]
    atomic.write_text(ctx.artifact("answers.jsonl"), "".join(
        json.dumps({"where": it.where, "language": it.language, "category": it.category, "prompt": q, **m,
                    "picked": k, "answer": it.answer, "score": s}, ensure_ascii=False) + "\n"
        for it, q, m, k, s in zip(items, prompts, said, picks, scores, strict=True)))
    questions, graded = mmmb.grouped(items, scores, circular)
    atomic.write_jsonl(ctx.artifact("questions.jsonl"), [
        {FIELD: question_id(q), "where": q.where, "index": q.index, "language": q.language, "category": q.category,
         "accuracy": g} for q, g in zip(questions, graded, strict=True)])  # what llmx compare pairs
    table = per_language([q.language for q in questions], graded, ctx.config.seed)
    out: dict[str, Any] = {"questions": len(graded), "rows": len(items), "circular": circular, "scoring": p.scoring,
                           "accuracy": sum(graded) / len(graded), "row_accuracy": sum(scores) / len(scores),
                           "unanswered": sum(k is None for k in picks) / len(picks)}
    for lang, row in table.items():
        out.update({f"accuracy_{lang}": row["accuracy"], f"ci_low_{lang}": row["ci_low"],
                    f"ci_high_{lang}": row["ci_high"]})
    if (mean := non_english_mean(table)) is not None:
        out["accuracy_non_english"] = mean
    cats: dict[str, dict[str, list[float]]] = {}
    for it, s in zip(questions, graded, strict=True):
        cats.setdefault(it.language, {}).setdefault(it.category, []).append(s)
    per_category = {lang: {c: sum(v) / len(v) for c, v in sorted(d.items())} for lang, d in cats.items()}
    atomic.write_text(ctx.artifact("per_category.json"), json.dumps(per_category, indent=2, ensure_ascii=False) + "\n")
    out["categories"] = len({q.category for q in questions})
    out.update(routing(ctx, model, proc, items, prompts, mmmb.questions(items, circular)))
    return out


def routing(ctx: RunContext, model, proc, items: list, prompts: list[str], questions: list[list[int]]) -> dict[str, Any]:
    """The routing metrics of a model with Parrot's MoE on (none otherwise, or where the languages and questions are
    too few to decode), the full report written to ``routing.json``."""
    from llmx.core.multimodal.model import IMAGE_TOKEN
    from llmx.plugins.parrot import routing as R
    from llmx.plugins.parrot.mmmb import Picture
    from llmx.plugins.parrot.moe import MultilingualMoE

    moe = getattr(model, "visual_adapter", None)
    if not isinstance(moe, MultilingualMoE) or not moe.use_moe:
        return {}
    report = R.by_question(model, proc, [f"{IMAGE_TOKEN}\n{q}" for q in prompts], [Picture(it) for it in items],
                           [it.language for it in items], questions)
    if report is None:
        ctx.log.info("routing not reported: it needs two languages with two questions each")
        return {}
    atomic.write_text(ctx.artifact("routing.json"), json.dumps(report, indent=2) + "\n")
    return R.metrics(report)
