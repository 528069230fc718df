"""``decode --method cosd``: every strategy of the comparison on one task's rows, judged and counted alike (one row
per task row in ``rows.jsonl``, its ``item`` the digest of the task's name, the row's id and prompt);
``train --method cosd-tree``: CoSD-Tree's CART from a few rows with references; ``train --method cosd-assistant``:
an assistant fine-tuned from a copy of the run's model, for the run's later stages."""

from __future__ import annotations

from dataclasses import asdict

from llmx.core import atomic
from llmx.core.context import RunContext
from llmx.core.eval import stats, tasks
from llmx.core.eval.items import FIELD, item_id
from llmx.errors import UsageError
from llmx.plugins.cosd import cart, loop
from llmx.plugins.cosd.config import AssistantParams, CoSDParams, PairParams, TreeTrainParams
from llmx.plugins.cosd.decide import ReleasedRule, Rule, TreeRule
from llmx.plugins.cosd.tree import features

ASSISTANT = "cosd_assistant"  # (model, tokenizer) a cosd-assistant stage trained, for the run's later stages


def _pair(ctx: RunContext, p: PairParams) -> loop.Pair:
    from llmx.core import models
    from llmx.core.zoo.corpus import tokenizer_fingerprint

    if p.assistant is not None:
        model, tok = models.load(p.assistant, dtype=ctx.config.dtype, device=ctx.device)
    elif ASSISTANT in ctx.state:
        model, tok = ctx.state[ASSISTANT]
    else:
        raise UsageError("cosd needs an assistant: --set assistant=MODEL (or a train --method cosd-assistant stage "
                         "earlier in the run)")
    model.eval()
    ctx.model.eval()
    shared = tokenizer_fingerprint(ctx.tokenizer) == tokenizer_fingerprint(tok)
    return loop.Pair(ctx.model, ctx.tokenizer, model, tok, shared, p.use_cache)


def _rows(p: PairParams, spec) -> tuple[list[dict], str]:
    if spec.kind != "generate":
        raise UsageError(f"task '{spec.name}' is multiple choice; cosd decodes generate tasks")
    split = p.split or spec.splits[-1]
    rows = tasks.rows(spec, split, p.rows_seed)[p.offset:]
    if p.limit:
        rows = rows[:p.limit]
    if not rows:
        raise UsageError(f"task '{spec.name}' has no rows after offset {p.offset}")
    return rows, split


def _decision(ctx: RunContext, p: CoSDParams) -> tuple[object, dict]:
    if p.decision == "mcsd":
        return ReleasedRule(p.alpha, p.beta), {}
    if p.decision == "rule":
        return Rule(p.alpha, p.beta), {}
    path = p.tree or ctx.state.get("cosd_tree")
    if path is None:
        raise UsageError("decision=tree needs --set tree=FILE (or a train --method cosd-tree stage earlier in the run)")
    fitted, info = cart.load(path)
    if fitted is None:
        ctx.log.warning("the tree file falls back to the rule (%s labelled disagreements)", info.get("disagreements"))
        return Rule(p.alpha, p.beta), {"tree_fallback": True}
    return TreeRule(fitted), {"tree_fallback": False, "tree_depth": fitted.depth}


