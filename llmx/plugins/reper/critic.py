"""Critics ``score(image, question, answer) -> (score 1-10, feedback)`` for RePer's policy/critic dialogue.

``RuleCritic`` stands in for the paper's LVLM critics (GPT-4o, LLaVA-Critic) on generated digit scenes: it reads the
scene's ground truth, parses the caption into (object, attribute, relation) tuples and applies a 10-point rubric
(hallucinated objects cost most, then wrong attributes, missed objects, relations and sentences that describe
nothing; a caption naming no object scores 1) with a templated rationale naming each error, the feedback form of
the paper's data example; ``kinds`` says only which kinds of error there are (an object is missing, a colour is
wrong), naming no object, colour, size, place or relation, so an answer that improves after it was not copied from
it. ``noise`` makes it a weaker critic: each error is, with that probability, omitted (not charged, not named) or
misreported (named wrongly, still charged). ``ModelCritic``
prompts any vision-language model with the rubric, for real images."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Protocol

from llmx.core.multimodal import languages as L

COSTS = {"hallucination": 4, "attribute": 3, "miss": 2, "relation": 1, "unreadable": 1}
ASK = "Could you generate a better one?"
NAMED_UNREAD = 2  # unreadable sentences quoted in the rationale (each one is charged)
RUBRIC = ("Score the caption of this image from 1 to 10. Start from 10: take 4 points for each object it mentions "
          "that is not in the image, 3 for each wrong colour, size or place, 2 for each object it misses and 1 for "
          "each wrong or missing relation and each sentence that describes nothing; at least 1, and 1 for a caption "
          "that names no object. Reply 'Score: N.' and name each error.")


@dataclass(frozen=True)
class Error:
    kind: str  # hallucination | attribute | miss | relation | unreadable
    text: str
    about: tuple = ()  # attribute: (digit, slot, said value); miss: (digit,)


class Critic(Protocol):
    def score(self, image, question: str, answer: str) -> tuple[int, str]: ...


def feedback(score: int, rationale: str = "") -> str:
    """The paper's feedback turn: the score, the rationale when given, then the request for a better answer."""
    head = "This caption gets the full score 10." if score >= 10 else f"This caption can only get the score {score}."
    return " ".join(x for x in (head, rationale, ASK) if x)


KIND_TEXT = {"hallucination": "The caption mentions an object that is not in the image.",
             "colour": "A colour is wrong.", "size": "A size is wrong.", "cell": "A place is wrong.",
             "relation": "A relation between objects is wrong or missing.",
             "unreadable": "A sentence describes nothing in the image.", "miss": "An object is missing."}


def kinds(found: list[Error]) -> str:
    """The errors' kinds, each once, in the order they were found (an attribute by its slot), no object named."""
    keys = [e.about[1] if e.kind == "attribute" else e.kind for e in found]
    return " ".join(KIND_TEXT[k] for k in dict.fromkeys(keys))


def _word(slot: str, value) -> str:
    t = L.TABLES["en"]
    if slot == "digit":
        return t["digits"][int(value)]
    return {"colour": t["colours"], "size": t["sizes"], "cell": t["cells"], "relation": t["relations"]}[slot][value]


def _article(word: str) -> str:
    return f"{'an' if word[0] in 'aeiu' else 'a'} {word}"  # "an eight", "a one"


