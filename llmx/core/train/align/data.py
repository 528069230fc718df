"""Preference data from jsonl: paired ``{prompt, chosen, rejected}``, unpaired ``{prompt, completion, label}`` and
step-level ``{prompt, steps: [..], labels: [..]}``. A malformed row is a usage error naming the file and line."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from llmx.errors import UsageError

KINDS = {"paired": ("prompt", "chosen", "rejected"), "unpaired": ("prompt", "completion", "label"),
         "step": ("prompt", "steps", "labels")}


@dataclass
class Example:
    prompt: str
    chosen: str | None = None
    rejected: str | None = None
    completion: str | None = None
    label: bool | None = None
    steps: list[str] = field(default_factory=list)
    step_labels: list[bool] = field(default_factory=list)


def _kind(row: dict) -> str | None:
    for kind, keys in KINDS.items():
        if all(k in row for k in keys):
            return kind
    return None


def load(path: str | Path) -> tuple[str, list[Example]]:
    """All rows of one file, which must share one kind; returns (kind, examples)."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"preference data not found: {p}")
    kind, rows = None, []
    with p.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{p}:{n}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UsageError(f"{where}: not valid JSON ({exc.msg})") from exc
            if not isinstance(row, dict):
                raise UsageError(f"{where}: expected a JSON object")
            this = _kind(row)
            if this is None:
                raise UsageError(f"{where}: expected keys {{prompt, chosen, rejected}}, {{prompt, completion, label}} "
                                 f"or {{prompt, steps, labels}}; got {sorted(row)}")
            if kind is not None and this != kind:
                raise UsageError(f"{where}: a {this} row in a file of {kind} rows")
            kind = this
            rows.append(_example(row, this, where))
    if not rows:
        raise UsageError(f"{p}: no rows")
    return kind, rows


def _example(row: dict, kind: str, where: str) -> Example:
    def text(key: str) -> str:
        if not isinstance(row[key], str) or (key != "prompt" and not row[key]):
            raise UsageError(f"{where}: '{key}' must be a non-empty string")
        return row[key]

    if kind == "paired":
        return Example(text("prompt"), chosen=text("chosen"), rejected=text("rejected"))
    if kind == "unpaired":
        if not isinstance(row["label"], bool):
            raise UsageError(f"{where}: 'label' must be true or false")
        return Example(text("prompt"), completion=text("completion"), label=row["label"])
    steps, labels = row["steps"], row["labels"]
    if not (isinstance(steps, list) and steps and all(isinstance(s, str) and s for s in steps)):
        raise UsageError(f"{where}: 'steps' must be a non-empty list of non-empty strings")
    if not (isinstance(labels, list) and len(labels) == len(steps) and all(isinstance(b, bool) for b in labels)):
        raise UsageError(f"{where}: 'labels' must be a list of booleans, one per step")
    return Example(text("prompt"), steps=steps, step_labels=labels)
