"""A preference task whose ground truth a program checks: complete a call in standard-library code on one line with
balanced brackets.

Prompt: three lines of real code, then the start of a line up to its first ``(`` (lines whose text before the ``(``
holds a quote or a comment are skipped: they are often inside a multi-line string). Completion: what the model writes up
to the end of that line. Preferred: the line closes every bracket it opens, in order (characters inside simple string
literals are ignored), and the line ends within the token budget.
"""

from __future__ import annotations

import random

import torch

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


def prompts(split: str, n: int, seed: int) -> list[str]:
    """``n`` prompts from the standard-library corpus split (train / validation files never mix)."""
    from llmx.core.data import documents

    candidates = []
    for doc in documents("stdlib", split):
        lines = doc.splitlines()
        for i in range(3, len(lines)):
            line = lines[i]
            head = line[:line.find("(")]
            if "(" in line and len(line) < 100 and not line.lstrip().startswith(("#", "@")) and not set(head) & set("'\"#"):
                candidates.append("\n".join(lines[i - 3:i]) + "\n" + line[:line.index("(") + 1])
    rng = random.Random(seed)
    return rng.sample(candidates, min(n, len(candidates)))


def judge(prompt: str, completion: str) -> bool:
    """The checker: the completed line is balanced and ends (a newline came within the budget)."""
    if "\n" not in completion:
        return False
    return balanced(prompt.rsplit("\n", 1)[-1] + completion.split("\n", 1)[0])


def cut(completion: str) -> str:
    """A completion up to and including its first newline (the rest is another line)."""
    head, sep, _ = completion.partition("\n")
    return head + sep


@torch.no_grad()
def sample(model, tok, prompt_list: list[str], k: int, max_new_tokens: int, temperature: float, seed: int,
           progress=lambda x, **_: x) -> list[list[str]]:
    """``k`` sampled completions per prompt (one prompt at a time, so any architecture works; seeded per prompt)."""
    out = []
    device = next(model.parameters()).device
    for i, prompt in enumerate(progress(prompt_list, description="sampling")):
        enc = tok(prompt, return_tensors="pt").to(device)  # with BOS where the tokenizer adds one, as in training
        torch.manual_seed(seed * 100_003 + i)
        gen = model.generate(**enc, do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
                             max_new_tokens=max_new_tokens, num_return_sequences=k, pad_token_id=tok.pad_token_id)
        out.append([cut(tok.decode(row[enc["input_ids"].shape[1]:], skip_special_tokens=True)) for row in gen])
    return out
