"""RePer's inference loop (Algorithm 1 of the README): the policy answers, the critic scores the answer and replies,
the policy answers again given the whole dialogue (image, question, every earlier answer and reply), up to
``max_trials`` answers. Scene captions are measured against ground truth at each turn: precision, recall and F1 of
the caption's tuples, the hallucination rate (digits it names, as objects or in relations, that are not in the
image: CHAIR_i; CHAIR_s the share of captions with one), the digits named per caption and the noise-free rubric
score. A dialogue whose prompt outgrows the context loses its earliest answers (each with its reply), as training
drops them, never the image or the question."""

from __future__ import annotations

from dataclasses import dataclass

from llmx.core.eval.stats import bootstrap_ci
from llmx.core.multimodal import languages as L
from llmx.core.multimodal.answer import f1, reply
from llmx.core.multimodal.model import IMAGE_TOKEN
from llmx.plugins.reper.critic import Critic, RuleCritic, named


@dataclass
class Turn:
    answer: str
    score: int  # the critic's
    feedback: str


def converse(model, proc, images: list, questions: list[str], critic: Critic, max_trials: int, max_new_tokens: int,
             batch_size: int = 16, progress=lambda x, **_: x) -> tuple[list[list[Turn]], int]:
    """Each image's turns (its question holds ``<image>``), every dialogue advanced one answer per batched
    generation; and the number of earlier answers dropped to fit the context."""
    dialogues = [[{"role": "user", "content": q}] for q in questions]
    out: list[list[Turn]] = [[] for _ in images]
    dropped = 0
    for _ in range(max_trials):
        asked = [fit(model, proc, d, max_new_tokens) for d in dialogues]
        dropped += sum((len(d) - len(a)) // 2 for d, a in zip(dialogues, asked, strict=True))
        answers = reply(model, proc, asked, images, max_new_tokens, batch_size=batch_size, progress=progress)
        for i, answer in enumerate(answers):
            score, text = critic.score(images[i], questions[i].replace(IMAGE_TOKEN, "").strip(), answer)
            out[i].append(Turn(answer, score, text))
            dialogues[i] += [{"role": "assistant", "content": answer}, {"role": "user", "content": text}]
    return out, dropped


def fit(model, proc, messages: list[dict], max_new_tokens: int) -> list[dict]:
    """``messages`` less their earliest (answer, reply) pairs until the prompt and ``max_new_tokens`` fit the
    model's context."""
    from llmx.core.eval.generate import context_limit
    from llmx.core.multimodal.model import image_tokens, text_tokenizer

    limit = context_limit(model)
    if limit is None:
        return messages
    tok, n = text_tokenizer(proc), image_tokens(model)

    def length(m: list[dict]) -> int:
        shown = [{**x, "content": x["content"].replace(IMAGE_TOKEN, IMAGE_TOKEN * n)} for x in m]
        text = tok.apply_chat_template(shown, tokenize=False, add_generation_prompt=True)
        return len(tok(text, add_special_tokens=False)["input_ids"])  # as the generator encodes it

    while len(messages) > 1 and length(messages) + max_new_tokens > limit:
        messages = messages[:1] + messages[3:]
    return messages


def final(turns: list[Turn], select: str) -> Turn:
    """The answer a dialogue ends with: the last (the paper) or the critic's best (the first of equal scores)."""
    return turns[-1] if select == "last" else max(turns, key=lambda t: t.score)


def caption_metrics(scene, answer: str) -> dict[str, float]:
    said, truth = L.parse_caption("en", answer), scene.truth()
    hit = len(set(said) & set(truth))
    mentioned = named(said)
    present = {t[1] for t in truth if t[0] == "object"}
    precision = hit / len(said) if said else 0.0
    recall = hit / len(truth)
    return {"precision": precision, "recall": recall,
            "f1": f1(said, truth),
            "mentioned": len(mentioned), "hallucinated": sum(d not in present for d in mentioned),
            "rubric": RuleCritic().judge(scene, answer)[0]}


def summary(scenes: list, answers: list[str], critic_scores: list[int], seed: int = 0) -> dict[str, float]:
    """Means over the captions, F1 with a 95% bootstrap interval."""
    rows = [caption_metrics(s, a) for s, a in zip(scenes, answers, strict=True)]
    n = len(rows)
    f1s = [r["f1"] for r in rows]
    low, high = bootstrap_ci(f1s, 1000, seed=seed)
    mentioned = sum(r["mentioned"] for r in rows)
    return {"precision": sum(r["precision"] for r in rows) / n, "recall": sum(r["recall"] for r in rows) / n,
            "f1": sum(f1s) / n, "f1_low": low, "f1_high": high,
            "hallucination": sum(r["hallucinated"] for r in rows) / mentioned if mentioned else 0.0,
            "chair_s": sum(r["hallucinated"] > 0 for r in rows) / n, "mentioned": mentioned / n,
            "rubric": sum(r["rubric"] for r in rows) / n, "critic_score": sum(critic_scores) / n}
