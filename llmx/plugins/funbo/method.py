"""``analyze --method funbo`` evolves an acquisition function and saves it as ``acquisition_function.py``;
``eval --method acquisition`` scores an AF file or a baseline on a function set, paired against another; its
``problems.jsonl`` holds one row per problem with the final normalised regret (the items ``llmx compare`` pairs; their
``item``: the digest of the problem's name, its ``#seed`` instance included, grid size and grid seed)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Any

import numpy as np

from llmx.core import atomic
from llmx.core.context import RunContext
from llmx.core.eval.items import FIELD, item_id
from llmx.core.eval.sandbox import check as confinable
from llmx.errors import MissingRequirement, UsageError, extra_hint
from llmx.plugins.funbo import afs, bo, samplers
from llmx.plugins.funbo import functions as F
from llmx.plugins.funbo.config import SUITES, AcquisitionParams, FunboParams, Protocol
from llmx.plugins.funbo.database import Database
from llmx.plugins.funbo.program import ProgramError, check, key
from llmx.plugins.funbo.sandbox import Limits, Outcome, evaluate
from llmx.plugins.funbo.search import Search, choose

RESULT = "acquisition_function.py"


def names(spec: str, instances: int = 0, first_seed: int = 0) -> list[str]:
    """Problem names of a suite or comma-separated functions (``NAME#SEED``: that seeded instance), each function as
    ``instances`` seeded instances if asked."""
    parts = [p.strip() for p in ",".join(SUITES.get(q.strip(), q.strip()) for q in spec.split(",")).split(",")]
    F.parse_set([p.partition("#")[0] for p in parts])  # every base name exists (or a did-you-mean)
    out = []
    for part in filter(None, parts):
        seed = part.partition("#")[2]
        if "#" in part and not seed.isdigit():
            raise UsageError(f"'{part}': an instance is NAME#SEED with a non-negative integer seed")
        if seed and instances:
            raise UsageError(f"'{part}' is already an instance: instances makes instances of functions")
        out += [f"{part}#{first_seed + i}" for i in range(instances)] if instances else [part]
    return out


def _protocol(p: Protocol) -> dict[str, Any]:
    return {"trials": p.trials, "beta": p.beta, "time_term": p.time_term}


def _specs(ctx: RunContext, problem_names: list[str], p: Protocol) -> list[bo.ProblemSpec]:
    ctx.log.info("funbo: fitting the GP of %d problems", len(problem_names))
    return [bo.spec(n, p.grid_points, p.grid_seed) for n in problem_names]


def _checked(field: str, ref: str) -> str | None:
    """The source of an AF reference (None: random search), refused in one line when it fails the AST check."""
    source = afs.load(ref)
    if source is not None:
        try:
            check(source)
        except ProgramError as e:
            raise UsageError(f"{field} {ref}: {e}") from None
    return source


def _seed_source(ref: str) -> str:
    source = _checked("seed_af", ref)
    if source is None:
        raise UsageError(f"seed_af {ref} is a policy, not a program: give a baseline program or a .py file")
    return source


def analyze(ctx: RunContext, p: FunboParams) -> dict[str, Any]:
    seed = _seed_source(p.seed_af)
    train, validation = names(p.train), names(p.validation)
    if p.resume and not Path(p.resume).is_file():
        raise UsageError(f"resume {p.resume}: no such file")
    confinable(p.unsafe_unconfined)  # exit 3 before a sampler is loaded, where programs cannot be confined
    sampler = samplers.make(p, ctx)
    protocol, limits = _protocol(p), Limits(p.timeout_s, p.memory_mb, p.unsafe_unconfined)
    train_specs = _specs(ctx, train, p)
    kw = {"sampler": sampler, "problems": train_specs, "protocol": protocol, "limits": limits, "workers": p.workers,
          "reset_period": p.reset_period}
    if p.resume:
        search = Search.resume(p.resume, **kw)
    else:
        outcome = evaluate(seed, train_specs, limits=limits, **protocol)
        if not outcome.ok:
            raise UsageError(f"seed_af {p.seed_af} fails on the training functions: {outcome.reason}")
        db = Database(p.islands, p.functions_per_prompt, p.cluster_temperature, p.cluster_period, p.reduce,
                      ctx.config.seed)
        db.register(seed, outcome.scores)
        search = Search(db, **kw)
        search.seen[key(seed)] = outcome
    seed_score = search.db.reduced(search.seen[key(seed)].scores) if key(seed) in search.seen else None
    search.run(p.samples, p.samples_per_prompt, ctx.artifact("database.json"), ctx.progress)
    val_specs = _specs(ctx, validation, p)
    pool = search.evaluated(seed)
    best, best_val, rows = choose(pool, p.top_share, val_specs, protocol, limits, p.workers)
    seed_val = evaluate(seed, val_specs, limits=limits, **protocol)
    atomic.write_text(ctx.artifact(RESULT), _result_file(best.source, sampler.label, best.score, best_val))
    atomic.write_json(ctx.artifact("selection.json"), rows)
    ctx.state["funbo_af"] = str(ctx.artifact(RESULT))
    t = search.tally
    ctx.log.info("funbo: %d candidates, %d valid, best training score %.3f (seed %.3f), validation %.3f",
                 t.sampled, t.valid, best.score, seed_score or math.nan, best_val)
    return {"sampler": sampler.label, "candidates": t.sampled, "valid": t.valid, "valid_rate": t.valid / max(t.sampled, 1),
            "duplicates": t.duplicates, "prompts": t.prompts, "resets": t.resets, "failures": t.reasons,
            "seed_train_score": seed_score, "best_train_score": pool[0].score,
            "chosen_train_score": best.score, "chosen_validation_score": best_val,
            "seed_validation_score": _mean(seed_val), "programs_scored": len(pool), "top_considered": len(rows),
            "selection": "top share by training, best validation" if math.isfinite(best_val) else
            "training only: no program of the top share ran on the validation functions",
            "af_file": str(ctx.artifact(RESULT)), "train": train, "validation": validation}


def _mean(o: Outcome) -> float | None:
    return sum(o.scores) / len(o.scores) if o.ok else None


def _result_file(source: str, label: str, train: float, validation: float) -> str:
    return (f'"""Found by llmx analyze --method funbo, sampler {label}: training score {train:.4f}, validation score '
            f'{validation:.4f}."""\n\n{source}')


