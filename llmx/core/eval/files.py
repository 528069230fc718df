"""A task from the user's own ``.jsonl``: rows ``{prompt, choices, answer: index}`` are multiple choice, rows
``{prompt, answer: text}`` are generated and judged by exact match of the extracted answer (``answers``)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from llmx.core.data.files import json_lines
from llmx.core.eval import answers
from llmx.core.eval.tasks import row_problem
from llmx.core.spec import TaskSpec
from llmx.errors import UsageError


def spec(path: str, answer_pattern: str | None, delimiter: str = " ") -> TaskSpec:
    located = list(json_lines(path))
    if not located:
        raise UsageError(f"{path}: no rows")
    loaded = [row for _, row in located]
    kind = "choice" if "choices" in loaded[0] else "generate"
    for where, row in located:
        problem = row_problem(row, kind) or (None if kind == "choice" or isinstance(row.get("answer"), str)
                                              else "a generate row needs 'answer', the expected text")
        if problem:
            raise UsageError(f"{where}: {problem}")
    return TaskSpec(f"file:{Path(path).name}", rows=lambda split, seed: loaded, kind=kind, splits=("file",),
                    judge=None if kind == "choice" else partial(judge, pattern=answer_pattern),
                    metrics=("accuracy", "accuracy_norm") if kind == "choice" else ("score",),
                    stop=("\n",) if answer_pattern is None else (), max_new_tokens=32, delimiter=delimiter,
                    plugin="tasks")


def judge(row: dict, completion: str, pattern: str | None = None) -> bool:
    return answers.exact_match(answers.extract(completion, pattern), row["answer"])
