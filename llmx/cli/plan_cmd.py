"""``llmx plan``: the per-rank memory of a run's training stages, planned on the meta device before launch (the math
is ``llmx.core.train.plan``); ``--dry-run`` of a training run prints the same plan."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from llmx.cli import options as o
from llmx.cli.app import examples
from llmx.cli.output import emit, info, stdout

if TYPE_CHECKING:
    from llmx.core.config import ResolvedRun

WorldSize = Annotated[Optional[int], typer.Option("--world-size", "-w", help="Processes (one per GPU) the stage "
                                                  "trains on; default: $WORLD_SIZE, else 1.", show_default=False)]


def plan(
    configs: Annotated[Optional[list[str]], typer.Argument(help="Run config YAML file(s), merged in order.",
                                                           show_default=False)] = None,
    method: o.Method = None, model: o.Model = None, sets: o.Sets = None, dtype: o.Dtype = None,
    device: o.Device = None, world_size: WorldSize = None,
) -> None:
    """Plan each training stage's memory per rank (weights, gradients, optimizer state, reference model, activations,
    logits, FSDP / DDP buffers) from the model's config on the meta device: no weights are read or allocated.
    `--method` plans that one stage (its params from the config files, then --set); `--set` takes the stage's params
    (strategy, offload, precision, adapter, lora.r, batch_size, max_len / max_length / seq_len,
    gradient_checkpointing). The device is cuda unless --device or the config says otherwise."""
    from llmx.cli.build import apply_flags, merged_files, resolve_cli, stage_pipeline
    from llmx.errors import UsageError

    if not configs and not method:
        raise UsageError("plan needs a run config or --method", hint="e.g. llmx plan --method sft --model MODEL")
    size = resolve_world_size(world_size)
    files = [Path(c) for c in configs or []]
    raw = merged_files(files)
    device = device or (None if "device" in raw else "cuda")  # a plan is for an accelerator unless told otherwise
    raw = apply_flags(raw, model=model, dtype=dtype, device=device)
    if method:
        raw = stage_pipeline(raw, _training_stage(method), method, {}, None)
    raw = _placeholder_data(raw)
    run = resolve_cli(raw, sets, 0 if method else None, source=", ".join(configs or []) or None, files=files or None)
    plans = run_plans(run, size)
    if not plans:
        raise UsageError("no training stage to plan (train or align) in this pipeline")
    emit({"ok": True, "model": run.config.model, "world_size": size, "stages": plans}, lambda: render(plans))


def resolve_world_size(given: int | None) -> int:
    from llmx.errors import UsageError

    if given is None:
        raw = os.environ.get("WORLD_SIZE", "1")
        try:
            given = int(raw)
        except ValueError:
            raise UsageError(f"WORLD_SIZE={raw!r} is not a whole number") from None
    if given < 1:
        raise UsageError(f"--world-size must be at least 1, not {given}")
    return given


def run_plans(run: ResolvedRun, world_size: int) -> list[dict[str, Any]]:
    """One JSON-ready plan per training stage of ``run``."""
    from llmx.core.train.plan import plan_run

    return [{"index": s.index, "method": s.spec.name, "stage": s.stage.value, **p.as_dict()}
            for s, p in plan_run(run, world_size)]


def dry_run_plans(run: ResolvedRun) -> list[dict[str, Any]]:
    """``--dry-run``'s plans ($WORLD_SIZE processes): a model or stage the planner cannot read is a note on stderr,
    not a failed dry run."""
    from llmx.errors import UsageError

    try:
        return run_plans(run, resolve_world_size(None))
    except UsageError as exc:
        info(f"no memory plan: {exc.message}")
        return []


def render(plans: list[dict[str, Any]]) -> None:
    from llmx.cli.output import table

    for p in plans:
        scale = max([v["device"] + v["cpu"] for v in p["parts"].values()] + [1])
        unit, div = ("GiB", 1 << 30) if scale >= 1 << 30 else ("MiB", 1 << 20)

        def size(b: int, div: int = div) -> str:
            return f"{b / div:.2f}" if b else "-"

        title = (f"{p['index']}:{p['method']} per rank of {p['world_size']} ({p['strategy']}, {p['precision']}"
                 f"{', lora' if p['adapter'] == 'lora' else ''}); {p['parameters']:,} parameters, "
                 f"{p['trainable']:,} trained; micro-batch {p['sequences']} x {p['length']} tokens")
        rows = [[name, size(v["device"]), size(v["cpu"]), v["note"]] for name, v in p["parts"].items()]
        rows += [["total (sum)", size(p["total"]["device"]), size(p["total"]["cpu"]), "every part at once"],
                 ["peak", size(p["peak"]["device"]), size(p["peak"]["cpu"]), "by phase: forward/backward or step"]]
        table(title, ["part", f"device {unit}", f"CPU {unit}", "what"], rows)
        for note in p["notes"]:
            stdout().print(f"note: {note}", highlight=False)


def _training_stage(method: str) -> Any:
    from llmx.core.plugins import host
    from llmx.core.spec import Stage
    from llmx.errors import UsageError

    methods = host().methods
    spec = methods.get(method)  # an unknown name: its did-you-mean
    for stage in (Stage.TRAIN, Stage.ALIGN):
        if any(stage in s.stages for s in methods if s.name == spec.name):
            return stage
    raise UsageError(f"{method} is not a training method ({', '.join(s.value for s in spec.stages)}): only train "
                     "and align stages are planned")


def _placeholder_data(raw: dict[str, Any]) -> dict[str, Any]:
    """A stage whose params require ``data`` gets a stand-in: the plan reads no rows (``--set data=...`` still
    sets it)."""
    from llmx.core.plugins import host
    from llmx.errors import UsageError

    for entry in raw.get("pipeline") or []:
        if not isinstance(entry, dict) or "data" in (entry.get("params") or {}):
            continue
        try:
            fields = host().methods.get(str(entry.get("method")), entry.get("stage")).config.model_fields
        except UsageError:
            continue  # an unknown method: resolving reports it
        if "data" in fields and fields["data"].is_required():
            entry["params"] = {**(entry.get("params") or {}), "data": "(not read by plan)"}
    return raw


def register(app: typer.Typer) -> None:
    app.command(epilog=examples("llmx plan configs/smoke/sft.yaml",
                                "llmx plan --method sft --model ./llama-3-8b --set max_length=2048 --set batch_size=4",
                                "llmx plan --method dpo --model ./llama-3-8b --world-size 8 --set strategy=fsdp "
                                "--set precision=bf16-mixed --set gradient_checkpointing=true",
                                "llmx plan --method dpo --model ./llama-3-8b --set adapter=lora --set lora.r=16",
                                "llmx --json plan configs/smoke/align_dpo.yaml -w 2",
                                "llmx --dry-run run configs/smoke/sft.yaml"))(plan)
