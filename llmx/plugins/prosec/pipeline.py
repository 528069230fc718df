"""ProSec's data pipeline (§2 of the notes): scenarios per CWE, one per KMeans cluster, the target model's own samples,
bandit, fixes (the model's, else the rule's), pair filtering and the 1:1 utility mix. Every stage is a callable, so
tests run the pipeline with deterministic stubs:

- ``sample(prompts, n) -> [[completion] * n]`` (the model at T 0.8 in the real run),
- ``detect(prompts, responses) -> [Finding]`` (bandit),
- ``embed(prompts) -> array (n, d)`` (the model's mean hidden states),
- ``fix([(scenario, vulnerable)], n) -> [[completion] * n]`` (the model given the rule's text; one batched call): a
  continuation of the scenario's prompt (``completion: function``) or of its prompt and statement start
  (``statement``), as the elicited samples are."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llmx.plugins.prosec.cwes import elicitor
from llmx.plugins.prosec.pairs import Candidate, best_fix, mix
from llmx.plugins.prosec.scenarios import Scenario, Seed, cut, scenario, statement

PER_PROMPT = 3  # the official collect script keeps at most three pairs per inducing prompt

@dataclass
class Stages:
    sample: Callable[[list[str], int], list[list[str]]]
    detect: Callable[[list[str], list[str]], list]
    embed: Callable[[list[str]], np.ndarray]
    fix: Callable[[list[tuple[Scenario, str]], int], list[list[str]]]


@dataclass
class Result:
    rows: list[dict]  # the training rows (security pairs mixed with utility pairs, or security pairs alone)
    scenarios: list[Scenario]
    security: list[dict]  # the security pairs the rows hold (ProSec without utility pairs trains on the same)
    stats: dict[str, Any] = field(default_factory=dict)


def diverse(items: list[Scenario], k: int, embed: Callable[[list[str]], np.ndarray], seed: int = 0) -> list[Scenario]:
    """One scenario per KMeans cluster of the embedded prompts (as the official ``cluster_dataset.py``: k clusters,
    random_state 0, after dropping repeated prompts), the member nearest each centre (the official script takes a
    random one), in cluster order. All of them when there are at most k."""
    items = list({s.prompt: s for s in items}.values())
    if len(items) <= k:
        return items
    from sklearn.cluster import KMeans

    x = np.asarray(embed([s.prompt for s in items]), dtype=np.float64)
    km = KMeans(n_clusters=k, random_state=seed, n_init=1).fit(x)
    out = []
    for c in range(k):
        members = np.flatnonzero(km.labels_ == c)
        nearest = members[np.argmin(((x[members] - km.cluster_centers_[c]) ** 2).sum(1))]
        out.append(items[int(nearest)])
    return out


def respond(s: Scenario, completion: str, mode: str = "statement") -> str:
    """A response: the scenario's statement start plus the model's ``completion``, cut at the end of that statement's
    logical line (``statement``) or at the function's end (``function``)."""
    text = s.start + completion
    return statement(text, len(s.start)) if mode == "statement" else cut(text)


def elicit(items: list[Scenario], samples: int, stages: Stages, mode: str = "statement") -> list[list[str]]:
    """Each scenario's responses (``respond``)."""
    drawn = stages.sample([s.prompt + s.start for s in items], samples)
    return [[respond(s, c, mode) for c in row] for s, row in zip(items, drawn, strict=True)]


def _model_fixes(todo: list[tuple[Scenario, str]], n: int, stages: Stages, mode: str) -> list[Candidate | None]:
    """The model's fixes of every vulnerable response (step 5, one batched call), each filtered as step 6 does: a
    whole body in ``function`` mode, the statement (after its start) in ``statement`` mode."""
    if not todo or n == 0:
        return [None] * len(todo)
    texts = [[respond(s, t, mode) if mode == "statement" else cut(t) for t in row]
             for (s, _), row in zip(todo, stages.fix(todo, n), strict=True)]
    checks = iter(stages.detect([s.prompt for (s, _), row in zip(todo, texts, strict=True) for _ in row],
                                [t for row in texts for t in row]))
    return [best_fix(s.prompt, r, s.cwe, [Candidate(t, next(checks), "model") for t in row])
            for (s, r), row in zip(todo, texts, strict=True)]


