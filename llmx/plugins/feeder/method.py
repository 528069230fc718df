"""``analyze --method feeder`` selects the FEEDER set with the run's model; ``eval --method icl`` measures 0-shot and
k-shot accuracy with demonstrations from the full pool, the FEEDER set or a random subset of its size; ``train
--method feeder`` runs the bi-level loop (select with the current model, fine-tune on in-context sequences of the
selection); ``analyze --method icl-episodes`` writes a held-out map's pool and test rows, which the later stages of
the same run read where they name no data. ``eval --method icl``'s ``rows.jsonl`` holds each test row's k-shot
``accuracy`` (1/0): the items ``llmx compare feeder`` pairs, each with its ``item`` (the digest of the test row's
place, input and label)."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

from llmx.core import atomic
from llmx.core.context import RunContext
from llmx.core.data.icl import Format, load_rows
from llmx.core.eval import stats
from llmx.core.eval.items import FIELD, item_id
from llmx.errors import UsageError
from llmx.plugins.feeder import episodes as E
from llmx.plugins.feeder.config import EpisodeParams, FeederParams, FeederTrainParams, IclData, IclEvalParams
from llmx.plugins.feeder.oracle import CopyOracle, KnnOracle, LMOracle, Oracle
from llmx.plugins.feeder.tree import Selection, select, versus_random

SET_FILE = "feeder.json"
EPISODES = "icl_episodes"  # ctx.state: the pool, test rows and template an icl-episodes stage wrote


def _from_run(ctx: RunContext, p: Any) -> Any:
    """``p`` with the pool (and, for eval, the test rows) of an earlier ``icl-episodes`` stage of this run where it
    names none; that stage's template and its map's labels too unless ``template`` and ``labels`` are set."""
    made = ctx.state.get(EPISODES)
    need = [k for k in ("data", "test") if k in type(p).model_fields and getattr(p, k) is None
            and (k == "data" or not isinstance(p, FeederTrainParams))]
    if not need:
        return p
    if made is None:
        raise UsageError(f"no {' and no '.join(need)} rows: pass --data (a .jsonl of {{input, label}} rows)"
                         f"{' and --set test=FILE' if 'test' in need else ''}, or run analyze --method icl-episodes "
                         "first in the same run")
    update = {k: made["pool" if k == "data" else "test"] for k in need}
    if "data" in need and "template" not in p.model_fields_set:
        update["template"] = made["template"]
    if "data" in need and p.labels is None:  # the map's labels: a small pool can miss one that test rows hold
        update["labels"] = sorted(made["labels"])
    return p.model_copy(update=update)


def _pool(p: IclData) -> tuple[list[dict], list[str], Format]:
    rows = load_rows(p.data, p.labels)
    labels = list(p.labels) if p.labels else sorted({r["label"] for r in rows})
    if any(not lab.strip() for lab in labels):
        raise UsageError(f"{p.data}: an empty label; labels must be words")
    if len(labels) < 2:
        raise UsageError(f"{p.data}: one label only ({labels[0]}); classification needs two")
    return rows, labels, Format(p.template, p.separator)


def digest(rows: list[dict]) -> str:
    """16 hex digits of the rows' inputs and labels, in order: a FEEDER set belongs to one pool."""
    blob = json.dumps([[r["input"], r["label"]] for r in rows])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _limit(ctx: RunContext, p: IclData) -> int | None:
    """The prompt length: ``context``, else the model's recorded training length (None: its configured context)."""
    from llmx.core import models

    return p.context or models.trained_length(str(ctx.config.model))


def _oracle(ctx: RunContext, p: FeederParams | FeederTrainParams, rows: list[dict], labels: list[str], fmt: Format,
            batch_size: int) -> Oracle:
    if p.oracle != "lm":
        return (KnnOracle if p.oracle == "knn" else CopyOracle)(rows, labels, p.max_node_size)
    oracle = LMOracle(ctx.model, ctx.tokenizer, fmt, rows, labels, batch_size, p.max_node_size, _limit(ctx, p))
    if not any(oracle.fits([i]) for i in range(len(rows))):
        raise UsageError("not one demonstration fits the model's context with the longest query: shorten the rows")
    return oracle


def _choose(ctx: RunContext, p: FeederParams | FeederTrainParams, oracle: Oracle) -> Selection:
    ctx.log.info("feeder: %d pool rows, %s tokens a question for demonstrations", len(oracle.rows), oracle.budget)
    return select(oracle, p.depth, p.rounds, p.necessity_pass, p.repair_pass, ctx.config.seed, p.necessity_check,
                  p.cut)


