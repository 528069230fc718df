"""Multimodal SFT rows: a conversation rendered in LLaVA-1.5's format with ``<image>`` expanded to the image's token
count, tokenised as the ``sft`` stage does (loss on the assistant turns only); images are read and preprocessed per
micro-batch, so a large dataset's pixels are never all in memory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    conv: Conversation
    proc: Any

    def pixels(self) -> torch.Tensor | None:
        """(3, H, W), or None for a text-only row."""
        try:
            image = self.conv.pil()
        except Exception as exc:  # PIL raises OSError, SyntaxError, ValueError... for damaged files
            raise UsageError(f"{self.conv.where}: cannot read image {self.conv.image}: {exc}") from exc
        return None if image is None else pixel_values(self.proc, [image])[0]


def pixel_values(proc, images: list) -> torch.Tensor:
    """The processor's own pixels for PIL images (in RGB): llmx's processors pad to a square first
    (``model.padding``), so the processor saved with a model reproduces them."""
    return proc.image_processor([im.convert("RGB") for im in images], return_tensors="pt")["pixel_values"]


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
            if e.prompt_cut:
                raise UsageError(f"{c.where}: the prompt does not fit max_length {max_length} with its "
                                 f"{image_tokens} image tokens; raise max_length")
            raise UsageError(f"{c.where}: {e.ids.count(image_id)} image tokens where the model takes {image_tokens} "
                             f"per image: the tokenizer does not keep {IMAGE_TOKEN} as one token")
        if not any(e.trained):
            raise UsageError(f"{c.where}: no response token fits max_length {max_length}; raise max_length")
        if isinstance(c.image, Path):
            _check_image(c)
        out.append(Example(e, c, proc))
    return out


def _check_image(c: Conversation) -> None:
    """An image file that does not decode stops the run before training, naming its row (decoded once, dropped)."""
    from PIL import Image

    try:
        with Image.open(c.image) as img:
            img.load()
    except Exception as exc:  # PIL raises OSError, SyntaxError, ValueError... for damaged files
        raise UsageError(f"{c.where}: cannot read image {c.image}: {exc}") from exc


def collate(items: list[Example], pad_id: int, device) -> dict[str, torch.Tensor]:
    """Right-padded ids, attention mask and response-only labels, with the batch's images stacked in row order."""
    t = padded([e.row for e in items], pad_id, device)
    pixels = [px for px in (e.pixels() for e in items) if px is not None]
    if pixels:
        t["pixel_values"] = torch.stack(pixels).to(device)
    return t
