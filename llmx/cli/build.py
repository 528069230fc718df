"""Turn command-line input into a resolved run, in the documented precedence order."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from llmx.core.config import ResolvedRun, apply_sets, deep_merge, load_yaml, resolve
from llmx.core.spec import Stage
from llmx.errors import UsageError


def merged_files(files: list[Path] | None) -> dict[str, Any]:
    raw: dict[str, Any] = {}
    for f in files or []:
        raw = deep_merge(raw, load_yaml(f))
    return raw


def apply_flags(raw: dict[str, Any], *, model=None, seed=None, device=None, onload=None, dtype=None, data=None,
                name=None, output_dir=None) -> dict[str, Any]:
    flags = {"model": model, "seed": seed, "device": device, "onload": onload, "dtype": dtype, "name": name,
             "output_dir": output_dir}
    out = deep_merge(raw, {k: v for k, v in flags.items() if v is not None})
    if data is not None:
        out = deep_merge(out, {"data": {"source": data}})
    return out


def stage_pipeline(raw: dict[str, Any], stage: Stage, method: str | None, params: dict[str, Any],
                   evals: list[str] | None) -> dict[str, Any]:
    """Stage sugar: the pipeline becomes this one stage (params from a matching config entry, then flags)
    followed by the ``--eval`` methods (a name that is a task and not a method evaluates that task)."""
    from llmx.core.plugins import host

    base: dict[str, Any] = {}
    for entry in raw.get("pipeline") or []:
        if not isinstance(entry, dict):
            continue
        if _stage_of(entry) == stage.value and (method is None or entry.get("method") == method):
            base = entry
            break
    chosen = method or base.get("method")
    if not chosen:
        names = host().methods.names(stage)
        raise UsageError(f"{stage.value} needs --method", hint=f"Methods for {stage.value}: {', '.join(names) or 'none'}.")
    entry = {"method": chosen, "stage": stage.value, "params": deep_merge(base.get("params") or {}, params)}
    out = dict(raw)
    out["pipeline"] = [entry] + [_eval_entry(e) for e in evals or []]
    return out


def _eval_entry(name: str) -> dict[str, Any]:
    from llmx.core.names import did_you_mean, normalize
    from llmx.core.plugins import host

    h = host()
    methods = [s.name for s in h.methods if Stage.EVAL in s.stages] + \
        [a for s in h.methods if Stage.EVAL in s.stages for a in s.aliases]
    if normalize(name) in {normalize(m) for m in methods}:
        return {"method": name, "stage": Stage.EVAL.value}
    if normalize(name) in {normalize(t) for t in h.tasks}:
        return {"method": "task", "stage": Stage.EVAL.value, "params": {"task": name}}
    raise UsageError(f"--eval {name}: neither an eval method nor a task.{did_you_mean(name, methods + list(h.tasks))}",
                     hint="See llmx methods --stage eval and llmx tasks.")


def _stage_of(entry: dict[str, Any]) -> str | None:
    from llmx.core.plugins import host

    if entry.get("stage"):
        return entry["stage"]
    try:
        return host().methods.get(str(entry.get("method"))).stages[0].value
    except UsageError:
        return None


def resolve_cli(raw: dict[str, Any], sets: list[str] | None, default_stage: int | None, source: str | None,
                files: list[Path] | None = None, score_start: bool = False) -> ResolvedRun:
    """``files``: the recipes given; relative paths in them resolve from the first one's folder. ``score_start``
    (a quantize or prune command with ``--eval``): the evaluations after the stage, with their ``--set`` params,
    also run before it, so the starting model's figures sit beside the result and the change."""
    from llmx.core.plugins import host

    folder = Path(files[0]).parent if files else None
    out = apply_sets(raw, sets or [], default_stage)
    if score_start and len(out.get("pipeline") or []) > 1:
        out["pipeline"] = [copy.deepcopy(e) for e in out["pipeline"][1:]] + out["pipeline"]
    return resolve(out, host().methods, source=source, folder=folder)
