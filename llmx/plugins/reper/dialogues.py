"""Reflection dialogues: the Visual Reflection Dataset's rows (§2.3 of the notes) as LLaVA-format conversations,

    {"image": "images/00012.png", "conversations": [
       {"from": "human", "value": "<image>\\nDescribe the image."},
       {"from": "gpt", "value": "...", "turn": 1, "score": 3},
       {"from": "human", "value": "This caption can only get the score 3. ... Could you generate a better one?"},
       {"from": "gpt", "value": "...", "turn": 2, "score": 9}]}

one image, then human and gpt turns alternating, the responses ordered worst to best; ``turn`` (1..T in order),
``score`` (1-10) and ``sigma`` (in [0, 1]) on a response are optional. ``assemble`` builds one from scored
candidates: kept when the best reaches ``min_score`` and beats the worst by ``score_gap``, then 1 to ``max_turns``
responses of strictly rising score, the best last (how the paper picks the turn count is not public: drawn here by
``turn_weights``, a derived choice)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmx.core.data.files import json_lines
from llmx.core.multimodal.conversations import Conversation, parse_row
from llmx.core.multimodal.model import IMAGE_TOKEN
from llmx.errors import UsageError


@dataclass
class Dialogue:
    where: str
    image: Any  # a file path or a generated Scene
    question: str  # the first user turn, with <image>
    answers: list[str]  # worst to best
    feedback: list[str]  # the critic's reply after each answer but the last
    turns: list[int]  # each answer's turn number (1..T)
    scores: list[float | None]
    sigmas: list[float | None]

    def conversation(self, keep: list[int] | None = None) -> Conversation:
        """The dialogue as one conversation, with only the answers at positions ``keep`` (each with the feedback
        that follows it, the last one without)."""
        keep = list(range(len(self.answers))) if keep is None else keep
        messages = [{"role": "user", "content": self.question}]
        for k in keep:
            messages.append({"role": "assistant", "content": self.answers[k]})
            if k != keep[-1]:
                messages.append({"role": "user", "content": self.feedback[k]})
        return Conversation(self.where, messages, self.image)

    def row(self, image: str) -> dict[str, Any]:
        """The JSON row, the image as the path ``image``."""
        turns: list[dict[str, Any]] = [{"from": "human", "value": self.question}]
        for k, answer in enumerate(self.answers):
            gpt: dict[str, Any] = {"from": "gpt", "value": answer, "turn": self.turns[k]}
            if self.scores[k] is not None:
                gpt["score"] = self.scores[k]
            if self.sigmas[k] is not None:
                gpt["sigma"] = self.sigmas[k]
            turns.append(gpt)
            if k < len(self.feedback):
                turns.append({"from": "human", "value": self.feedback[k]})
        return {"image": image, "conversations": turns}


def load(path: str | Path, image_folder: str | Path | None = None) -> list[Dialogue]:
    """Every row of a dialogue file; a malformed row is a usage error naming ``file:line``, raised before any use."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"dialogue data not found: {p}")
    folder = Path(image_folder) if image_folder else p.parent
    out = [_dialogue(row, where, folder) for where, row in json_lines(p)]
    if not out:
        raise UsageError(f"{p}: no dialogues")
    return out


def _number(value, low: float, high: float) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value <= high


def _dialogue(row: dict[str, Any], where: str, folder: Path) -> Dialogue:
    if row.get("image") is None:
        raise UsageError(f"{where}: no image: a reflection dialogue is about one image ('image': a file path)")
    conv = parse_row(row, where, folder)
    turns = row["conversations"]
    roles = [t["from"] for t in turns]
    if roles != ["human", "gpt"] * (len(turns) // 2) or len(turns) % 2:
        raise UsageError(f"{where}: turns out of order: a dialogue alternates human and gpt, starting with the "
                         "question and ending with an answer")
    if IMAGE_TOKEN not in turns[0]["value"]:
        raise UsageError(f"{where}: the image ({IMAGE_TOKEN}) must be in the first human turn")
    gpt = turns[1::2]
    numbers = [t.get("turn", k + 1) for k, t in enumerate(gpt)]
    if numbers != list(range(1, len(gpt) + 1)):
        raise UsageError(f"{where}: turns out of order: the answers are numbered {numbers}, not 1..{len(gpt)}")
    for k, t in enumerate(gpt, 1):
        if "sigma" in t and not _number(t["sigma"], 0.0, 1.0):
            raise UsageError(f"{where}: turn {k}: sigma {t['sigma']!r} is outside [0, 1]")
        if "score" in t and not _number(t["score"], 1, 10):
            raise UsageError(f"{where}: turn {k}: score {t['score']!r} is not a number from 1 to 10")
    return Dialogue(where, conv.image, turns[0]["value"], [t["value"] for t in gpt],
                    [t["value"] for t in turns[2::2]], numbers, [t.get("score") for t in gpt],
                    [t.get("sigma") for t in gpt])


def assemble(candidates: list[tuple[str, float, str]], rng: random.Random, score_gap: float, min_score: float,
             max_turns: int, turn_weights: list[float] | None = None) -> list[tuple[str, float, str]] | None:
    """The turns (answer, score, feedback) of one dialogue from scored candidates, or None when none passes: the
    best (the first of equal scores) last; for two turns the worst first; for three, between them the candidate
    whose score is nearest their midpoint, strictly between (two turns when there is none)."""
    distinct = list({c[0]: c for c in candidates}.values())
    if not distinct:
        return None
    best = max(distinct, key=lambda c: c[1])
    worst = min(distinct, key=lambda c: c[1])
    if best[1] < min_score or best[1] - worst[1] < score_gap:
        return None
    weights = turn_weights or [1.0] * max_turns
    count = rng.choices(range(1, max_turns + 1), weights[:max_turns])[0]
    if count == 1 or worst is best:
        return [best]
    middle = [c for c in distinct if worst[1] < c[1] < best[1]]
    chosen = [worst]
    for k in range(1, count - 1):
        target = worst[1] + (best[1] - worst[1]) * k / (count - 1)
        pool = [c for c in middle if c[1] > chosen[-1][1]]
        if pool:
            chosen.append(min(pool, key=lambda c: abs(c[1] - target)))
    return [*chosen, best]
