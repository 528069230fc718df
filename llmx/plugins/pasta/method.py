"""``analyze --method pasta-annotate`` writes Pasta-Lang rows (train.jsonl, validation.jsonl) under the run model's
tokenizer equipped with the six tag tokens (a copy: the run's tokenizer is left as it was); ``train --method pasta``
runs Pasta-SFT (or Baseline-SFT); ``decode --method pasta`` runs the interpreter over prompts and measures it
(``decoded.jsonl``, and ``prompts.jsonl``: the per-prompt items ``llmx compare pasta`` pairs)."""

from __future__ import annotations

import copy
import statistics
from pathlib import Path
from typing import Any

from llmx.core import atomic
from llmx.core.context import RunContext
from llmx.errors import UsageError
from llmx.plugins.pasta import annotate as A
from llmx.plugins.pasta import lang
from llmx.plugins.pasta.config import AnnotateParams, BonbonParams, PastaDecodeParams, PastaSFTParams

STATE = "pasta_rows"  # the folder an annotate stage wrote, for later train and decode stages of the run


def _rows(ctx: RunContext, given: str | None, split: str) -> str:
    if given:
        return given
    if STATE not in ctx.state:
        raise UsageError("no annotated rows: pass data (a .jsonl), or run analyze --method pasta-annotate first")
    return str(Path(ctx.state[STATE]) / f"{split}.jsonl")


def _equipped(ctx: RunContext) -> dict[str, int]:
    """The run model's tag ids; a model without full attention or without the Pasta tokens is a usage error."""
    from llmx.plugins.pasta import interpreter as I

    I.require_attention(ctx.model)
    tags = lang.ids(ctx.tokenizer)
    if tags is None:
        raise UsageError(f"{ctx.config.model}: the tokenizer has no Pasta-Lang tokens; train it with "
                         "llmx train --method pasta first")
    return tags


def annotate(ctx: RunContext, p: AnnotateParams) -> dict[str, Any]:
    tok = copy.deepcopy(ctx.tokenizer)
    lang.equip(tok)

    def tokenize(text: str) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"]

    opts = A.Options(**p.model_dump())
    rows, report = A.build(tokenize, opts)
    for split in ("train", "validation"):
        atomic.write_jsonl(ctx.artifact(f"{split}.jsonl"), [r for r in rows if r["split"] == split])
    out = report.as_dict()
    out.update({f"skipped_{k}": v for k, v in out.pop("skipped").items()})
    lengths = sorted(len(tokenize(r["prompt"] + r["response"])) for r in rows)
    if lengths:
        out.update(row_tokens_median=statistics.median(lengths), row_tokens_p90=lengths[int(0.9 * (len(lengths) - 1))],
                   row_tokens_max=lengths[-1], chunks_mean=statistics.fmean(r["chunks"] for r in rows))
    out["data_dir"] = ctx.state[STATE] = str(ctx.artifact("train.jsonl").parent)
    ctx.log.info("pasta-annotate: %d train / %d validation rows", out["rows_train"], out["rows_validation"])
    return out


def train(ctx: RunContext, p: PastaSFTParams) -> dict[str, Any]:
    """Pasta-SFT (or Baseline-SFT with ``annotated: false``) through the ``sft`` stage with the interpreter's layout."""
    from llmx.core.train.sft.run import run as sft
    from llmx.plugins.pasta import sft as S

    p = p.model_copy(update={"data": _rows(ctx, p.data, "train")})
    tags = lang.equip(ctx.tokenizer, ctx.model)
    out = sft(ctx, p, "pasta" if p.annotated else "pasta-baseline", codec=S.codec(ctx.model, tags, p.annotated))
    return {"annotated": p.annotated, **out}


