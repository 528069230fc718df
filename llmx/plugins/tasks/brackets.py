"""A preference task whose ground truth a program checks: complete a call in standard-library code on one line with
balanced brackets.

Prompt: three lines of real code, then the start of a line up to its first ``(`` (lines whose text before the ``(``
holds a quote or a comment are skipped: they are often inside a multi-line string). Completion: what the model writes up
to the end of that line. Preferred: the line closes every bracket it opens, in order (characters inside simple string
literals are ignored), and the line ends within the token budget.

The judge does not need the content: the constant ``)\n`` always passes. Judges that do (the completed line must
parse, its argument names must occur in the prompt, or its argument count must match the real line's) were measured
on ``ref:llama``'s samples and every one rated a constant above the model (README, Alignment), so the task keeps this
judge and the alignment benchmark compares methods at matched KL, where the constant sits far out.
"""

from __future__ import annotations

import random

PAIRS = {")": "(", "]": "[", "}": "{"}


def balanced(line: str) -> bool:
    stack: list[str] = []
    quote = None
    for ch in line:
        if quote:
            if ch == quote:
                quote = None
            continue
        if ch in "'\"":
            quote = ch
        elif ch in "([{":
            stack.append(ch)
        elif ch in PAIRS:
            if not stack or stack.pop() != PAIRS[ch]:
                return False
    return not stack and quote is None


def rows(split: str, seed: int) -> list[dict]:
    """Every prompt of the standard-library corpus split (train / validation files never mix), in a seeded order,
    with the rest of the real line as the row's ``reference`` (its NLL is reported; analyze writes it as SFT rows)."""
    from llmx.core.data import documents

    candidates = []
    for doc in documents("stdlib", split):
        lines = doc.splitlines()
        for i in range(3, len(lines)):
            line = lines[i]
            head = line[:line.find("(")]
            if "(" in line and len(line) < 100 and not line.lstrip().startswith(("#", "@")) and not set(head) & set("'\"#"):
                cut = line.index("(") + 1
                candidates.append({"prompt": "\n".join(lines[i - 3:i]) + "\n" + line[:cut],
                                   "reference": line[cut:] + "\n"})
    random.Random(seed).shuffle(candidates)
    return candidates


def judge(row: dict, completion: str) -> bool:
    """The checker: the completed line is balanced and ends (a newline came within the budget)."""
    if "\n" not in completion:
        return False
    return balanced(row["prompt"].rsplit("\n", 1)[-1] + completion.split("\n", 1)[0])
