"""Questions about a scene and the data made from them: open questions (a word answers), multiple choice (a letter
answers, MMMB's format), captions; as image conversations for the vision-language model, and as text-only
documents (the caption stands in for the image) for pre-training its language model."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from llmx.core.multimodal import languages as L
from llmx.core.multimodal.conversations import Conversation
from llmx.core.multimodal.model import IMAGE_TOKEN, assistant_turn, user_turn
from llmx.core.multimodal.scenes import Scene, scenes

KINDS = ("colour", "size", "cell", "digit_at", "count", "relation")
LETTERS = "ABCD"


@dataclass(frozen=True)
class QA:
    kind: str
    question: str  # the question as asked (with its options and instruction for multiple choice)
    answer: str  # the expected response: a word, a letter, or a caption
    value: Any  # what the answer names (a key, digit, count or bool); the caption's tuples for captions
    options: tuple[str, ...] = ()  # multiple choice: the options in letter order


def _values(kind: str) -> list:
    return {"colour": list(L.COLOURS), "size": list(L.SIZES), "cell": list(L.CELLS), "digit_at": list(range(10)),
            "count": [1, 2, 3, 4], "relation": [True, False]}[kind]


def ask(scene: Scene, rng: random.Random, kind: str) -> tuple[dict, Any]:
    """The question's slots and its true value."""
    objs = scene.objects
    o = rng.choice(objs)
    if kind in ("colour", "size", "cell"):
        return {"digit": o.digit}, getattr(o, kind)
    if kind == "digit_at":
        return {"cell": o.cell}, o.digit
    if kind == "count":
        return {}, len(objs)
    a, rel, b = rng.choice(scene.relations)
    if rng.random() < 0.5:
        return {"a": a, "relation": rel, "b": b}, True
    other = "above" if rel == "left_of" else "left_of"
    if rng.random() < 0.5 and not _holds(scene, a, other, b):  # the other relation between the same pair
        return {"a": a, "relation": other, "b": b}, False
    return {"a": b, "relation": rel, "b": a}, False  # the pair reversed


def _holds(scene: Scene, a: int, relation: str, b: int) -> bool:
    """Whether ``a relation b`` is true of the cells (a diagonal pair is both above and left of)."""
    (ra, ca), (rb, cb) = (divmod(L.CELLS.index(next(o.cell for o in scene.objects if o.digit == d)), 2) for d in (a, b))
    return ca < cb if relation == "left_of" else ra < rb


def option_values(kind: str, value, rng: random.Random) -> list:
    """The true value and up to three others of ``kind``, shuffled: a multiple-choice question's options in order."""
    others = [v for v in _values(kind) if v != value]
    chosen = [value] + rng.sample(others, min(len(others), len(LETTERS) - 1))
    rng.shuffle(chosen)
    return chosen


def question(scene: Scene, rng: random.Random, lang: str, fmt: str, kind: str | None = None) -> QA:
    """One question about ``scene`` in ``lang``: ``open``, ``choice`` or ``caption``."""
    if fmt == "caption":
        text = L.caption(lang, [o.key() for o in scene.objects], scene.relations)
        return QA("caption", L.question(lang, "caption"), text, scene.truth())
    kinds = [k for k in KINDS if k != "relation" or len(scene.objects) > 1]
    kind = kind if kind in kinds else rng.choice(kinds)
    slots, value = ask(scene, rng, kind)
    asked = L.question(lang, kind, **slots)
    if fmt == "open":
        return QA(kind, asked, L.answer(lang, kind, value), value)
    chosen = option_values(kind, value, rng)
    options = tuple(L.answer(lang, kind, v) for v in chosen)
    letter = LETTERS[chosen.index(value)]
    return QA(kind, L.multiple_choice(lang, asked, list(options)), letter, value, options)


def conversations(count: int, split: str, seed: int, languages: dict[str, float], formats: dict[str, float],
                  objects: int | None = None) -> list[Conversation]:
    """``count`` one-turn image conversations, each language and format drawn by weight, from one seed."""
    rng = random.Random(f"qa:{split}:{seed}")
    langs, lw = zip(*languages.items(), strict=True)
    fmts, fw = zip(*formats.items(), strict=True)
    out = []
    for i, s in enumerate(scenes(count, split, seed, objects)):
        lang, fmt = rng.choices(langs, lw)[0], rng.choices(fmts, fw)[0]
        qa = question(s, rng, lang, fmt)
        out.append(Conversation(f"scenes:{split}:{seed}#{i}",
                                [{"role": "user", "content": f"{IMAGE_TOKEN}\n{qa.question}"},
                                 {"role": "assistant", "content": qa.answer}],
                                s, {"language": lang, "format": fmt, "kind": qa.kind, "value": qa.value,
                                    "options": list(qa.options)}))
    return out


def as_text(conv: Conversation) -> Conversation:
    """The conversation for a text-only model: the scene's caption (in the question's language) in place of the image."""
    cap = L.caption(conv.meta["language"], [o.key() for o in conv.image.objects], conv.image.relations)
    first = {**conv.messages[0], "content": conv.messages[0]["content"].replace(IMAGE_TOKEN, cap)}
    return Conversation(conv.where, [first, *conv.messages[1:]], None, conv.meta)


def documents(count: int, split: str, seed: int, questions: int = 4) -> list[str]:
    """Text-only documents, languages in turn (balanced): a scene's caption, then ``questions`` open and
    multiple-choice turns about it, in the chat format the vision-language model is trained in."""
    rng = random.Random(f"docs:{split}:{seed}")
    out = []
    for i, s in enumerate(scenes(count, split, seed)):
        lang = L.LANGUAGES[i % len(L.LANGUAGES)]
        text = L.caption(lang, [o.key() for o in s.objects], s.relations)
        turns = []
        for k in range(questions):
            qa = question(s, rng, lang, rng.choice(("open", "choice")))
            turns.append(user_turn(f"{text}\n{qa.question}" if k == 0 else qa.question) + assistant_turn(qa.answer))
        out.append("".join(turns))
    return out
