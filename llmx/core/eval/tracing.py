"""A program-tracing task generated in code: two to four assignments over single-digit integers, then a print, in
doctest form (the standard library's docstrings hold thousands of these), the answer being the printed digit::

    >>> b = 7
    >>> a = b - 3
    >>> b = a + b
    ... (values stay in 0..9; an assignment may reuse or overwrite a name)
    >>> print(a)
    4

Each split is a fixed set of programs drawn from its own generator (no program text occurs in two splits); the
``seed`` of ``rows`` only orders it. The judge is exact match of the completion's first line.
"""

from __future__ import annotations

import random

NAMES = "abcdxyz"
SIZES = {"train": 10_000, "validation": 500, "test": 1_000}
_SPLIT_SEEDS = {"test": 0, "validation": 1, "train": 2}


def program(rng: random.Random) -> tuple[str, int]:
    """``(doctest text up to and including the print line, printed value)``."""
    values: dict[str, int] = {}
    lines = []
    for _ in range(rng.randint(2, 4)):
        while True:
            name = rng.choice(NAMES[:4] if values else NAMES)
            terms = [(rng.choice(list(values)), None) if values and rng.random() < 0.7 else (None, rng.randint(0, 9))
                     for _ in range(2)]
            if not values or rng.random() < 0.15:
                terms = [(None, rng.randint(0, 9))]
            elif terms[0][0] is not None and terms[0][0] == terms[1][0]:
                continue  # v - v and v + v: a trivial pattern (v - v is a constant 0)
            op = rng.choice("+-")
            nums = [values[v] if v else c for v, c in terms]
            value = nums[0] if len(nums) == 1 else (nums[0] + nums[1] if op == "+" else nums[0] - nums[1])
            if 0 <= value <= 9:
                break
        text = " ".join([terms[0][0] or str(terms[0][1])] + ([op, terms[1][0] or str(terms[1][1])]
                                                             if len(terms) == 2 else []))
        lines.append(f">>> {name} = {text}")
        values[name] = value
    shown = rng.choice(list(values))
    if values[shown] == 0 and rng.random() < 0.5:  # a difference of equal values is common: keep 0 near 1 in 10
        return program(rng)
    lines.append(f">>> print({shown})")
    return "\n".join(lines) + "\n", values[shown]


def _split(split: str) -> list[dict]:
    taken: set[str] = set()
    for other in sorted(SIZES, key=_SPLIT_SEEDS.get):
        rng = random.Random(f"tracing-{other}")
        out: list[dict] = []
        while len(out) < SIZES[other]:
            text, value = program(rng)
            if text not in taken:
                taken.add(text)
                out.append({"id": f"{other}-{len(out)}", "prompt": text, "answer": str(value),
                            "reference": f"{value}\n"})
        if other == split:
            return out
    raise KeyError(split)


def rows(split: str, seed: int) -> list[dict]:
    out = _split(split)
    random.Random(seed).shuffle(out)
    return out


def judge(row: dict, completion: str) -> bool:
    return completion.split("\n", 1)[0].strip() == row["answer"]