def score(ref: str, specs: list[bo.ProblemSpec], p: Protocol, backend: str = "numpy", draw: int = 0) -> list[dict]:
    """Per problem: the score and the regret curve of the AF ``ref`` (a baseline or a file); MES, BoTorch's own,
    runs through BoTorch on either backend. The random ones (random search, MES's max-value samples) draw from
    ``draw`` too, so each seed of a comparison is another draw on the same problems."""
    source = afs.load(ref)
    if backend == "botorch" or ref == "mes":
        from llmx.plugins.funbo import botorch_check

        af = "mes" if ref == "mes" else source
        return [botorch_check.score(af, s, p, _stream(p, i, draw)) for i, s in enumerate(specs)]
    if source is None:
        rows = []
        for i, s in enumerate(specs):
            problem = bo.Problem.build(s)
            best = bo.run(problem, bo.random_policy(_stream(p, i, draw)), p.trials, p.beta)
            rows.append({"score": bo.score(best, problem, p.time_term), "regret": bo.regret(best, problem)})
        return rows
    limits = Limits(p.timeout_s * max(1.0, len(specs) / 3), p.memory_mb, p.unsafe_unconfined)
    outcome = evaluate(source, specs, limits=limits, **_protocol(p))
    if not outcome.ok:
        raise UsageError(f"af {ref} fails: {outcome.reason}")
    return [{"score": s, "regret": c} for s, c in zip(outcome.scores, outcome.curves, strict=True)]


def _stream(p: Protocol, problem: int, draw: int) -> int:
    """The seed of problem ``problem``'s random choices under draw ``draw`` (draw 0: the grid seed's own stream)."""
    return p.grid_seed * 7919 + problem + draw * 1_000_003


def _summary(rows: list[dict]) -> dict[str, float]:
    final = np.array([r["regret"][-1] for r in rows])
    return {"score": float(np.mean([r["score"] for r in rows])), "mean_regret": float(final.mean()),
            "median_regret": float(np.median(final))}


def paired(a: list[dict], b: list[dict]) -> dict[str, float | int]:
    """``a`` against ``b`` on final regret (lower is better): wins, losses, ties and a two-sided Wilcoxon p."""
    from scipy.stats import wilcoxon

    x, y = np.array([r["regret"][-1] for r in a]), np.array([r["regret"][-1] for r in b])
    d = x - y
    wins, losses = int((d < 0).sum()), int((d > 0).sum())
    p_value = float(wilcoxon(x, y).pvalue) if wins + losses else 1.0
    return {"wins": wins, "losses": losses, "ties": len(d) - wins - losses, "wilcoxon_p": p_value}


def acquisition(ctx: RunContext, p: AcquisitionParams) -> dict[str, Any]:
    if p.af == "found":
        if "funbo_af" not in ctx.state:
            raise UsageError("af found scores the AF of this run's funbo stage: put analyze --method funbo before it")
        p = p.model_copy(update={"af": ctx.state["funbo_af"]})
    for field, ref in (("af", p.af), ("against", p.against)):
        if ref is not None:
            _checked(field, ref)
    if "mes" in (p.af, p.against) or p.backend == "botorch":
        if importlib.util.find_spec("botorch") is None:
            raise MissingRequirement("backend botorch and af mes need BoTorch", hint=extra_hint("funbo"))
    confinable(p.unsafe_unconfined)
    problems = names(p.functions, p.instances, p.instance_seed)
    specs = _specs(ctx, problems, p)
    rows = score(p.af, specs, p, p.backend, ctx.config.seed)
    out: dict[str, Any] = {"af": p.af, "backend": p.backend, "problems": len(rows), "trials": p.trials,
                           **_summary(rows)}
    out["final_regret"] = out["mean_regret"]  # the mean of problems.jsonl's items (llmx compare pairs them)
    if p.against and p.against == p.af:
        ctx.log.info("acquisition: against is the af itself; no paired comparison")
    elif p.against:
        base = score(p.against, specs, p, p.backend, ctx.config.seed)
        out |= {"against": p.against, **{f"against_{k}": v for k, v in _summary(base).items()}, **paired(rows, base)}
    per_function: dict[str, list[float]] = {}
    for name, r in zip(problems, rows, strict=True):
        per_function.setdefault(name.partition("#")[0], []).append(r["regret"][-1])
    out["per_function_mean_regret"] = {k: float(np.mean(v)) for k, v in per_function.items()}
    atomic.write_jsonl(ctx.artifact("problems.jsonl"), [
        {FIELD: item_id(s.function, s.points, s.grid_seed), "problem": n, "final_regret": r["regret"][-1], **r}
        for n, s, r in zip(problems, specs, rows, strict=True)])
    return out
