"""``eval --method task``: a task's metrics on the run's model (with a paired comparison and KL drift on request),
one row per task row in ``rows.jsonl``, its ``item`` the digest of the task's name, the row's id, prompt and choices;
``analyze --method task``: the model's judged samples as training data (preference pairs, labelled completions, the
passing completions for SFT on chosen, and the task's references for SFT)."""

from __future__ import annotations

from llmx.core import atomic
from llmx.core.context import RunContext
from llmx.core.eval import stats, tasks
from llmx.core.eval.items import FIELD, item_id
from llmx.core.spec import TaskSpec
from llmx.errors import UsageError
from llmx.plugins.tasks.config import TaskDataParams, TaskEvalParams, TaskSource, TracingDataParams


def _decoding(spec: TaskSpec, p: TaskSource, seed: int, samples: int, temperature: float) -> tasks.Decoding:
    return tasks.Decoding(samples=samples, temperature=temperature, top_p=p.top_p,
                          max_new_tokens=p.max_new_tokens or spec.max_new_tokens,
                          stop=tuple(spec.stop if p.stop is None else p.stop), include_stop=spec.include_stop,
                          seed=seed, batch_size=p.batch_size)


def _workers(p: TaskSource) -> int:
    """The judges run at once: as many as the CPUs this process may use, unless the params say."""
    from llmx.core.eval.sandbox import usable_cpus

    return p.judge_workers or usable_cpus()


def keyed(name: str, records: list[dict]) -> list[dict]:
    """``records`` (``tasks.run``'s), each with its ``item``: what was asked, never what the model made of it."""
    return [{FIELD: item_id(name, r["id"], r["prompt"], r.get("choices")), **r} for r in records]


def evaluate(ctx: RunContext, p: TaskEvalParams) -> dict:
    from llmx.core import models

    spec = p.spec()
    split = p.split or spec.splits[-1]
    rows = tasks.rows(spec, split, p.rows_seed, p.limit)
    d = _decoding(spec, p, ctx.config.seed, p.samples or spec.samples,
                  spec.temperature if p.temperature is None else p.temperature)
    if (p.kl or p.kl_reference) and (spec.kind != "generate" or d.temperature != 1.0):
        raise UsageError("kl needs a generate task sampled at temperature 1")

    def run(model, tok) -> tasks.TaskResult:
        return tasks.run(spec, model, tok, rows, d, judge_workers=_workers(p), resamples=p.resamples, ks=p.k,
                         progress=ctx.progress, unconfined=p.unsafe_unconfined)

    result = run(ctx.model, ctx.tokenizer)
    out = {"task": spec.name, "split": split, **result.metrics}
    if p.kl or p.kl_reference:
        reference = models.load(p.kl_reference or ctx.config.model, dtype=ctx.config.dtype, device=ctx.device)
        kl, per_prompt = tasks.drift(ctx.model, ctx.tokenizer, *reference, rows, result.completions, d.batch_size,
                                     ctx.progress, p.resamples, ctx.config.seed)
        out.update(kl)
        for record, value in zip(result.records, per_prompt, strict=True):
            record["kl"] = value
    atomic.write_jsonl(ctx.artifact("rows.jsonl"), keyed(spec.name, result.records))
    if p.compare:
        other = run(*models.load(p.compare, dtype=ctx.config.dtype, device=ctx.device))
        atomic.write_jsonl(ctx.artifact("compare_rows.jsonl"), keyed(spec.name, other.records))
        key = "accuracy" if spec.kind == "choice" else "score"
        out[f"compare_{key}"] = other.metrics[key]
        out.update(stats.paired(other.scores, result.scores, p.resamples, seed=ctx.config.seed).as_dict())
    return out


def analyze(ctx: RunContext, p: TaskDataParams) -> dict:
    spec = p.spec()
    splits = p.splits or list(spec.splits)
    if isinstance(p.limit, dict) and set(p.limit) - set(splits):
        raise UsageError(f"limit names splits this run does not make: {', '.join(sorted(set(p.limit) - set(splits)))}")
    d = _decoding(spec, p, ctx.config.seed, p.samples, p.temperature)
    out: dict = {"task": spec.name}
    for split in splits:
        if split == "test":
            ctx.log.warning("analyze: the rows of task %s come from its test split; training on them contaminates "
                            "its evaluation", spec.name)
        limit = p.limit.get(split) if isinstance(p.limit, dict) else p.limit
        rows = tasks.rows(spec, split, p.rows_seed, limit)
        result = tasks.run(spec, ctx.model, ctx.tokenizer, rows, d, judge_workers=_workers(p), progress=ctx.progress,
                           unconfined=p.unsafe_unconfined)
        data = training_rows(rows, result.records)
        for kind, items in data.items():
            atomic.write_jsonl(ctx.artifact(f"{split}_{kind}.jsonl"), items)
            out[f"{split}_{kind}"] = len(items)
        out[f"{split}_preferred_rate"] = result.metrics["score"]
    out["data_dir"] = str(ctx.artifact(f"{splits[0]}_paired.jsonl").parent)
    return out


def training_rows(rows: list[dict], records: list[dict]) -> dict[str, list[dict]]:
    """From judged samples: ``paired`` (the first passing and the first failing completion of a prompt),
    ``unpaired`` (every completion with its pass label), ``chosen`` (a prompt's first passing completion, as SFT
    rows) and ``sft`` (the task's references). Empty completions and those whose judge raised are left out."""
    paired, unpaired, chosen = [], [], []
    for rec in records:
        usable = [(c, s >= tasks.PASS) for c, s, e in zip(rec["completions"], rec["scores"], rec["errors"], strict=True)
                  if c and e is None]
        unpaired += [{"prompt": rec["prompt"], "completion": c, "label": ok} for c, ok in usable]
        good = next((c for c, ok in usable if ok), None)
        bad = next((c for c, ok in usable if not ok), None)
        if good is not None:
            chosen.append({"prompt": rec["prompt"], "completion": good})
            if bad is not None:
                paired.append({"prompt": rec["prompt"], "chosen": good, "rejected": bad})
    sft = [{"prompt": r["prompt"], "completion": r["reference"]} for r in rows if r.get("reference")]
    return {"paired": paired, "unpaired": unpaired, "chosen": chosen, "sft": sft}


def tracing_data(ctx: RunContext, p: TracingDataParams) -> dict:
    """The tracing task's splits as SFT rows (``{prompt, completion}``, the answer line as the completion)."""
    from llmx.core.eval import tracing

    out: dict = {"task": "tracing"}
    for split in tracing.SIZES:
        count = getattr(p, split)
        if count > tracing.SIZES[split]:
            raise UsageError(f"tracing has {tracing.SIZES[split]} {split} programs; {count} asked")
        rows = [{"prompt": r["prompt"], "completion": r["reference"], "answer": r["answer"]}
                for r in tracing.rows(split, p.rows_seed)[:count]]
        atomic.write_jsonl(ctx.artifact(f"{split}.jsonl"), rows)
        out[f"{split}_rows"] = count
    out["data_dir"] = str(ctx.artifact("train.jsonl").parent)
    return out
