"""``llmx run`` and the per-stage sugar (``quantize``, ``prune``, ``train``, ``align``, ``decode``, ``eval``, ``analyze``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from llmx.cli import options as o
from llmx.cli.app import examples
from llmx.cli.output import emit, state, stdout

if TYPE_CHECKING:  # the help path imports neither pydantic models nor the config machinery
    from llmx.core.config import ResolvedRun

STAGE_HELP = {  # by stage name (llmx.core.spec.Stage values)
    "quantize": ("Quantize a model's weights (and activations).",
                     ("llmx quantize --method rtn --bits w4a16 --model tiny:llama --eval perplexity",
                      "llmx quantize --method quamba2 --bits w4a8 --model ref:mamba2 --eval perplexity",
                      "llmx quantize --method blockdialect --bits w4a4 --model ref:llama --eval perplexity",
                      "llmx quantize --method gptq --bits w4a16 --model MODEL --device cuda --onload cpu "
                      "--dtype bfloat16 --eval perplexity")),
    "prune": ("Prune a model (heads, channels, weights).", ("llmx prune --method clover --model ref:llama --set ratio=0.5",)),
    "train": ("Train or fine-tune a model (--data is the method's data where it takes one: sft's rows, lm's corpus).",
                  ("llmx train --method lm --model tiny:llama --set init=scratch --set save_at_tokens=[8192,16384]",
                   "llmx train --method sft --model ref:llama --data rows.jsonl --set adapter=lora --set lora.r=16",
                   "llmx train --method clover --model ref:llama",
                   "llmx train --method llava --model ref:llava --data conversations.json --set stage=2",
                   "llmx train --method crow --model runs/RUN/artifacts/0_sft/adapter --data defence.jsonl",
                   "llmx train --method feeder --model ref:llama-icl --data pool.jsonl --set outer_rounds=2",
                   "llmx train --method pasta --model ref:llama-bench --data runs/RUN/artifacts/0_pasta-annotate/"
                   "train.jsonl --set epochs=4 --set lr=1e-3",
                   "llmx train --method upcycle --model runs/RUN/artifacts/0_lm/series/tokens_1000000 "
                   "--set num_experts=8 --set top_k=2",
                   "llmx train --method cosd-tree --model ref:facts-code --set assistant=ref:facts-docs "
                   "--set task=api-facts --set examples=5")),
    "align": ("Align a model on preference data (--data is the .jsonl of preference rows).",
                  ("llmx align --method pipa --model ref:llama --data prefs.jsonl --set variant=m",
                   "llmx align --method pasta-bonbon --model PASTA_SFT_MODEL --data train.jsonl --set lam=inf")),
    "decode": ("Generate with a decoding or KV-cache method.", ("llmx decode --method lexico --model ref:llama "
                                                                "--set dictionary=runs/RUN/artifacts/0_lexico/"
                                                                "dictionaries.safetensors",
                                                                "llmx decode --method kivi --model ref:llama --set bits=4",
                                                                "llmx decode --method cosd --model ref:facts-code "
                                                                "--set assistant=ref:facts-docs --set task=api-facts",
                                                                "llmx decode --method pasta --model PASTA_SFT_MODEL "
                                                                "--data validation.jsonl --set positions=oracle")),
    "eval": ("Evaluate a model.", ("llmx eval --method perplexity --model tiny:llama --data stdlib",
                                   "llmx eval --method perplexity --model MODEL --device cuda --onload cpu",
                                   "llmx eval --method task --set task=humaneval --set limit=10 --model ref:llama",
                                   "llmx eval --method scenes-vqa --model ref:llava --set format=open",
                                   "llmx eval --method backdoor --model ADAPTER --data runs/RUN/artifacts/0_backdoor",
                                   "llmx eval --method icl --model ref:llama-icl --data pool.jsonl --set test=test.jsonl "
                                   "--set pool=feeder --set feeder=runs/RUN/artifacts/0_feeder")),
    "analyze": ("Analyze a model without changing it.", ("llmx analyze --method memory --model tiny:llama",
                                                        "llmx analyze --method task --set task=brackets --model ref:llama",
                                                        "llmx analyze --method backdoor --set poison_rate=0.2",
                                                        "llmx analyze --method icl-episodes --set cues=32",
                                                        "llmx analyze --method feeder --model ref:llama-icl --data pool.jsonl",
                                                        "llmx analyze --method pasta-annotate --model ref:llama-bench",
                                                        "llmx analyze --method upcycling-law --set runs=grid.jsonl")),
}


def execute(run: ResolvedRun) -> None:
    """Run (or, with --dry-run, only print) a resolved pipeline and show its metrics."""
    if state.dry_run:
        from llmx.cli.plan_cmd import dry_run_plans, render
        from llmx.core.pipeline import check_references

        check_references(run)
        plans = dry_run_plans(run)  # the training stages' memory per rank, as `llmx plan` prints it

        def show() -> None:
            stdout().print(run.to_yaml(), highlight=False)
            render(plans)

        emit({"dry_run": True, "config": run.to_dict(), **({"plan": plans} if plans else {})}, show)
        return
    from llmx.core.pipeline import execute as run_pipeline

    result = run_pipeline(run, show_progress=state.show_progress)
    emit({"ok": True, **result.as_dict()}, lambda: _render(result.as_dict()))


def _render(result: dict[str, Any]) -> None:
    """One column per stage, one row per metric: before/after figures sit side by side. In a run that quantizes,
    each evaluation says which model it measured (FP, or the bits of the last quantization before it), and a last
    column gives the change from the first evaluation to the last."""
    from llmx.cli.output import table

    stages = result["stages"]
    keys: list[str] = []
    for s in stages:
        keys += [k for k in s["metrics"] if k not in keys]
    names, bits = [], None
    quantizes = any(s["stage"] == "quantize" for s in stages)
    for s in stages:
        if s["stage"] == "quantize":
            bits = str(s["metrics"].get("bits", "quantized")).upper()
        tag = f" ({bits or 'FP'})" if quantizes and s["stage"] == "eval" else ""
        names.append(f"{s['index']}:{s['method']}{tag}")
    evals = [s for s in stages if s["stage"] == "eval"]
    measure = [(s["method"], s["metrics"].get("task")) for s in evals]  # a task eval is measured by its task
    same = len(evals) >= 2 and measure[0] == measure[-1]
    columns = ["metric", *names] + (["change"] if same else [])

    def change(k: str) -> str:
        a, b = evals[0]["metrics"].get(k), evals[-1]["metrics"].get(k)
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b)) or a == 0:
            return ""
        return f"{100 * (b - a) / abs(a):+.2f}%" if a != b else "0"

    rows = [["stage", *[s["stage"] for s in stages]], ["seconds", *[s["seconds"] for s in stages]]]
    rows += [[k, *[s["metrics"].get(k) for s in stages]] for k in keys]
    if same:
        rows = [r + ([""] if i < 2 else [change(r[0])]) for i, r in enumerate(rows)]
    table(None, columns, rows)
    stdout().print(f"run folder: {result['run_dir']}", highlight=False)


def run(
    configs: Annotated[list[str], typer.Argument(help="Run config YAML file(s), merged in order.", show_default=False)],
    sets: o.Sets = None, model: o.Model = None, seed: o.Seed = None, device: o.Device = None, onload: o.Onload = None,
    dtype: o.Dtype = None, data: o.Data = None, name: o.Name = None, output_dir: o.OutputDir = None,
) -> None:
    """Run a pipeline from config files."""
    from pathlib import Path

    from llmx.cli.build import apply_flags, merged_files, resolve_cli

    raw = apply_flags(merged_files([Path(c) for c in configs]), model=model, seed=seed, device=device, onload=onload,
                      dtype=dtype, data=data, name=name, output_dir=output_dir)
    execute(resolve_cli(raw, sets, None, source=", ".join(configs), files=[Path(c) for c in configs]))


def _stage_command(stage_name: str):
    def command(
        method: o.Method = None, model: o.Model = None, configs: o.Configs = None, sets: o.Sets = None,
        bits: o.Bits = None, evals: o.Evals = None, seed: o.Seed = None, device: o.Device = None,
        onload: o.Onload = None, dtype: o.Dtype = None, data: o.Data = None, name: o.Name = None,
        output_dir: o.OutputDir = None,
    ) -> None:
        from llmx.cli.build import apply_flags, merged_files, resolve_cli, stage_pipeline
        from llmx.core.spec import Stage
        from llmx.errors import UsageError

        stage = Stage(stage_name)
        if bits is not None and stage is not Stage.QUANTIZE:
            raise UsageError("--bits applies to quantize only; use --set for this stage's params")
        raw = apply_flags(merged_files(configs), model=model, seed=seed, device=device, onload=onload, dtype=dtype,
                          name=name or stage.value, output_dir=output_dir)
        params = {"bits": bits} if bits is not None else {}
        raw = stage_pipeline(raw, stage, method, params, evals if stage is not Stage.EVAL else None)
        if data is not None:
            from llmx.core.config import route_data
            from llmx.core.plugins import host

            raw = route_data(raw, stage, data, host().methods)
        source = ", ".join(str(c) for c in configs) if configs else None
        execute(resolve_cli(raw, sets, 0, source=source, files=configs,
                            score_start=bool(evals) and stage in (Stage.QUANTIZE, Stage.PRUNE)))

    command.__doc__ = (STAGE_HELP[stage_name][0] + " Builds the same RunConfig as `llmx run`;"
                       " `--set KEY=VALUE` sets the method's params; `--data` is the method's own `data` param where"
                       " it has one, else the run's text corpus.")
    return command


def register(app: typer.Typer) -> None:
    app.command(epilog=examples("llmx run configs/smoke/rtn.yaml", "llmx run base.yaml quant.yaml --set seed=2",
                                "llmx --dry-run run configs/smoke/rtn.yaml"))(run)
    for stage, (summary, lines) in STAGE_HELP.items():
        epilog = examples(*lines, f"llmx methods --stage {stage}")
        app.command(stage, short_help=summary, epilog=epilog)(_stage_command(stage))
