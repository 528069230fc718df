"""``eval --method lm-eval``: lm-evaluation-harness on the run's model as it stands after the earlier stages
(quantized, pruned, aligned), through ``lm_eval``'s Python API with the loaded model, so the numbers are the ones
papers report. Metrics come back as ``TASK.METRIC`` (the filter suffix dropped when it is ``none``)."""

from __future__ import annotations

import copy
import json

from llmx.core import atomic
from llmx.core.context import RunContext
from llmx.core.names import did_you_mean
from llmx.errors import UsageError
from llmx.plugins.tasks.config import LmEvalParams


def run(ctx: RunContext, p: LmEvalParams) -> dict:
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=p.include_path)
    known = set(manager.all_tasks)
    missing = [t for t in p.tasks if t not in known]
    if missing:
        raise UsageError(f"unknown lm-eval task '{missing[0]}'.{did_you_mean(missing[0], known)}",
                         hint="Name a task of lm-eval's or of a YAML under include_path.")
    # HFLM sets a pad token on the tokenizer it is given: a copy keeps the run's own for the stages after
    lm = HFLM(pretrained=ctx.model, tokenizer=copy.deepcopy(ctx.tokenizer), batch_size=p.batch_size)
    seed = ctx.config.seed
    try:
        results = lm_eval.simple_evaluate(model=lm, tasks=p.tasks, num_fewshot=p.num_fewshot, limit=p.limit,
                                          task_manager=manager, log_samples=p.log_samples, random_seed=seed,
                                          numpy_random_seed=seed, torch_random_seed=seed, fewshot_random_seed=seed,
                                          confirm_run_unsafe_code=p.confirm_unsafe_code)
    except ValueError as exc:
        if "confirm_run_unsafe_code" not in str(exc):
            raise
        raise UsageError(f"lm-eval task {', '.join(p.tasks)} runs model-written code outside any sandbox",
                         hint="Allow it with --set confirm_unsafe_code=true, or use llmx's sandboxed "
                         "--method task --set task=humaneval.") from None
    out: dict = {}
    for task, metrics in results["results"].items():
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                name, _, filt = key.partition(",")
                out[f"{task}.{name}" + ("" if filt in ("", "none") else f".{filt}")] = value
    for task, samples in (results.get("samples") or {}).items():
        atomic.write_text(ctx.artifact(f"samples_{task}.jsonl"),
                          "".join(json.dumps(s, default=str) + "\n" for s in samples))
    return out
