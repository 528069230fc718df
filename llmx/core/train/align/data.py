"""Preference data from jsonl: paired ``{prompt, chosen, rejected}``, unpaired ``{prompt, completion, label}`` and
step-level ``{prompt, steps: [..], labels: [..]}``. A malformed row is a usage error naming the file and line.

TRL's dataset conventions load unchanged: a text may be a string or a conversation (a list of ``{role, content}``
messages, rendered with the tokenizer's chat template at encoding time, ``core.train.align.chat``), and a paired row
may leave its prompt implicit (``{chosen, rejected}`` only), in which case the prompt is their longest common prefix
(whole messages for conversations; for strings, up to the last whitespace before they differ, as TRL's
``extract_prompt``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from llmx.core.data.files import json_lines
from llmx.errors import UsageError

KINDS = {"paired": ("prompt", "chosen", "rejected"), "unpaired": ("prompt", "completion", "label"),
         "step": ("prompt", "steps", "labels")}


Text = str | list[dict[str, str]]  # a string, or a conversation


@dataclass
class Example:
    prompt: Text
    chosen: Text | None = None
    rejected: Text | None = None
    completion: Text | None = None
    label: bool | None = None
    steps: list[str] = field(default_factory=list)
    step_labels: list[bool] = field(default_factory=list)


def _kind(row: dict) -> str | None:
    for kind, keys in KINDS.items():
        if all(k in row for k in keys):
            return kind
    if "chosen" in row and "rejected" in row:  # TRL's implicit prompt
        return "paired"
    return None


def implicit_prompt(chosen: Text, rejected: Text) -> tuple[Text, Text, Text]:
    """(prompt, chosen, rejected) from two full texts sharing a prompt, as TRL's ``extract_prompt``."""
    if isinstance(chosen, list) and isinstance(rejected, list):
        k = 0
        while k < min(len(chosen), len(rejected)) and chosen[k] == rejected[k]:
            k += 1
        return chosen[:k], chosen[k:], rejected[k:]
    k = 0
    while k < min(len(chosen), len(rejected)) and chosen[k] == rejected[k]:
        k += 1
    while k > 0 and not chosen[k - 1].isspace():
        k -= 1
    return chosen[:k], chosen[k:], rejected[k:]


def load(path: str | Path) -> tuple[str, list[Example]]:
    """All rows of one file, which must share one kind; returns (kind, examples)."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"preference data not found: {p}")
    kind, rows = None, []
    for where, row in json_lines(p):
        this = _kind(row)
        if this is None:
            raise UsageError(f"{where}: expected keys {{prompt, chosen, rejected}} (prompt optional), "
                             f"{{prompt, completion, label}} or {{prompt, steps, labels}}; got {sorted(row)}")
        if kind is not None and this != kind:
            raise UsageError(f"{where}: a {this} row in a file of {kind} rows")
        kind = this
        rows.append(_example(row, this, where))
    if not rows:
        raise UsageError(f"{p}: no rows")
    return kind, rows


def _text(row: dict, key: str, where: str, allow_empty: bool = False) -> Text:
    value = row[key]
    if isinstance(value, list):
        if not all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                   for m in value) or (not value and not allow_empty):
            raise UsageError(f"{where}: '{key}' must be a string or a list of {{role, content}} messages")
        return [{"role": m["role"], "content": m["content"]} for m in value]
    if not isinstance(value, str) or (not value and not allow_empty):
        raise UsageError(f"{where}: '{key}' must be a non-empty string or a list of messages")
    return value


def _example(row: dict, kind: str, where: str) -> Example:
    if kind == "paired":
        chosen, rejected = _text(row, "chosen", where), _text(row, "rejected", where)
        if "prompt" not in row:
            if isinstance(chosen, list) != isinstance(rejected, list):
                raise UsageError(f"{where}: 'chosen' and 'rejected' must both be strings or both conversations")
            prompt, chosen, rejected = implicit_prompt(chosen, rejected)
            if not chosen or not rejected:
                raise UsageError(f"{where}: 'chosen' and 'rejected' are identical after their shared prompt")
            return Example(prompt, chosen=chosen, rejected=rejected)
        return Example(_text(row, "prompt", where, allow_empty=True), chosen=chosen, rejected=rejected)
    prompt = _text(row, "prompt", where, allow_empty=True)
    if kind == "unpaired":
        if not isinstance(row["label"], bool):
            raise UsageError(f"{where}: 'label' must be true or false")
        return Example(prompt, completion=_text(row, "completion", where), label=row["label"])
    steps, labels = row["steps"], row["labels"]
    if not isinstance(prompt, str):
        raise UsageError(f"{where}: step-level rows take a string prompt")
    if not (isinstance(steps, list) and steps and all(isinstance(s, str) and s for s in steps)):
        raise UsageError(f"{where}: 'steps' must be a non-empty list of non-empty strings")
    if not (isinstance(labels, list) and len(labels) == len(steps) and all(isinstance(b, bool) for b in labels)):
        raise UsageError(f"{where}: 'labels' must be a list of booleans, one per step")
    return Example(prompt, steps=steps, step_labels=labels)
