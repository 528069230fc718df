"""Greedy answers of a (vision-)language model to one-turn conversations, scored against the scenes' ground truth:
open answers parsed back to the value they name, multiple choice post-processed to one capital letter (MMMB's
scoring), captions parsed to tuples and scored by F1. Accuracy is reported per language with a bootstrap interval."""

from __future__ import annotations

from llmx.core.eval.stats import bootstrap_ci
from llmx.core.multimodal import languages as L
from llmx.core.multimodal.batch import pixel_values
from llmx.core.multimodal.conversations import Conversation
from llmx.core.multimodal.model import IMAGE_TOKEN, text_tokenizer

PUNCTUATION = ".()[],:;!*#{}"


def choice(reply: str, options: list[str]) -> int | None:
    """The option a multiple-choice reply picks, as VLMEvalKit's ``can_infer`` reads it (MMMB's scoring; ``vlmeval/
    utils/matching_util.py`` at open-compass/VLMEvalKit 0e18088, its ``VERBOSE``-only article check left out): with
    ``.()[],:;!*#{}`` blanked, the one option letter standing as a word, else the one option whose text the reply
    contains; None when it picks none or several."""
    letters = [chr(ord("A") + k) for k in range(len(options))]
    words = reply.translate(str.maketrans(PUNCTUATION, " " * len(PUNCTUATION))).split()
    named = [c for c in letters if c in words]
    if len(named) == 1:
        return letters.index(named[0])
    texts = [k for k, o in enumerate(options) if o.lower() in reply.lower()]
    return texts[0] if len(texts) == 1 else None


def generate(model, proc, convs: list[Conversation], image_tokens: int, max_new_tokens: int = 8, batch_size: int = 16,
             progress=lambda x, **_: x) -> list[str]:
    """The greedy reply to each conversation's first user turn, its image (if any) as ``image_tokens`` features."""
    return reply(model, proc, [c.messages[:1] for c in convs], convs, max_new_tokens, image_tokens=image_tokens,
                 batch_size=batch_size, progress=progress)


def reply(model, proc, dialogues: list[list[dict]], images: list, max_new_tokens: int, *, image_tokens: int | None = None,
          temperature: float = 0.0, seed: int = 0, batch_size: int = 16, progress=lambda x, **_: x) -> list[str]:
    """The next assistant turn of each dialogue (``{role, content}`` messages, ``<image>`` in a user turn for an
    image: a PIL image, a scene (``.image()``), a conversation (``.pil()``) or None): the shared batched generator,
    the prompt rendered by the chat template with ``<image>`` expanded to ``image_tokens`` (default: the model's),
    each batch's images read and turned into pixel values as it runs; greedy, or seeded sampling at
    ``temperature``."""
    from llmx.core.eval.generate import generate as complete
    from llmx.core.multimodal.model import image_tokens as count

    tok = text_tokenizer(proc)
    n = count(model) if image_tokens is None else image_tokens
    device = next(model.parameters()).device
    prompts = [tok.apply_chat_template([{**m, "content": m["content"].replace(IMAGE_TOKEN, IMAGE_TOKEN * n)} for m in d],
                                       tokenize=False, add_generation_prompt=True) for d in dialogues]

    def pixels(rows: list[int]) -> dict:
        batch = [x for x in (_pil(images[i]) for i in rows) if x is not None]
        return {"pixel_values": pixel_values(proc, batch).to(device)} if batch else {}

    done = complete(model, tok, prompts, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                    batch_size=batch_size, progress=progress, inputs=pixels, special_tokens=False, truncate=False)
    return [c[0].text.strip() for c in done]


def _pil(image):
    if hasattr(image, "pil"):
        return image.pil()
    return image.image() if hasattr(image, "image") else image


def judge(conv: Conversation, reply: str) -> float:
    """1 for a right answer, 0 otherwise; a caption's F1 against its scene's tuples."""
    m = conv.meta
    lang, fmt = m["language"], m["format"]
    if fmt == "choice":
        k = choice(reply, m["options"])
        return float(k is not None and m["options"][k] == L.answer(lang, m["kind"], m["value"]))
    if fmt == "open":
        return float(L.parse_answer(lang, m["kind"], reply) == m["value"])
    return f1(L.parse_caption(lang, reply), conv.image.truth())


def f1(said: list[tuple], truth: list[tuple]) -> float:
    said_set, true_set = set(said), set(truth)
    if not said_set or not true_set:
        return float(said_set == true_set)
    hit = len(said_set & true_set)
    return 2 * hit / (len(said_set) + len(true_set))


def per_language(languages: list[str], scores: list[float], seed: int = 0) -> dict[str, dict[str, float]]:
    """Per language (``languages[i]`` is question i's): the mean score with a 95% bootstrap interval and the number
    of questions."""
    out: dict[str, dict[str, float]] = {}
    for lang in L.LANGUAGES:
        mine = [s for x, s in zip(languages, scores, strict=True) if x == lang]
        if mine:
            low, high = bootstrap_ci(mine, 1000, seed=seed)
            out[lang] = {"accuracy": sum(mine) / len(mine), "ci_low": low, "ci_high": high, "n": len(mine)}
    return out


def non_english_mean(table: dict[str, dict[str, float]]) -> float | None:
    others = [v["accuracy"] for k, v in table.items() if k != "en"]
    return sum(others) / len(others) if others else None