def _summary(sel: Selection, pool: int) -> dict[str, Any]:
    out = {k: v for k, v in sel.as_dict().items() if k not in ("indices", "inferred")}
    return {"pool_rows": pool, "feeder_rows": len(sel.indices), "kept_share": len(sel.indices) / pool, **out}


def analyze(ctx: RunContext, p: FeederParams) -> dict[str, Any]:
    p = _from_run(ctx, p)
    rows, labels, fmt = _pool(p)
    oracle = _oracle(ctx, p, rows, labels, fmt, p.batch_size)
    sel = _choose(ctx, p, oracle)
    versus = versus_random(oracle, sel.indices, sel.inferred, p.random_draws, ctx.config.seed) if p.random_draws \
        else None
    record = {"indices": sel.indices, **_provenance(ctx, p.data, rows, labels, fmt), **_summary(sel, len(rows)),
              "not_inferred": [x for x, ok in enumerate(sel.inferred) if not ok],
              "params": p.model_dump(mode="json")}
    atomic.write_json(ctx.artifact(SET_FILE), record)
    atomic.write_jsonl(ctx.artifact("feeder_rows.jsonl"), [rows[i] | {"index": i} for i in sel.indices])
    ctx.state["feeder"] = record
    ctx.log.info("feeder: %d of %d rows, %d oracle calls, pool inferred %.3f, %d cuts", len(sel.indices), len(rows),
                 sel.oracle_calls, sel.sufficiency_rate, sel.truncations)
    return {**_summary(sel, len(rows)), "versus_random": versus, "set_file": str(ctx.artifact(SET_FILE))}


def _provenance(ctx: RunContext, data: str, rows: list[dict], labels: list[str], fmt: Format) -> dict[str, Any]:
    """What a FEEDER set was selected from and with: a set belongs to one pool, model and prompt."""
    return {"pool": str(Path(data).resolve()), "pool_digest": digest(rows), "model": ctx.config.model,
            "labels": labels, "template": fmt.template, "separator": fmt.separator}


def _feeder_set(ctx: RunContext, given: str | None, rows: list[dict], labels: list[str], fmt: Format) -> dict:
    """The FEEDER set from ``given`` (feeder.json or its folder) or an earlier stage; it must be of this pool, and a
    set selected with another model or prompt is used with a warning."""
    if given is not None:
        path = Path(given) / SET_FILE if Path(given).is_dir() else Path(given)
        if not path.is_file():
            raise UsageError(f"{given}: no {SET_FILE} (pass the file analyze --method feeder wrote, or its folder)")
        record = json.loads(path.read_text())
    elif "feeder" in ctx.state:
        record = ctx.state["feeder"]
    else:
        raise UsageError("no FEEDER set: pass feeder (a feeder.json), or run analyze --method feeder first")
    if record.get("pool_digest") != digest(rows):
        raise UsageError(f"the FEEDER set was selected from another pool ({record.get('pool')})")
    here = {"model": ctx.config.model, "labels": labels, "template": fmt.template, "separator": fmt.separator}
    differ = [k for k, v in here.items() if k in record and record[k] != v]
    if differ:
        ctx.log.warning("the FEEDER set was selected with another %s (%s): it is the set that model and prompt "
                        "need", " and ".join(differ), ", ".join(f"{k}={record[k]!r}" for k in differ))
    return record


def _subset(ctx: RunContext, subset: str, rows: list[dict], labels: list[str], fmt: Format, given: str | None,
            size: int | None = None, rng: random.Random | None = None) -> list[int]:
    if subset == "full":
        return list(range(len(rows)))
    if subset == "feeder":
        return list(_feeder_set(ctx, given, rows, labels, fmt)["indices"])
    size = size or len(_feeder_set(ctx, given, rows, labels, fmt)["indices"])
    if size > len(rows):
        raise UsageError(f"a random subset of {size} rows from a pool of {len(rows)}")
    return sorted((rng or random.Random(ctx.config.seed)).sample(range(len(rows)), size))


