"""Run a task (``TaskSpec``) on a model: its rows, the model's completions or choices, the judge's scores, and the
metrics with bootstrap intervals over prompts.

A generate task's score is the judge's mean over a prompt's samples, then over prompts; ``pass@k`` is the unbiased
estimator over the ``n`` samples of each prompt (a score of 1 or more passes). A judge that raises scores 0 for that
completion, is recorded with its error, and counted in ``judge_errors``; the run goes on. A choice task's
``accuracy`` picks the choice of highest summed log-likelihood, ``accuracy_norm`` the highest per character.
"""

from __future__ import annotations

import contextvars
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from llmx.core.eval import sandbox, stats
from llmx.core.eval.generate import Completion, generate
from llmx.core.eval.sandbox import cancelling_pool
from llmx.core.eval.score import choose, continuation_logprobs, move_whitespace, token_logprobs
from llmx.core.spec import TaskSpec
from llmx.errors import CannotRun, UsageError

PASS = 1.0


@dataclass(frozen=True)
class Decoding:
    samples: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    stop: tuple[str, ...] = ()
    include_stop: bool = False
    seed: int = 0
    batch_size: int = 8


@dataclass
class TaskResult:
    metrics: dict[str, Any]
    records: list[dict]  # one per row: what the model produced and how it was judged
    scores: list[float]  # one per row, for paired comparisons
    completions: list[list[Completion]] = field(default_factory=list)


def rows(spec: TaskSpec, split: str, seed: int, limit: int | None = None) -> list[dict]:
    """The task's rows for ``split`` (the first ``limit``), each checked for the fields its kind needs."""
    if split not in spec.splits:
        raise UsageError(f"task '{spec.name}' has no split '{split}' (it has: {', '.join(spec.splits)})")
    out = list(spec.load_rows()(split, seed))[:limit]
    for i, row in enumerate(out):
        problem = row_problem(row, spec.kind)
        if problem:
            raise UsageError(f"task '{spec.name}', {split} row {i}: {problem}")
    return out


def row_problem(row: Any, kind: str) -> str | None:
    if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
        return "a row must be an object with a string 'prompt'"
    if "reference" in row and not isinstance(row["reference"], str):
        return "'reference' must be a string"
    if kind == "choice":
        choices, answer = row.get("choices"), row.get("answer")
        if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, str) for c in choices):
            return "a choice row needs 'choices', a list of two or more strings"
        if not isinstance(answer, int) or isinstance(answer, bool) or not 0 <= answer < len(choices):
            return f"'answer' must be the index of the right choice (0..{len(choices) - 1})"
    return None


def run(spec: TaskSpec, model, tok, task_rows: Sequence[dict], decoding: Decoding, *, judge_workers: int | None = None,
        resamples: int = 1000, ks: Sequence[int] = (1,), progress: Callable = lambda x, **_: x,
        unconfined: bool = False) -> TaskResult:
    """Evaluate ``model`` on ``task_rows``. A task that runs code is refused (exit 3) before any generation where
    the sandbox cannot confine it, unless ``unconfined`` (the user's explicit, unsafe choice)."""
    if spec.runs_code:
        sandbox.check(unconfined)
    if spec.kind == "generate" and max(ks) > decoding.samples:
        raise UsageError(f"pass@{max(ks)} needs at least {max(ks)} samples per prompt (samples is {decoding.samples})")
    if spec.kind == "choice":
        result = _choice(spec, model, tok, task_rows, decoding, progress)
    else:
        with sandbox.allow_unconfined(unconfined):
            result = _generate(spec, model, tok, task_rows, decoding, judge_workers, ks, progress)
    key = "accuracy" if spec.kind == "choice" else "score"
    low, high = stats.bootstrap_ci(result.scores, resamples, seed=decoding.seed)
    result.metrics.update({f"{key}_ci_low": low, f"{key}_ci_high": high, "prompts": len(task_rows)})
    result.metrics.update(reference_nll(model, tok, task_rows, decoding.batch_size, progress))
    return result


def _generate(spec, model, tok, task_rows, d: Decoding, judge_workers, ks, progress) -> TaskResult:
    completions = generate(model, tok, [r["prompt"] for r in task_rows], max_new_tokens=d.max_new_tokens,
                           samples=d.samples, temperature=d.temperature, top_p=d.top_p, stop=d.stop,
                           include_stop=d.include_stop, seed=d.seed, batch_size=d.batch_size, progress=progress)
    judge = spec.load_judge()
    jobs = [(row, c.text) for row, cs in zip(task_rows, completions, strict=True) for c in cs]
    context = contextvars.copy_context()  # each judge runs in a copy of it: the sandbox's settings go with it
    with cancelling_pool(judge_workers or 1) as pool:
        judged = list(progress(pool.map(lambda job: context.copy().run(judge_one, judge, *job), jobs), total=len(jobs),
                               description="judging"))
    records, scores, passes, errors = [], [], [], 0
    for i, (row, cs) in enumerate(zip(task_rows, completions, strict=True)):
        mine = judged[i * d.samples:(i + 1) * d.samples]
        errors += sum(e is not None for _, e, _ in mine)
        scores.append(sum(s for s, _, _ in mine) / len(mine))
        passes.append(sum(s >= PASS for s, _, _ in mine))
        records.append({"id": row.get("id", i), "prompt": row["prompt"], "score": scores[-1],
                        "completions": [c.text for c in cs], "scores": [s for s, _, _ in mine], "errors": [e for _, e, _ in mine],
                        "notes": [n for _, _, n in mine], "stop": [c.stop for c in cs]})
    flat = [c for cs in completions for c in cs]
    metrics: dict[str, Any] = {"score": stats.mean(scores), "completions": len(flat), "judge_errors": errors,
                               "finished_rate": stats.mean([c.stop is not None for c in flat]),
                               "prompts_truncated": sum(cs[0].truncated for cs in completions)}
    for k in ks:
        metrics[f"pass@{k}"] = stats.mean([stats.pass_at_k(d.samples, c, k) for c in passes])
    return TaskResult(metrics, records, scores, completions)


