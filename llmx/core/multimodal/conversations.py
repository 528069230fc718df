"""LLaVA-format conversations: ``{"image": PATH, "conversations": [{"from": "human"|"gpt", "value": ...}]}`` rows in
a ``.json`` array or a ``.jsonl`` file, ``<image>`` marking where the image goes (LLaVA's ``llava_v1_5_mix665k.json``
layout). Image paths are relative to ``image_folder`` (default: the data file's folder). Every problem is a usage
error naming ``file:line``, raised before anything trains."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmx.core.data.files import json_lines, read_text
from llmx.core.multimodal.model import IMAGE_TOKEN
from llmx.errors import UsageError

ROLES = {"human": "user", "gpt": "assistant"}


@dataclass
class Conversation:
    where: str
    messages: list[dict[str, str]]  # {role: user|assistant, content}
    image: Any = None  # a file path, a Scene, or None for a text-only row
    meta: dict[str, Any] = field(default_factory=dict)  # language, question kind, answer value (generated sets)

    def pil(self):
        """The image as an RGB ``PIL.Image`` (None for a text-only row)."""
        if self.image is None:
            return None
        if hasattr(self.image, "image"):
            return self.image.image()
        from PIL import Image

        with Image.open(self.image) as img:
            return img.convert("RGB")


def load(path: str | Path, image_folder: str | Path | None = None) -> list[Conversation]:
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"conversation data not found: {p}")
    folder = Path(image_folder) if image_folder else p.parent
    rows = _json_array(p) if p.suffix == ".json" else json_lines(p)
    out = [parse_row(row, where, folder) for where, row in rows]
    if not out:
        raise UsageError(f"{p}: no conversations")
    return out


def _json_array(p: Path):
    """``(file:line, object)`` for each element of a JSON array, the line being where the element starts."""
    text = read_text(p)
    decoder = json.JSONDecoder()
    at = len(text) - len(text.lstrip())
    if not text[at:at + 1] == "[":
        raise UsageError(f"{p}:1: a .json conversation file must hold one array of conversations")
    at += 1
    while True:
        while at < len(text) and text[at] in " \t\r\n,":
            at += 1
        if at >= len(text) or text[at] == "]":
            return
        where = f"{p}:{text.count(chr(10), 0, at) + 1}"
        try:
            row, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{where}: not valid JSON ({exc.msg})") from exc
        if not isinstance(row, dict):
            raise UsageError(f"{where}: expected a JSON object")
        yield where, row


def parse_row(row: dict[str, Any], where: str, folder: Path) -> Conversation:
    turns = row.get("conversations")
    if not isinstance(turns, list) or not turns:
        raise UsageError(f"{where}: 'conversations' must be a non-empty list of {{from, value}} turns")
    messages = []
    for k, t in enumerate(turns):
        if not (isinstance(t, dict) and t.get("from") in ROLES and isinstance(t.get("value"), str)):
            raise UsageError(f"{where}: conversations[{k}] must be {{\"from\": \"human\"|\"gpt\", \"value\": text}}")
        messages.append({"role": ROLES[t["from"]], "content": t["value"]})
    if not any(m["role"] == "assistant" and m["content"] for m in messages):
        raise UsageError(f"{where}: no non-empty gpt turn to train on")
    placeholders = sum(m["content"].count(IMAGE_TOKEN) for m in messages)
    image = row.get("image")
    if image is not None:
        if not isinstance(image, str):
            raise UsageError(f"{where}: 'image' must be one file path (one image per conversation)")
        file = folder / image
        if not file.is_file():
            raise UsageError(f"{where}: image file not found: {file}")
        image = file
    wanted = 0 if image is None else 1
    if placeholders != wanted or any(IMAGE_TOKEN in m["content"] for m in messages if m["role"] == "assistant"):
        raise UsageError(f"{where}: {placeholders} {IMAGE_TOKEN} placeholders for {wanted} image(s): the model takes "
                         f"one {IMAGE_TOKEN} in a human turn per image")
    return Conversation(where, messages, image, {k: v for k, v in row.items() if k not in ("conversations", "image")})