def _shown(row: dict, demos: list[dict]) -> dict[str, str]:
    """Where rows carry their cue (icl-episodes): whether a demonstration shows the query's cue ("yes", "no"): a
    model that learns in context copies that demonstration's label; without one it can only guess."""
    if "cue" not in row or any("cue" not in d for d in demos):
        return {}
    return {"cue_shown": "yes" if any(d["cue"] == row["cue"] for d in demos) else "no"}


def evaluate(ctx: RunContext, p: IclEvalParams) -> dict[str, Any]:
    from llmx.core.eval import icl

    p = _from_run(ctx, p)
    rows, labels, fmt = _pool(p)
    test = load_rows(p.test, labels)[:p.limit]
    model, tok = ctx.model, ctx.tokenizer
    model.eval()
    pool = _subset(ctx, p.pool, rows, labels, fmt, p.feeder)
    rng = random.Random(ctx.config.seed)
    if p.selector == "similarity":
        vectors = icl.embed(model, tok, [fmt.query(rows[i]["input"]) for i in pool], p.batch_size)
        queries = icl.embed(model, tok, [fmt.query(r["input"]) for r in test], p.batch_size)
        chosen = [icl.similar_demos(queries[j], vectors, pool, p.shots) for j in range(len(test))]
    else:
        chosen = [icl.random_demos(pool, p.shots, rng) for _ in test]
    limit = _limit(ctx, p)
    zero = icl.classify(model, tok, [fmt.query(r["input"]) for r in test], labels, p.batch_size, ctx.progress, limit)
    few = icl.classify(model, tok, [fmt.prompt([rows[i] for i in c], r["input"]) for c, r in zip(chosen, test,
                                                                                               strict=True)],
                       labels, p.batch_size, ctx.progress, limit)
    right0 = [float(s == r["label"]) for s, r in zip(zero, test, strict=True)]
    right = [float(s == r["label"]) for s, r in zip(few, test, strict=True)]
    rows_file = atomic.write_jsonl(ctx.artifact("rows.jsonl"), [  # "accuracy": the items llmx compare pairs
        {FIELD: item_id(j, r["input"], r["label"]), "input": r["input"], "label": r["label"], "zero_shot": z,
         "k_shot": f, "demos": c, "accuracy": a, "accuracy_0shot": a0, **_shown(r, [rows[i] for i in c])}
        for j, (r, z, f, c, a, a0) in enumerate(zip(test, zero, few, chosen, right, right0, strict=True))])
    seed = ctx.config.seed
    return {"test_rows": len(test), "shots": p.shots, "selector": p.selector, "pool": p.pool,
            "pool_rows": len(pool), "demo_pool_rows": len(pool), "demos_per_query": stats.mean([float(len(c)) for c in chosen]),
            "labels": labels, "chance": 1 / len(labels),
            "accuracy_0shot": stats.mean(right0), "accuracy_0shot_ci": list(stats.bootstrap_ci(right0, p.resamples,
                                                                                                 seed=seed)),
            "accuracy": stats.mean(right), "accuracy_ci": list(stats.bootstrap_ci(right, p.resamples, seed=seed)),
            "rows_file": str(rows_file)}


def _sequences(rows: list[dict], chosen: list[int], fmt: Format, shots: int, count: int,
               rng: random.Random) -> list[dict]:
    """``count`` in-context training rows: a query drawn from ``chosen``, ``shots`` other members as its
    demonstrations (pool-index order), the query's label as the completion."""
    out = []
    for _ in range(count):
        q = rng.choice(chosen)
        demos = sorted(rng.sample([i for i in chosen if i != q], min(shots, len(chosen) - 1)))
        out.append({"prompt": fmt.prompt([rows[i] for i in demos], rows[q]["input"]), "completion": rows[q]["label"]})
    return out


