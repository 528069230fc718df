"""SFT rows from jsonl and their rendering into (text, trained) segments.

Rows are ``{"prompt", "completion"}`` or ``{"messages": [{"role", "content"}, ...]}`` with at least one assistant
message; other keys are ignored. A malformed row is a usage error naming ``file:line``.

Rendering: a prompt/completion row is the prompt's text, then the completion's text and EOS (the completion
trained). A conversation uses the tokenizer's chat template when it has one: each assistant message is the text the
template adds between ``messages[:k]`` rendered with the generation prompt and ``messages[:k+1]``, trained; all else
is context. Without a chat template, the plain template is ``"{role}: {content}\\n"`` for system and user turns and
``"assistant: "`` (context) then ``"{content}"`` and EOS (trained) for assistant turns.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmx.core.data.files import json_lines
from llmx.errors import UsageError

ROLES = ("system", "user", "assistant", "tool")


@dataclass
class Row:
    where: str
    prompt: str | None = None
    completion: str | None = None
    messages: list[dict[str, str]] | None = None


def load(path: str | Path) -> list[Row]:
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"SFT data not found: {p}")
    rows = [_row(row, where) for where, row in json_lines(p)]
    if not rows:
        raise UsageError(f"{p}: no rows")
    return rows


def _row(row: dict[str, Any], where: str) -> Row:
    if "messages" in row:
        msgs = row["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise UsageError(f"{where}: 'messages' must be a non-empty list")
        for k, m in enumerate(msgs):
            if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                raise UsageError(f"{where}: messages[{k}] must be an object with string 'role' and 'content'")
            if m["role"] not in ROLES:
                raise UsageError(f"{where}: messages[{k}] has role '{m['role']}'; roles: {', '.join(ROLES)}")
        if not any(m["role"] == "assistant" and m["content"] for m in msgs):
            raise UsageError(f"{where}: no non-empty assistant message to train on")
        return Row(where, messages=[{"role": m["role"], "content": m["content"]} for m in msgs])
    if "prompt" in row and "completion" in row:
        if not isinstance(row["prompt"], str):
            raise UsageError(f"{where}: 'prompt' must be a string")
        if not isinstance(row["completion"], str) or not row["completion"]:
            raise UsageError(f"{where}: 'completion' must be a non-empty string")
        return Row(where, prompt=row["prompt"], completion=row["completion"])
    raise UsageError(f"{where}: expected keys {{prompt, completion}} or {{messages}}; got {sorted(row)}")


def segments(tok, row: Row) -> list[tuple[str, bool]]:
    """The row as (text, trained) pieces in order; ``None`` text stands for the EOS token."""
    if row.messages is None:
        return [(row.prompt, False), (row.completion, True), (None, True)]
    if getattr(tok, "chat_template", None):
        return _templated(tok, row)
    out: list[tuple[str | None, bool]] = []
    for m in row.messages:
        if m["role"] == "assistant":
            out += [("assistant: ", False), (m["content"], True), (None, True)]
        else:
            out.append((f"{m['role']}: {m['content']}\n", False))
    return out


def _templated(tok, row: Row) -> list[tuple[str, bool]]:
    def render(msgs, gen: bool) -> str:
        return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)

    out, done = [], ""
    for k, m in enumerate(row.messages):
        if m["role"] != "assistant":
            continue
        head = render(row.messages[:k], True) if k else ""
        full = render(row.messages[:k + 1], False)
        if not (head.startswith(done) and full.startswith(head)):
            raise UsageError(f"{row.where}: the tokenizer's chat template does not render conversations "
                             "prefix by prefix, so assistant turns cannot be located; use prompt/completion rows")
        out += [(head[len(done):], False), (full[len(head):], True)]
        done = full
    rest = render(row.messages, False)[len(done):]
    return out + ([(rest, False)] if rest else [])