def decode(ctx: RunContext, p: CoSDParams) -> dict:
    spec = p.spec()
    rows, split = _rows(p, spec)
    pair = _pair(ctx, p)
    if p.strategy in ("average", "ensemble") and not pair.shared:
        raise UsageError(f"strategy={p.strategy} needs one tokenizer for both models (these two differ; transformers' "
                         "different-tokenizer assistant gives no draft probabilities to mix)")
    decision, about = _decision(ctx, p) if p.strategy == "cosd" else (None, {})
    settings = loop.Settings(max_new_tokens=p.max_new_tokens or spec.max_new_tokens,
                             stop=tuple(spec.stop if p.stop is None else p.stop), draft_tokens=p.draft_tokens,
                             draft_temperature=p.draft_temperature, average_weight=p.average_weight,
                             ensemble_weight=p.ensemble_weight, seed=ctx.config.seed)
    run = {
        "cosd": lambda prompt: loop.cosd(pair, prompt, decision, settings),
        "draft": lambda prompt: loop.single(pair.draft, pair.draft_tok, prompt, settings, pair.use_cache),
        "assistant": lambda prompt: loop.single(pair.assistant, pair.assistant_tok, prompt, settings, pair.use_cache,
                                                role="assistant"),
        "average": lambda prompt: loop.average(pair, prompt, settings),
        "speculative": lambda prompt: loop.assisted(pair, prompt, settings),
        "ensemble": lambda prompt: loop.assisted(pair, prompt, settings, ensemble=True),
    }[p.strategy]
    judge = spec.load_judge()
    records, scores, results = [], [], []
    for i, row in enumerate(ctx.progress(rows, description=f"cosd {p.strategy}")):
        try:
            result = run(row["prompt"])
        except ValueError as exc:  # transformers' refusals (an ensemble without candidate logits, ...)
            raise UsageError(f"strategy={p.strategy}: {str(exc).splitlines()[0]}") from None
        text = result.text + (result.stop if spec.include_stop and result.stop not in (None, "eos") else "")
        score, _, note = tasks.judge_one(judge, row, text)
        results.append(result)
        scores.append(score)
        ident = row.get("id", p.offset + i)  # a row without an id: its place in the task's seeded order
        records.append({FIELD: item_id(spec.name, ident, row["prompt"]), "id": row.get("id", i),
                        "prompt": row["prompt"], "reference": row.get("reference"),
                        "completion": text, "score": score, "note": note, **asdict(result)})
    path = atomic.write_jsonl(ctx.artifact("rows.jsonl"), records)
    tokens = max(sum(r.tokens for r in results), 1)
    drafted = sum(r.drafted for r in results)
    seconds = sum(r.seconds for r in results)
    low, high = stats.bootstrap_ci(scores, 1000, seed=ctx.config.seed)
    return {"task": spec.name, "split": split, "strategy": p.strategy, "rows": str(path), "prompts": len(rows),
            "score": stats.mean(scores),
            "score_ci_low": low, "score_ci_high": high, "tokens": tokens,
            "draft_forwards_per_token": sum(r.draft_forwards for r in results) / tokens,
            "assistant_forwards_per_token": sum(r.assistant_forwards for r in results) / tokens,
            "assistant_forwards_per_answer": sum(r.assistant_forwards for r in results) / len(rows),
            "replacements_per_answer": sum(r.replacements for r in results) / len(rows),
            "acceptance_rate": sum(r.accepted for r in results) / drafted if drafted else None,
            "tokens_per_s": tokens / seconds if seconds > 0 else None,
            **({"decision": p.decision, "alpha": p.alpha, "beta": p.beta, "draft_tokens": p.draft_tokens}
               if p.strategy == "cosd" else {}), **about}


def train_assistant(ctx: RunContext, p: AssistantParams) -> dict:
    """The ``lm`` stage on a copy of the run's current model; the copy becomes the assistant, the model stays."""
    import copy

    from llmx.core.train.lm.run import run as lm

    draft, tok = ctx.model, ctx.tokenizer
    ctx.set_model(copy.deepcopy(draft), tok)
    try:
        out = lm(ctx, p, method="cosd-assistant")
        ctx.state[ASSISTANT] = (ctx.model.eval(), tok)
    finally:
        ctx.set_model(draft, tok)
    return out


def train_tree(ctx: RunContext, p: TreeTrainParams) -> dict:
    spec = p.spec()
    rows, _ = _rows(p, spec)
    rows = [r for r in rows if isinstance(r.get("reference"), str)][:p.examples]
    if not rows:
        raise UsageError(f"task '{spec.name}' has no rows with a 'reference' answer to learn from")
    pair = _pair(ctx, p)
    labelled = [f for row in ctx.progress(rows, description="features")
                for f in features(pair, row["prompt"], row["reference"])]
    positives = sum(f[2] for f in labelled)
    fallback = len(labelled) < max(p.min_disagreements, 1) or positives in (0, len(labelled))
    fitted = None if fallback else cart.fit([f[:2] for f in labelled], [f[2] for f in labelled], p.max_depth,
                                           p.min_samples_leaf, p.balanced)
    info = {"disagreements": len(labelled), "assistant_right": positives, "examples": len(rows),
            "task": spec.name, "draft": ctx.config.model, "assistant": p.assistant or "a cosd-assistant stage",
            "max_depth": p.max_depth}
    path = ctx.artifact("cosd_tree.json")
    cart.save(path, fitted, info)
    ctx.state["cosd_tree"] = str(path)
    train_accuracy = (stats.mean([float(fitted.predict_one(f[:2]) == f[2]) for f in labelled]) if fitted else None)
    return {"tree": str(path), "fallback": fallback, "train_accuracy": train_accuracy,
            "depth": fitted.depth if fitted else None, **info}