def decode(ctx: RunContext, p: PastaDecodeParams) -> dict[str, Any]:
    from llmx.core import models
    from llmx.plugins.pasta import decode as D
    from llmx.plugins.pasta import interpreter as I

    tags = _equipped(ctx)
    rows = D.load_prompts(_rows(ctx, p.data, "validation"))[: p.limit]
    opts = I.Options(positions=p.positions, fixed_tokens=p.fixed_tokens, max_threads=p.max_threads,
                     max_chunk_tokens=p.max_chunk_tokens, max_new_tokens=p.max_new_tokens, attention=p.attention)
    model = ctx.model.eval()
    decoded = []
    for row in ctx.progress(rows, description=f"pasta decode ({p.positions} positions)"):
        decoded.append({"name": row.get("name"), **D.one(model, ctx.tokenizer, tags, row["prompt"], opts, p.repeats)})
    out = D.summary(decoded)
    if p.judge:
        judge, judge_tok = models.load(p.judge, ctx.config.dtype, ctx.device)
        for r, nll in zip(decoded, D.judge_nll(judge.eval(), judge_tok, decoded), strict=True):
            r["judge_nll"] = nll
        scored = [r["judge_nll"] for r in decoded if r["judge_nll"] is not None]
        out["judge_nll_mean"] = statistics.fmean(scored) if scored else None
        empty = [i for i, r in enumerate(decoded) if r["judge_nll"] is None]
        ends = D.judge_end_nll(judge, judge_tok, [decoded[i]["prompt"] for i in empty]) if empty else []
        items = D.items(decoded, dict(zip(empty, ends, strict=True)))
        out["judge_nll"] = statistics.fmean(r["judge_nll"] for r in items)  # the items' mean, empty ones included
        out["empty_responses"] = len(empty)
        atomic.write_jsonl(ctx.artifact("prompts.jsonl"), items)
    else:
        atomic.write_jsonl(ctx.artifact("prompts.jsonl"), D.items(decoded))
    atomic.write_jsonl(ctx.artifact("decoded.jsonl"), decoded)
    return {"positions": p.positions, **out, "decoded": str(ctx.artifact("decoded.jsonl"))}


def bonbon(ctx: RunContext, p: BonbonParams) -> dict[str, Any]:
    """BoNBoN rounds: sample, score, pick best and worst per prompt, train SFT + IPO against the round's start."""
    from llmx.core import models
    from llmx.core.train.distributed import gather_shards, world
    from llmx.core.train.stage import finish, fit, prepare, trainable
    from llmx.plugins.pasta import bonbon as B
    from llmx.plugins.pasta import decode as D
    from llmx.plugins.pasta import interpreter as I

    tags = _equipped(ctx)
    prompts = [r["prompt"] for r in D.load_prompts(_rows(ctx, p.data, "train"))[: p.prompts]]
    tok = ctx.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    opts = I.Options(max_threads=p.max_threads, max_chunk_tokens=p.max_chunk_tokens, max_new_tokens=p.max_new_tokens)
    tau = p.tau or B.bonbon_tau(p.samples)
    judge = models.load(p.judge, ctx.config.dtype, ctx.device) if p.judge else None
    policy = prepare(ctx, ctx.model, p)
    rounds, result = [], None
    rank, size = world()
    for r in range(p.rounds):
        policy.eval()
        mine = list(range(len(prompts)))[rank::size]  # each torchrun rank samples its shard; all train on every pair
        cands = gather_shards([B.candidates(policy, tok, tags, prompts[i], p.samples, opts, p.temperature,
                                            ctx.config.seed + 7919 * r + i)
                               for i in ctx.progress(mine, description=f"bonbon round {r}: sampling")])
        flat = [c for cs in cands for c in cs]
        if judge is not None:
            rows = [{"prompt": q, "plain": c.plain} for q, cs in zip(prompts, cands, strict=True) for c in cs]
            for c, nll in zip(flat, D.judge_nll(judge[0].eval(), judge[1], rows), strict=True):
                c.nll = nll
        chosen = [x for x in (B.pair(cs, p.lam) for cs in cands) if x is not None]
        pairs = [(best.lay, worst.lay) for best, worst in chosen]
        if not pairs:
            raise UsageError(f"round {r}: no prompt had a clean sample (ended at EOS, well-formed) scoring above "
                             "another well-formed one; sample more prompts or at a lower temperature")
        reference = B.reference_logps(policy, pairs, pad, p.batch_size)  # the round-start policy, once per pair
        policy.train()

        def loss(i: int, pairs=pairs, reference=reference):
            idx = [(i * p.batch_size + j) % len(pairs) for j in range(p.batch_size)]
            return B.loss(policy, [pairs[k] for k in idx], [reference[k] for k in idx], pad, p.alpha, tau)

        result = fit(ctx, policy, loss, p, params=trainable(policy))
        rounds.append({"round": r, "pairs": len(pairs), "samples": len(flat),
                       "well_formed": statistics.fmean(c.lay is not None for c in flat),
                       "speedup_mean": statistics.fmean(c.speedup for c in flat),
                       "parse_rate": statistics.fmean(c.parses for c in flat),
                       "best_speedup_mean": statistics.fmean(best.speedup for best, _ in chosen),
                       "final_loss": result.last_loss})
    out = {"lam": p.lam, "alpha": p.alpha, "tau": tau, "prompts": len(prompts), "rounds": rounds}
    out.update(finish(ctx, policy, p, "pasta-bonbon", result))
    return out
