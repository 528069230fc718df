"""In-context rows: ``{input, label}`` rows from a .jsonl, and the template that renders them as demonstrations
and queries. No torch import here: parameter validation uses it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from llmx.core.data.files import json_lines
from llmx.errors import UsageError

DEFAULT_TEMPLATE = "input: {input}\nlabel: {label}"


@dataclass(frozen=True)
class Format:
    """How a row reads: ``template`` with one ``{input}`` before one ``{label}``; demonstrations joined by
    ``separator``; a query is the template up to ``{label}``."""

    template: str = DEFAULT_TEMPLATE
    separator: str = "\n"

    def __post_init__(self) -> None:
        problem = template_problem(self.template)
        if problem:
            raise UsageError(f"template {self.template!r}: {problem}")

    @property
    def _parts(self) -> tuple[str, str, str]:
        head, rest = self.template.split("{input}")
        middle, tail = rest.split("{label}")
        return head, middle, tail

    def demo(self, row: dict) -> str:
        head, middle, tail = self._parts
        return f"{head}{row['input']}{middle}{row['label']}{tail}"

    def query(self, text: str) -> str:
        head, middle, _ = self._parts
        return f"{head}{text}{middle}"

    def render(self, rows: Sequence[dict]) -> str:
        return self.separator.join(self.demo(r) for r in rows)

    def prompt(self, demos: Sequence[dict], text: str) -> str:
        return "".join(self.demo(d) + self.separator for d in demos) + self.query(text)


def template_problem(template: str) -> str | None:
    if template.count("{input}") != 1:
        return "needs exactly one {input}"
    if template.count("{label}") != 1:
        return "needs exactly one {label}"
    if template.index("{label}") < template.index("{input}"):
        return "{label} must come after {input}"
    return None


def load_rows(path: str | Path, labels: Sequence[str] | None = None) -> list[dict]:
    """The rows of a .jsonl, each with string ``input`` and ``label``; with ``labels``, a row labelled otherwise is
    an error naming its line."""
    rows = []
    for where, row in json_lines(path):
        if not (isinstance(row.get("input"), str) and isinstance(row.get("label"), str)):
            raise UsageError(f"{where}: an in-context row needs string 'input' and 'label'")
        if labels is not None and row["label"] not in labels:
            raise UsageError(f"{where}: label {row['label']!r} is not among the labels ({', '.join(labels)})")
        rows.append(row)
    if not rows:
        raise UsageError(f"{path}: no rows")
    return rows
