"""Decoding prompts through the interpreter and measuring it (notes §2, "Speed metrics"): per response the steps
(forwards after the prefill), the tokens (tags counted), the promises and their length gaps, whether the assembled
source parses, the wall-clock; over the run the geometric-mean theoretical speedup (plain tokens / steps: tags cost
steps) and the time per step against the threads it fed."""

from __future__ import annotations

import ast
import math
import statistics
import time
from collections import defaultdict
from typing import Any

from llmx.core.data.files import json_lines
from llmx.core.eval.items import FIELD, item_id
from llmx.errors import UsageError
from llmx.plugins.pasta import interpreter as I
from llmx.plugins.pasta import lang, layout


def load_prompts(path: str) -> list[dict[str, Any]]:
    """Rows with a string ``prompt`` (annotated rows or bare prompts); a bad line is a ``UsageError`` naming it."""
    rows = []
    for where, row in json_lines(path):
        if not isinstance(row.get("prompt"), str):
            raise UsageError(f"{where}: a row needs a string 'prompt'")
        rows.append(row)
    if not rows:
        raise UsageError(f"{path}: no prompts")
    return rows


def parses(prompt: str, plain: str) -> bool:
    try:
        ast.parse(prompt + plain)
    except (SyntaxError, ValueError):
        return False
    return True


def one(model, tok, tags: dict[str, int], prompt: str, opts: I.Options, repeats: int = 1) -> dict[str, Any]:
    """One prompt decoded (``positions: oracle``: twice, the second pass at the first pass's true chunk lengths)."""
    ids = layout.encode(tok, prompt, prompt=True)

    def go(o: I.Options) -> tuple[I.Result, float]:
        t0 = time.perf_counter()
        res = I.run(model, ids, tags, tok.decode, tok.eos_token_id, o)
        return res, time.perf_counter() - t0

    if opts.positions == "oracle":
        first, _ = go(I.Options(**{**vars(opts), "positions": "predicted"}))
        opts = I.Options(**{**vars(opts), "lengths": [len(c) for c in first.chunks]})
    res, wall = go(opts)
    walls = [go(opts)[1] for _ in range(repeats - 1)] or [wall]  # above 1 repeat, the first is the warm-up
    text = tok.decode(res.response)
    plain, plain_tokens = plain_of(tok, tags, res.response)
    return {"prompt": prompt, "response": text, "plain": plain, "parses": parses(prompt, plain), "steps": res.steps,
            "tokens": res.tokens, "plain_tokens": plain_tokens, "capped": res.ended == "cap",
            "promises": len(res.chunks), "length_gaps": res.length_gaps, "errors": res.errors,
            "wall_s": statistics.median(walls), "step_ms": _per_active(res)}


def plain_of(tok, tags: dict[str, int], response: list[int]) -> tuple[str, int]:
    """A response's text without its tags (by the parser; an unfinished promise or chunk: tag tokens dropped) and
    how many of its tokens are not tags."""
    kept = [t for t in response if t not in set(tags.values())]
    try:
        return lang.strip(tok.decode(response)), len(kept)
    except lang.PastaSyntaxError:
        return tok.decode(kept), len(kept)


def _per_active(res: I.Result) -> dict[int, list[float]]:
    out: dict[int, list[float]] = defaultdict(list)
    for n, s in zip(res.active, res.step_seconds, strict=True):
        out[n].append(1000 * s)
    return out


def speedup(plain_tokens: int, steps: int) -> float:
    """The theoretical speedup: the response's tokens without its tags (what sequential decoding would emit) over
    the interpreter's steps (tag tokens cost steps); 1 for an empty response."""
    return max(plain_tokens, 1) / max(steps, 1)


def geomean(xs) -> float:
    return math.exp(statistics.fmean(math.log(x) for x in xs))


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Run figures: geometric means of the theoretical speedup, rates, and median ms per step by active threads."""
    per: dict[int, list[float]] = defaultdict(list)
    for r in rows:
        for n, ms in r.pop("step_ms").items():
            per[n] += ms
    gaps = [abs(g) for r in rows for g in r["length_gaps"]]
    return {"rows": len(rows),
            "speedup_theoretical_geomean": geomean(speedup(r["plain_tokens"], r["steps"]) for r in rows),
            "steps_mean": statistics.fmean(r["steps"] for r in rows),
            "tokens_mean": statistics.fmean(r["tokens"] for r in rows),
            "parse_rate": statistics.fmean(r["parses"] for r in rows),
            "capped_rate": statistics.fmean(r["capped"] for r in rows),
            "promises_per_response": statistics.fmean(r["promises"] for r in rows),
            "length_error_mean": statistics.fmean(gaps) if gaps else None,
            "responses_with_errors": sum(bool(r["errors"]) for r in rows),
            "wall_s_median": statistics.median(r["wall_s"] for r in rows),
            "ms_per_step_by_threads": {str(n): statistics.median(v) for n, v in sorted(per.items())}}


def judge_nll(judge, judge_tok, rows: list[dict[str, Any]], batch_size: int = 8) -> list[float | None]:
    """Per-token NLL of each plain response given its prompt under ``judge`` (None for an empty response)."""
    from llmx.core.eval.score import continuation_logprobs

    scored = continuation_logprobs(judge, judge_tok, [(r["prompt"], r["plain"]) for r in rows], batch_size)
    return [-s.logprob / s.tokens if s.tokens else None for s in scored]


def judge_end_nll(judge, judge_tok, prompts: list[str]) -> list[float]:
    """The judge's NLL of ending the response at once (its EOS right after the prompt): what an empty response scores
    among the per-prompt items ``llmx compare pasta`` pairs, where ``judge_nll`` has no tokens to average."""
    from llmx.core.eval.score import token_logprobs

    scored = token_logprobs(judge, judge_tok, [(judge_tok(q)["input_ids"], [judge_tok.eos_token_id]) for q in prompts])
    return [-s.logprob for s in scored]


def items(rows: list[dict[str, Any]], end_nll: dict[int, float] | None = None) -> list[dict[str, Any]]:
    """One row per prompt (``prompts.jsonl``, the items ``llmx compare pasta`` pairs across arms on the same
    prompts; ``item``: the digest of the prompt's place, name and text): steps, theoretical speedup, whether it
    parses, whether it hit the budget, and with a judge its ``judge_nll`` (an empty response: ``end_nll``, the judge's
    NLL of ending at once; ``empty`` says which)."""
    out = []
    for i, r in enumerate(rows):
        row = {FIELD: item_id(i, r.get("name"), r["prompt"]), "prompt": i, "steps": r["steps"],
               "speedup": speedup(r["plain_tokens"], r["steps"]),
               "parses": float(r["parses"]), "capped": r["capped"]}
        if "judge_nll" in r:
            empty = r["judge_nll"] is None
            row.update(judge_nll=(end_nll or {})[i] if empty else r["judge_nll"], empty=empty)
        out.append(row)
    return out
