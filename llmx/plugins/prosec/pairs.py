"""Pair filtering and the utility mix (the official ``collect_and_upload_fixed_batch.py`` and
``mix_and_upload_original_w_fixed_batch.py``, steps 6 and 7).

A security pair keeps a vulnerable response that shows the scenario's expected CWE and one of its candidate fixes:
of those that parse (``ast.parse``, the paper's tree-sitter check), the tier with no detection at all, else the one
with none of the expected CWE; in it, fixes under half the vulnerable code's length, holding "...", "unchange" or
"no change", or reading a name the vulnerable code leaves undefined are dropped; of the rest the one closest to the
vulnerable code (BLEU over code tokens, CodeBLEU's n-gram part: the minimal edit) is kept. A utility pair's prompt is
the benign original, chosen the model's own parse-able, undetected answer to it, rejected the fixed response written
for the inducing variant (``roles: swapped`` inverts them)."""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from dataclasses import dataclass

from llmx.plugins.prosec.detect import Finding

BANNED = ("...", "unchange", "no change")  # the official keywords ("unchange" covers "unchanged")
TOKEN = re.compile(r"\w+|[^\w\s]")


@dataclass(frozen=True)
class Candidate:
    text: str
    finding: Finding
    source: str  # "model" or "rule"


def overlap(a: str, b: str, n: int = 4) -> float:
    """BLEU of ``a`` against ``b``: the geometric mean of clipped 1..n-gram precisions over code tokens (add-one
    smoothed) times the brevity penalty (CodeBLEU's n-gram component; its syntax and data-flow terms are left out)."""
    x, y = TOKEN.findall(a), TOKEN.findall(b)
    if not x or not y:
        return 0.0
    score = 1.0
    for k in range(1, n + 1):
        gx = Counter(tuple(x[i:i + k]) for i in range(len(x) - k + 1))
        gy = Counter(tuple(y[i:i + k]) for i in range(len(y) - k + 1))
        score *= (sum(min(c, gy[g]) for g, c in gx.items()) + 1) / (sum(gx.values()) + 1)
    brevity = math.exp(1 - len(y) / len(x)) if len(x) < len(y) else 1.0
    return brevity * score ** (1 / n)


def undefined(program: str) -> set[str]:
    """Names a program reads that nothing defines (builtins, parameters, assignments, imports, definitions): a fix
    that reads a name its vulnerable version did not (``json`` with no import) fails when it runs."""
    import ast
    import builtins

    try:
        tree = ast.parse(program)
    except (SyntaxError, ValueError):
        return set()  # a stub detector's "parsed" text that is not Python: nothing to check
    bound = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} - bound


def best_fix(prompt: str, vulnerable: str, cwe: int, candidates: list[Candidate]) -> Candidate | None:
    """The fix step 6 keeps, or None: of the parsed candidates, the tier with no detection at all, else the one with
    none of the expected CWE; in it, the fixes that change something, keep half the vulnerable code's length, hold
    none of the banned words and read no name the vulnerable code leaves undefined; the closest of them."""
    parsed = [c for c in candidates if c.finding.parsed and c.text.strip() != vulnerable.strip()]
    tier = [c for c in parsed if not c.finding.issues] or [c for c in parsed if not c.finding.shows(cwe)]
    known = undefined(prompt + vulnerable)
    ok = [c for c in tier if len(c.text.strip()) >= len(vulnerable.strip()) / 2
          and not any(b in c.text.lower() for b in BANNED) and undefined(prompt + c.text) <= known]
    return max(ok, key=lambda c: overlap(c.text, vulnerable)) if ok else None


def mix(security: list[dict], benign: list[dict], seed: int = 42, roles: str = "paper") -> list[dict]:
    """Security pairs with one utility pair each (its scenario's benign answer drawn at random), shuffled with
    ``seed``; a security pair whose scenario has no usable benign answer is dropped with it, so the mix stays 1:1 (the
    notes' rule; the official script keeps every security pair). ``benign`` rows: ``{prompt, answers, fixed}`` per
    security pair, in order."""
    rng = random.Random(seed)
    rows = []
    for pair, b in zip(security, benign, strict=True):
        if not b["answers"]:
            continue
        own = rng.choice(b["answers"])
        chosen, rejected = (own, b["fixed"]) if roles == "paper" else (b["fixed"], own)
        rows += [pair, {"prompt": b["prompt"], "chosen": chosen, "rejected": rejected, "cwe": pair["cwe"], "benign": True,
                        "seed": pair["seed"]}]
    random.Random(seed).shuffle(rows)
    return rows