def judge_one(judge, row: dict, completion: str) -> tuple[float, str | None, str]:
    """``(score, error, note)``: a judge returns a score, or ``(score, note)`` to say why (kept in the records)."""
    try:
        value = judge(row, completion)
        value, note = value if isinstance(value, tuple) else (value, "")
        score = float(value)
        if math.isnan(score):
            raise ValueError(f"the judge returned {value!r}")
        return score, None, str(note)
    except CannotRun:  # the machine cannot run this judge at all: not one row's result
        raise
    except Exception as exc:  # noqa: BLE001 - a judge's failure on one row is that row's result
        return 0.0, f"{type(exc).__name__}: {exc}", ""


def _choice(spec, model, tok, task_rows, d: Decoding, progress) -> TaskResult:
    pairs = [(row["prompt"], spec.delimiter + c) for row in task_rows for c in row["choices"]]
    scored = iter(continuation_logprobs(model, tok, pairs, d.batch_size, progress))
    records, right, right_norm = [], [], []
    for i, row in enumerate(task_rows):
        mine = [next(scored) for _ in row["choices"]]
        pred, pred_norm = choose(mine, row["choices"])
        right.append(float(pred == row["answer"]))
        right_norm.append(float(pred_norm == row["answer"]))
        records.append({"id": row.get("id", i), "prompt": row["prompt"], "choices": row["choices"],
                        "answer": row["answer"], "logprobs": [s.logprob for s in mine], "pred": pred,
                        "pred_norm": pred_norm, "correct": bool(right[-1]), "score": right[-1]})
    return TaskResult({"accuracy": stats.mean(right), "accuracy_norm": stats.mean(right_norm)}, records, right)


def reference_nll(model, tok, task_rows: Sequence[dict], batch_size: int, progress: Callable) -> dict[str, float]:
    """NLL of the rows' reference completions (per token, and in bits per UTF-8 byte, comparable across tokenizers);
    empty when no row has one."""
    refs = [(r["prompt"], r["reference"]) for r in task_rows if r.get("reference")]
    if not refs:
        return {}
    scored = continuation_logprobs(model, tok, refs, batch_size, progress)
    nll = -sum(s.logprob for s in scored)
    tokens = sum(s.tokens for s in scored)
    size = sum(len(move_whitespace(*pair)[1].encode("utf-8")) for pair in refs)  # the text actually scored
    return {"reference_nll_per_token": nll / max(tokens, 1), "reference_bpb": nll / math.log(2) / max(size, 1)}


def drift(model, tok, reference, reference_tok, task_rows: Sequence[dict], completions: list[list[Completion]],
          batch_size: int, progress: Callable, resamples: int = 1000, seed: int = 0) -> tuple[dict[str, Any], list[float]]:
    """Monte-Carlo KL(model || reference) on the model's own samples, and its value per prompt.

    With a shared vocabulary the estimate is token level: the summed ``log p_model - log p_reference`` of the tokens
    each completion was sampled as (the prompt's tokens as the model saw them; the token that held the stop string
    and a sampled EOS included), an unbiased estimate of the KL between the two sampling processes at temperature 1.
    A reference with another tokenizer scores the completion's text instead (each model encodes it its own way; what
    follows a cut stop string is not scored), a cruder estimate. The interval is a bootstrap over prompts."""
    shared = tok.get_vocab() == reference_tok.get_vocab()
    if shared:
        seqs = [(tok(row["prompt"])["input_ids"][-c.prompt_tokens:] if c.prompt_tokens else [], list(c.ids))
                for row, cs in zip(task_rows, completions, strict=True) for c in cs]
        mine = token_logprobs(model, tok, seqs, batch_size, progress)
        theirs = token_logprobs(reference, reference_tok, seqs, batch_size, progress)
    else:
        pairs = [(row["prompt"], c.text) for row, cs in zip(task_rows, completions, strict=True) for c in cs]
        mine = continuation_logprobs(model, tok, pairs, batch_size, progress)
        theirs = continuation_logprobs(reference, reference_tok, pairs, batch_size, progress)
    ratios = iter([a.logprob - b.logprob for a, b in zip(mine, theirs, strict=True)])
    per_prompt = [sum(next(ratios) for _ in cs) / max(len(cs), 1) for cs in completions]
    low, high = stats.bootstrap_ci(per_prompt, resamples, seed=seed)
    total = sum(p * len(cs) for p, cs in zip(per_prompt, completions, strict=True))
    return {"kl_from_reference": stats.mean(per_prompt), "kl_ci_low": low, "kl_ci_high": high,
            "kl_per_token": total / max(sum(a.tokens for a in mine), 1), "kl_level": "tokens" if shared else "text"}, \
        per_prompt