def _objects(tuples: list[tuple]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for t in tuples:
        if t[0] == "object":
            out.setdefault(t[1], {})
        elif t[0] == "attribute":
            out.setdefault(t[1], {})[t[2]] = t[3]
    return out


def _describe(d: str, attrs: dict[str, str]) -> str:
    return (f"the {_word('size', attrs['size'])} {_word('colour', attrs['colour'])} {_word('digit', d)} at the "
            f"{_word('cell', attrs['cell'])}")


def _attribute_text(d: str, slot: str, true: str, said: str) -> str:
    if slot == "cell":
        return f"The {_word('digit', d)} is at the {_word('cell', true)}, not the {_word('cell', said)}."
    return f"The {_word('digit', d)} is {_word(slot, true)}, not {_word(slot, said)}."


def errors(said: list[tuple], truth: list[tuple], unread: list[str] = (), rng: random.Random | None = None,
           noise: float = 0.0) -> list[Error]:
    """The rubric's errors of a caption's tuples (and the sentences it states that describe nothing) against the
    scene's: digits it names that are not in the image (as objects or in relations), wrong attributes, wrong
    relations, unreadable sentences, then misses. With ``noise``, each error is dropped or misreported with that
    probability (half each), drawn from ``rng``."""
    said_o, true_o = _objects(said), _objects(truth)
    true_rel = {t for t in truth if t[0] == "relation"}
    said_rel = [t for t in said if t[0] == "relation"]
    found: list[Error] = [Error("hallucination", _hallucinated(d)) for d in named(said) if d not in true_o]
    for _, d, slot, value in (t for t in said if t[0] == "attribute"):  # every statement: a digit described twice
        if d in true_o and value != true_o[d][slot]:                   # is checked twice
            found.append(Error("attribute", _attribute_text(d, slot, true_o[d][slot], value), (d, slot, value)))
    for _, a, rel, b in said_rel:
        if a in true_o and b in true_o and ("relation", a, rel, b) not in true_rel:
            found.append(Error("relation", _relation_text(a, rel, b)))
    found += [Error("unreadable", f'"{_short(x)}" describes nothing in the image.' if k < NAMED_UNREAD else "")
              for k, x in enumerate(unread)]
    for d, attrs in true_o.items():
        if d not in said_o:
            found.append(Error("miss", f"It misses {_describe(d, attrs)}.", (d,)))
    for t in sorted(true_rel):
        _, a, rel, b = t
        if a in said_o and b in said_o and t not in said_rel:
            found.append(Error("relation", f"It does not say that the {_word('digit', a)} is "
                                            f"{_word('relation', rel)} the {_word('digit', b)}."))
    if not noise or rng is None:
        return found
    out = []
    for e in found:
        u = rng.random()
        if u >= noise:
            out.append(e)
        elif u >= noise / 2:
            out.append(_misreport(e, true_o, rng))
    return out


def named(said: list[tuple]) -> list[str]:
    """The digits a caption names, as objects or in relations, in order."""
    return list(dict.fromkeys(d for t in said for d in ((t[1], t[3]) if t[0] == "relation" else (t[1],))))


def _hallucinated(d: str) -> str:
    return f"The caption mentions {_article(_word('digit', d))} that is not in the image."


def _relation_text(a: str, rel: str, b: str) -> str:
    return f"The {_word('digit', a)} is not {_word('relation', rel)} the {_word('digit', b)}."


def _short(text: str, width: int = 40) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def _misreport(e: Error, true_o: dict, rng: random.Random) -> Error:
    """The error named wrongly: a wrong correction for an attribute, wrong attributes for a miss, another absent
    digit for a hallucination, a relation the caption did not state for a relation error (an unreadable sentence is
    left as it is); its kind (and cost) kept."""
    choices = {"colour": L.COLOURS, "size": L.SIZES, "cell": L.CELLS}
    digits = [str(d) for d in range(10)]
    if e.kind == "attribute":
        d, slot, said = e.about
        wrong = rng.choice([v for v in choices[slot] if v not in (said, true_o[d][slot])] or [said])
        return Error("attribute", _attribute_text(d, slot, wrong, said), e.about)
    if e.kind == "miss":
        d = e.about[0]
        attrs = {s: rng.choice([v for v in choices[s] if v != true_o[d][s]]) for s in choices}
        return Error("miss", f"It misses {_describe(d, attrs)}.", e.about)
    if e.kind == "hallucination":
        return Error("hallucination", _hallucinated(rng.choice([x for x in digits if x not in true_o])))
    if e.kind == "relation":
        a, b = rng.sample(digits, 2)
        return Error("relation", _relation_text(a, rng.choice(L.RELATIONS), b))
    return e


def rubric(found: list[Error], said: list[tuple]) -> int:
    """10 less each error's cost, at least 1; a caption that names no object scores 1."""
    if not any(t[0] == "object" for t in said):
        return 1
    return max(1, 10 - sum(COSTS[e.kind] for e in found))


class RuleCritic:
    """The rule critic on digit scenes (``image`` is a ``Scene``: it reads the ground truth). ``feedback`` is the
    config's: ``rationale`` names each error, ``kind`` only the errors' kinds, ``score`` is the score-only feedback of
    the ablation; ``noise`` the weaker critic; ``seed`` its draws (a pure function of seed, scene and caption)."""

    def __init__(self, feedback: str = "rationale", noise: float = 0.0, seed: int = 0, language: str = "en"):
        self.feedback, self.noise, self.seed, self.language = feedback, noise, seed, language

    def judge(self, image, answer: str) -> tuple[int, list[Error]]:
        if not hasattr(image, "truth"):
            raise TypeError("the rule critic reads a generated scene's ground truth; use critic: model for images")
        said, truth = L.parse_caption(self.language, answer), image.truth()
        rng = random.Random(f"{self.seed}:{truth}:{answer}") if self.noise else None
        found = errors(said, truth, L.unread(self.language, answer), rng, self.noise)
        return rubric(found, said), found

    def score(self, image, question: str, answer: str) -> tuple[int, str]:
        score, found = self.judge(image, answer)
        if self.feedback == "score":
            return score, feedback(score)
        if not found and score <= 1:
            text = "The caption does not describe the image."
        else:
            text = kinds(found) if self.feedback == "kind" else " ".join(e.text for e in found if e.text)
        return score, feedback(score, text)


SCORE = re.compile(r"score\D{0,12}?(10|[1-9])\b", re.IGNORECASE)


class ModelCritic:
    """Any vision-language model asked with ``RUBRIC``: the first ``Score: N`` in its greedy reply is the score (1
    when it gives none), the reply is the rationale."""

    def __init__(self, model, processor, max_new_tokens: int = 128, rationale: bool = True):
        self.model, self.processor, self.max_new_tokens, self.rationale = model, processor, max_new_tokens, rationale

    def score(self, image, question: str, answer: str) -> tuple[int, str]:
        from llmx.core.multimodal.answer import reply

        ask = f"<image>\n{RUBRIC}\nQuestion: {question}\nCaption: {answer}"
        text = reply(self.model, self.processor, [[{"role": "user", "content": ask}]], [image],
                     self.max_new_tokens)[0]
        m = SCORE.search(text)
        score = int(m.group(1)) if m else 1
        return score, feedback(score, text.strip() if self.rationale else "")