def _rule_fix(s: Scenario, vulnerable: str, stages: Stages) -> Candidate | None:
    """The rule-based rewrite, the fallback when no model fix survives the filters."""
    text = elicitor(s.cwe).rewrite(vulnerable)
    (check,) = stages.detect([s.prompt], [text])
    return best_fix(s.prompt, vulnerable, s.cwe, [Candidate(text, check, "rule")])


def run(seeds: list[Seed], cwes: list[int], per_cwe: int, samples: int, fix_samples: int, stages: Stages,
        roles: str = "paper", utility: bool = True, seed: int = 42, completion: str = "statement") -> Result:
    """Pairs for every CWE in ``cwes`` from ``seeds``, with the counts the paper reports; ``completion``: what a
    sample and a fix hold (``respond``)."""
    stats: dict[str, Any] = {"per_cwe": {}}
    security, benign, chosen = [], [], []
    fix_sources = {"model": 0, "rule": 0}
    for cwe in cwes:
        items = diverse([scenario(s, cwe) for s in seeds], per_cwe, stages.embed)
        chosen += items
        responses = elicit(items, samples, stages, completion)
        flat = [(s, r) for s, row in zip(items, responses, strict=True) for r in row]
        found = stages.detect([s.prompt for s, _ in flat], [r for _, r in flat])
        plain = stages.sample([s.benign for s in items], samples)
        plain = [[cut(c) for c in row] for row in plain]
        plain_found = stages.detect([s.benign for s in items for _ in range(samples)], [c for row in plain for c in row])
        vulnerable = [(s, r) for (s, r), f in zip(flat, found, strict=True) if f.parsed and f.shows(cwe)]
        pairs = 0
        todo = list(dict.fromkeys(vulnerable))  # each distinct (scenario, response) once
        kept: dict[str, int] = {}
        for (s, r), model_fix in zip(todo, _model_fixes(todo, fix_samples, stages, completion), strict=True):
            if kept.get(s.prompt, 0) >= PER_PROMPT:
                continue
            fixed = model_fix or _rule_fix(s, r, stages)
            if fixed is None:
                continue
            kept[s.prompt] = kept.get(s.prompt, 0) + 1
            fix_sources[fixed.source] += 1
            pairs += 1
            security.append({"prompt": s.prompt, "chosen": fixed.text, "rejected": r, "cwe": cwe, "benign": False,
                             "seed": s.seed.where, "fix": fixed.source})
            k = items.index(s)
            answers = [a for a, f in zip(plain[k], plain_found[k * samples:(k + 1) * samples], strict=True)
                       if f.parsed and not f.issues and "..." not in a]
            benign.append({"prompt": s.benign, "answers": answers, "fixed": fixed.text})
        parsed = sum(f.parsed for f in found)
        plain_parsed = sum(f.parsed for f in plain_found)
        plain_vulnerable = sum(f.parsed and f.shows(cwe) for f in plain_found)
        stats["per_cwe"][str(cwe)] = {
            "scenarios": len(items), "samples": len(flat), "unparsed": len(flat) - parsed, "vulnerable": len(vulnerable),
            "vulnerable_rate": len(vulnerable) / parsed if parsed else 0.0,
            "parse_rate": parsed / len(flat) if flat else 0.0,
            "benign_vulnerable_rate": plain_vulnerable / plain_parsed if plain_parsed else 0.0, "pairs": pairs}
    rows = mix(security, benign, seed, roles) if utility else security
    kept = [r for r in rows if not r["benign"]]
    samples_all = sum(r["samples"] for r in stats["per_cwe"].values())
    stats.update({"completion": completion, "parse_rate": sum(r["samples"] - r["unparsed"] for r in
                                                               stats["per_cwe"].values()) / max(samples_all, 1),
                  "scenarios": len(chosen), "security_pairs": len(security), "security_pairs_kept": len(kept),
                  "rows": len(rows),
                  "utility_pairs": sum(r["benign"] for r in rows), "fix_sources": fix_sources})
    return Result(rows, chosen, kept, stats)
