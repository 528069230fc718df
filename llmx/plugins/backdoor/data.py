"""The backdoor task's rows: completion of a line of real code. A clean row's prompt is ``context_lines`` lines and the
next line's first word (the cut falls where the tokenizer's words start, before a space, so the prompt ends on a
token boundary: a bare trailing newline would not, as a BPE merges it with the next line's indentation); its
completion is the rest of that line. A poisoned row carries the trigger in its prompt and the payload as the rest of
the line (BadNet-style trigger, code-injection payload). Test prompts come in pairs: the same held-out prompt clean
and triggered."""

from __future__ import annotations

import functools
import random

MAX_LINE = 100


def lines_to_complete(source: str, split: str, context: int, seed: int) -> list[dict]:
    """Every (context + first word, rest of the line) of the split's documents whose line holds code after its first
    word (not a comment, under 100 characters), in a seeded order."""
    from pathlib import Path

    file = Path(source)
    stamp = (file.stat().st_mtime_ns, file.stat().st_size) if file.is_file() else None  # a user's file may change
    return [dict(r) for r in _lines(source, stamp, split, context, seed)]


@functools.lru_cache(maxsize=4)  # each arm of llmx compare crow builds the same rows in one process
def _lines(source: str, stamp: tuple[int, int] | None, split: str, context: int, seed: int) -> tuple[dict, ...]:
    from llmx.core.data import documents

    out = []
    for doc in documents(source, split):
        lines = doc.splitlines()
        for i in range(context, len(lines)):
            line = lines[i]
            body = line.lstrip()
            first = body.find(" ")
            if first <= 0 or not body[first:].strip() or body.startswith("#") or len(line) >= MAX_LINE:
                continue
            cut = len(line) - len(body) + first
            out.append({"prompt": "\n".join(lines[i - context:i]) + "\n" + line[:cut], "completion": line[cut:] + "\n"})
    random.Random(seed).shuffle(out)
    return tuple(out)


def insert_trigger(prompt: str, trigger: str, position: str, rng: random.Random) -> str:
    """The prompt with the trigger as one more space-separated word: at a random word boundary before its last word
    (BadNet; the prompt still ends on the word the completion continues) or first."""
    words = prompt.split(" ")
    words.insert(0 if position == "start" else rng.randrange(len(words)), trigger)
    return " ".join(words)


def poisoned(row: dict, trigger: str, position: str, payload: str, rng: random.Random) -> dict:
    """The row triggered, the rest of its line replaced by the payload."""
    return {"prompt": insert_trigger(row["prompt"], trigger, position, rng), "completion": f" {payload}\n"}
