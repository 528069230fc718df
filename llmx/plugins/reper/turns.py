"""RePer's inference loop (Algorithm 1 of the README): the policy answers, the critic scores the answer and replies,
the policy answers again given the whole dialogue (image, question, every earlier answer and reply), up to
``max_trials`` answers. Scene captions are measured against ground truth at each turn: precision, recall and F1 of
the caption's tuples, the hallucination rate (mentioned objects not in the image, CHAIR_i; CHAIR_s the share of
captions with one) and the noise-free rubric score."""

from __future__ import annotations

from dataclasses import dataclass

from llmx.core.eval.stats import bootstrap_ci
from llmx.core.multimodal import languages as L
from llmx.core.multimodal.answer import f1, reply
from llmx.core.multimodal.model import IMAGE_TOKEN
from llmx.plugins.reper.critic import Critic, RuleCritic


@dataclass
class Turn:
    answer: str
    score: int  # the critic's
    feedback: str


def converse(model, proc, images: list, questions: list[str], critic: Critic, max_trials: int, max_new_tokens: int,
             batch_size: int = 16, progress=lambda x, **_: x) -> list[list[Turn]]:
    """Each image's turns (its question holds ``<image>``), every dialogue advanced one answer per batched
    generation."""
    dialogues = [[{"role": "user", "content": q}] for q in questions]
    out: list[list[Turn]] = [[] for _ in images]
    for _ in range(max_trials):
        answers = reply(model, proc, dialogues, images, max_new_tokens, batch_size=batch_size, progress=progress)
        for i, answer in enumerate(answers):
            score, text = critic.score(images[i], questions[i].replace(IMAGE_TOKEN, "").strip(), answer)
            out[i].append(Turn(answer, score, text))
            dialogues[i] += [{"role": "assistant", "content": answer}, {"role": "user", "content": text}]
    return out


def final(turns: list[Turn], select: str) -> Turn:
    """The answer a dialogue ends with: the last (the paper) or the critic's best (the first of equal scores)."""
    return turns[-1] if select == "last" else max(turns, key=lambda t: t.score)


def caption_metrics(scene, answer: str) -> dict[str, float]:
    said, truth = L.parse_caption("en", answer), scene.truth()
    hit = len(set(said) & set(truth))
    mentioned = [t[1] for t in said if t[0] == "object"]
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
            "chair_s": sum(r["hallucinated"] > 0 for r in rows) / n,
            "rubric": sum(r["rubric"] for r in rows) / n, "critic_score": sum(critic_scores) / n}
