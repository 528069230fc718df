"""MMMB scored by likelihood: each option's text as the whole reply (end of turn included) to the hint and question
with the image, without the lettered options or the instruction (the cloze form), and the option of highest summed
log-probability picked. No letter is read and the options' order never reaches the model, so rotated copies get the
same scores (a tie goes to the first option, so under CircularEval a tie is never right). The forwards carry the
labels: Parrot's router reads the question, never the option scored."""

from __future__ import annotations

import torch

from llmx.core.multimodal.conversations import Conversation
from llmx.core.multimodal.model import IMAGE_TOKEN
from llmx.plugins.parrot.mmmb import Item, Picture

MAX_LENGTH = 8192  # tokens per scored row, image tokens included: a longer prompt is an error naming its row


def content(item: Item) -> str:
    """The user turn the options are scored after."""
    return f"{IMAGE_TOKEN}\n{item.asked()}"


@torch.no_grad()
def loglikelihoods(model, proc, items: list[Item], batch_size: int, progress=lambda x, **_: x) -> list[list[float]]:
    """Per row, each option's summed log-probability as the reply; each distinct (question, option, image) is
    scored once, so a question's rotated copies cost nothing more. The model is left in the mode it was in."""
    from llmx.core.multimodal.batch import collate, examples
    from llmx.core.multimodal.model import image_tokens
    from llmx.core.preference import token_logps
    from llmx.core.train.parallel import device_of
    from llmx.core.train.sft.batch import IGNORE

    asked: dict[tuple[str, str, bytes], Conversation] = {}
    for it in items:
        for option in it.options:
            asked.setdefault((content(it), option, it.image), Conversation(
                it.where, [{"role": "user", "content": content(it)}, {"role": "assistant", "content": option}],
                Picture(it)))
    rows = examples(proc, list(asked.values()), image_tokens(model), MAX_LENGTH)
    tok = proc.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    device, was = device_of(model), model.training
    model.eval()
    sums: list[float] = []
    try:
        for s in progress(range(0, len(rows), batch_size), description="mmmb likelihood"):
            t = collate(rows[s:s + batch_size], pad, device)
            logps = token_logps(model(**t).logits, t["input_ids"])
            sums += (logps * (t["labels"][:, 1:] != IGNORE)).sum(-1).tolist()
    finally:
        model.train(was)
    found = dict(zip(asked, sums, strict=True))
    return [[found[content(it), option, it.image] for option in it.options] for it in items]


def pick(scores: list[float]) -> int:
    """The best option's position (the first of a tie)."""
    return max(range(len(scores)), key=scores.__getitem__)


def per_byte(scores: list[float], options: list[str]) -> list[float]:
    """Each option's log-likelihood over its UTF-8 bytes (lm-eval's ``acc_norm``)."""
    return [s / max(len(o.encode()), 1) for s, o in zip(scores, options, strict=True)]
