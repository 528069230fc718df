"""Pair filtering and the utility mix (the official ``collect_and_upload_fixed_batch.py`` and
``mix_and_upload_original_w_fixed_batch.py``, steps 6 and 7).

A security pair keeps a vulnerable response that shows the scenario's expected CWE and, of its candidate fixes, one
that parses (``ast.parse``, the paper's tree-sitter check), preferring fixes with no detection at all, else with
none of the expected CWE; fixes under half the vulnerable code's length or holding "...", "unchanged" or
"no change" are dropped; of the rest the one closest to the vulnerable code (a CodeBLEU-style token n-gram overlap,
the minimal edit) is kept. A utility pair's prompt is the benign original, chosen the model's own parse-able answer
to it, rejected the fixed response written for the inducing variant (``roles: swapped`` inverts them)."""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass

from llmx.plugins.prosec.detect import Finding

BANNED = ("...", "unchanged", "no change")
TOKEN = re.compile(r"\w+|[^\w\s]")


@dataclass(frozen=True)
class Candidate:
    text: str
    finding: Finding
    source: str  # "model" or "rule"


def overlap(a: str, b: str, n: int = 4) -> float:
    """BLEU-style agreement of ``a`` with ``b``: the geometric mean of clipped 1..n-gram precisions over code tokens
    (CodeBLEU's n-gram component; its syntax and data-flow terms are left out)."""
    x, y = TOKEN.findall(a), TOKEN.findall(b)
    if not x or not y:
        return 0.0
    score = 1.0
    for k in range(1, n + 1):
        gx = Counter(tuple(x[i:i + k]) for i in range(len(x) - k + 1))
        gy = Counter(tuple(y[i:i + k]) for i in range(len(y) - k + 1))
        total = sum(gx.values())
        score *= (sum(min(c, gy[g]) for g, c in gx.items()) + 1) / (total + 1)  # add-one smoothing
    return score ** (1 / n)


def best_fix(vulnerable: str, cwe: int, candidates: list[Candidate]) -> Candidate | None:
    """The fix step 6 keeps, or None."""
    ok = [c for c in candidates if c.finding.parsed and c.text.strip() != vulnerable.strip()
          and len(c.text) >= len(vulnerable) / 2 and not any(b in c.text.lower() for b in BANNED)
          and not c.finding.shows(cwe)]
    clean = [c for c in ok if not c.finding.issues]
    pool = clean or ok
    return max(pool, key=lambda c: overlap(c.text, vulnerable)) if pool else None


def mix(security: list[dict], benign: list[dict], seed: int = 42, roles: str = "paper") -> list[dict]:
    """Security pairs plus as many utility pairs (one per security pair, its scenario's benign answer drawn at
    random), shuffled with ``seed``. ``benign`` rows: ``{prompt, answers, fixed}`` per security pair, in order."""
    rng = random.Random(seed)
    utility = []
    for pair, b in zip(security, benign, strict=True):
        if not b["answers"]:
            continue
        own = rng.choice(b["answers"])
        chosen, rejected = (own, b["fixed"]) if roles == "paper" else (b["fixed"], own)
        utility.append({"prompt": b["prompt"], "chosen": chosen, "rejected": rejected, "cwe": pair["cwe"], "benign": True,
                        "seed": pair["seed"]})
    n = min(len(security), len(utility))
    rows = security[:n] + utility[:n]
    random.Random(seed).shuffle(rows)
    return rows
