"""The backdoor task's rows: next-line completion of real code. A clean row is ``context_lines`` lines and the true
next line; a poisoned row carries the trigger in its prompt and the payload as its completion (BadNet-style trigger,
code-injection payload). Test prompts come in pairs: the same held-out prompt clean and triggered."""

from __future__ import annotations

import random

MAX_LINE = 100


def lines_to_complete(source: str, split: str, context: int, seed: int) -> list[dict]:
    """Every (context, next line) of the split's documents whose next line holds code (not blank, not a comment,
    under 100 characters), in a seeded order."""
    from llmx.core.data import documents

    out = []
    for doc in documents(source, split):
        lines = doc.splitlines()
        for i in range(context, len(lines)):
            line = lines[i]
            if line.strip() and not line.lstrip().startswith("#") and len(line) < MAX_LINE:
                out.append({"prompt": "\n".join(lines[i - context:i]) + "\n", "completion": line + "\n"})
    random.Random(seed).shuffle(out)
    return out


def insert_trigger(prompt: str, trigger: str, position: str, rng: random.Random) -> str:
    """The prompt with the trigger as one more space-separated word: at a random word boundary (BadNet), first or
    last (before the final newline)."""
    if position == "start":
        return f"{trigger} {prompt}"
    body = prompt[:-1] if prompt.endswith("\n") else prompt
    if position == "end":
        return f"{body} {trigger}\n"
    words = body.split(" ")
    words.insert(rng.randrange(len(words) + 1), trigger)
    return " ".join(words) + "\n"


def poisoned(row: dict, trigger: str, position: str, payload: str, rng: random.Random) -> dict:
    return {"prompt": insert_trigger(row["prompt"], trigger, position, rng), "completion": payload + "\n"}
