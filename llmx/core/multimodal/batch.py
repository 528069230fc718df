"""Multimodal SFT rows: a conversation rendered by the model's chat template with ``<image>`` expanded to the
image's token count, tokenised as the ``sft`` stage does (loss on the assistant turns only), and its image turned into
pixel values once by the processor."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llmx.core.multimodal.conversations import Conversation
from llmx.core.multimodal.model import IMAGE_TOKEN, text_tokenizer
from llmx.core.train.sft.batch import padded
from llmx.core.train.sft.data import Row
from llmx.core.train.sft.encode import Encoded, encode
from llmx.errors import UsageError


@dataclass
class Example:
    row: Encoded
    pixels: torch.Tensor | None  # (3, H, W)


def pixel_values(proc, images: list) -> torch.Tensor:
    return proc.image_processor(images, return_tensors="pt")["pixel_values"]


def examples(proc, convs: list[Conversation], image_tokens: int, max_length: int) -> list[Example]:
    """Encode every conversation; one whose prompt does not fit ``max_length`` with its image tokens is an error
    naming it (cutting image tokens would break the image/feature count)."""
    tok = text_tokenizer(proc)
    image_id = tok.convert_tokens_to_ids(IMAGE_TOKEN)
    out = []
    for c in convs:
        msgs = [{**m, "content": m["content"].replace(IMAGE_TOKEN, IMAGE_TOKEN * image_tokens)} for m in c.messages]
        e = encode(tok, Row(c.where, messages=msgs), max_length, max_length - 1)
        if e.ids.count(image_id) != (image_tokens if c.image is not None else 0):
            raise UsageError(f"{c.where}: the prompt does not fit max_length {max_length} with its {image_tokens} "
                             "image tokens; raise max_length")
        if not any(e.trained):
            raise UsageError(f"{c.where}: no response token fits max_length {max_length}; raise max_length")
        image = c.pil()
        out.append(Example(e, pixel_values(proc, [image])[0] if image is not None else None))
    return out


def collate(items: list[Example], pad_id: int, device) -> dict[str, torch.Tensor]:
    """Right-padded ids, attention mask and response-only labels, with the batch's images stacked in row order."""
    t = padded([e.row for e in items], pad_id, device)
    pixels = [e.pixels for e in items if e.pixels is not None]
    if pixels:
        t["pixel_values"] = torch.stack(pixels).to(device)
    return t