def train(ctx: RunContext, p: FeederTrainParams) -> dict[str, Any]:
    from llmx.core.train.distributed import world
    from llmx.core.train.params import TrainParams
    from llmx.core.train.sft.params import SFTParams
    from llmx.core.train.sft.run import run as sft

    p = _from_run(ctx, p)
    rows, labels, fmt = _pool(p)
    tok = ctx.tokenizer
    rng = random.Random(ctx.config.seed)
    size = p.random_size or (len(_feeder_set(ctx, p.feeder, rows, labels, fmt)["indices"]) if p.pool == "random"
                             else None)
    held = load_rows(p.test, labels) if p.test else []
    loop = {k: getattr(p, k) for k in TrainParams.model_fields}
    rounds, last, chosen = [], None, []
    for r in range(p.outer_rounds):
        figures: dict[str, Any] = {"round": r}
        if p.pool == "feeder":
            last = _choose(ctx, p, _oracle(ctx, p, rows, labels, fmt, p.batch_size))
            figures.update({k: v for k, v in _summary(last, len(rows)).items() if k != "levels"})
            collapsed = r > 0 and len(last.indices) < 2  # the tuned model infers the pool from one row
            figures["kept_previous_selection"] = collapsed
            chosen = chosen if collapsed else last.indices
        else:
            chosen = _subset(ctx, p.pool, rows, labels, fmt, None, size, rng)
        if len(chosen) < 2:
            raise UsageError(f"round {r}: {len(chosen)} selected row(s); in-context sequences need two")
        count = p.steps * p.batch_size * p.grad_accum * world()[1]
        data = _sequences(rows, chosen, fmt, p.shots, count, rng)
        lengths = [len(tok(d["prompt"] + d["completion"])["input_ids"]) + 1 for d in data]
        if max(lengths) > p.max_length:
            raise UsageError(f"a training sequence is {max(lengths)} tokens, past max_length {p.max_length}: lower "
                             "shots or raise max_length")
        if held:  # k-shot prompts over the selection, the test rows as queries
            eval_rows = [{"prompt": fmt.prompt([rows[i] for i in sorted(rng.sample(chosen, min(p.shots,
                                                                                                len(chosen))))],
                                               h["input"]), "completion": h["label"]} for h in held]
        else:  # fresh sequences of the selection, so that no training sequence is held out
            eval_rows = _sequences(rows, chosen, fmt, p.shots, max(32, p.batch_size), rng)
        stage = SFTParams(**{**loop, "save": p.save and r == p.outer_rounds - 1},
                          data=str(atomic.write_jsonl(ctx.artifact(f"round{r}.jsonl"), data)),
                          eval_data=str(atomic.write_jsonl(ctx.artifact(f"round{r}_heldout.jsonl"), eval_rows)),
                          max_length=p.max_length, max_prompt_length=p.max_length - 1)
        out = sft(ctx, stage, "feeder")
        figures.update(selected_rows=len(chosen), sequences=len(data), sequence_tokens=sum(lengths),
                       label_tokens=out["trained_tokens_per_epoch"],
                       **{k: out[k] for k in ("steps", "final_loss", "heldout_loss", "heldout_loss_before",
                                              "train_seconds") if k in out})
        rounds.append(figures)
    if last is not None:
        ctx.state["feeder"] = {"indices": last.indices, **_provenance(ctx, p.data, rows, labels, fmt)}
    trained = {k: v for k, v in out.items() if k in ("model_dir", "adapter_dir", "trainable_params")}
    return {"pool": p.pool, "outer_rounds": p.outer_rounds, "pool_rows": len(rows),
            "selected_rows": rounds[-1]["selected_rows"], "sequence_tokens": sum(f["sequence_tokens"] for f in rounds),
            "label_tokens": sum(f["label_tokens"] for f in rounds),
            "oracle_calls": sum(f.get("oracle_calls", 0) for f in rounds), "rounds": rounds, **trained}


def episodes(ctx: RunContext, p: EpisodeParams) -> dict[str, Any]:
    spec = E.Spec(cues=p.cues, labels=p.labels, distractors=p.distractors, noise=p.noise)
    map_seed = ctx.config.seed if p.map_seed is None else p.map_seed
    made = E.heldout(spec, p.pool, p.test, map_seed)
    pool = atomic.write_jsonl(ctx.artifact("pool.jsonl"), made["pool"])
    test = atomic.write_jsonl(ctx.artifact("test.jsonl"), made["test"])
    ctx.state[EPISODES] = {"pool": str(pool), "test": str(test), "template": E.TEMPLATE, "labels": made["labels"]}
    atomic.write_json(ctx.artifact("map.json"), {"map": made["map"], "labels": made["labels"]})
    noisy = sum(r["label"] != made["map"][r["cue"]] for r in made["pool"])
    cues = len({r["cue"] for r in made["pool"]})
    return {"pool_rows": p.pool, "test_rows": p.test, "map_seed": map_seed, "cues": p.cues, "cues_in_pool": cues,
            "distractors": list(p.distractors),
            "labels": made["labels"], "noisy_pool_rows": noisy, "template": E.TEMPLATE, "data_dir": str(pool.parent)}
