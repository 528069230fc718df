"""``llmx config show|validate|init``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from llmx.cli import options as o
from llmx.cli.app import examples
from llmx.cli.output import emit, state, stderr, stdout

config_app = typer.Typer(help="Show, validate and create run configs.", no_args_is_help=True)


@config_app.command("show", epilog=examples("llmx config show configs/smoke/rtn.yaml --set seed=3",
                                             "llmx --json config show configs/smoke/rtn.yaml"))
def show(configs: Annotated[list[str], typer.Argument(help="Config file(s), merged in order.")],
         sets: o.Sets = None, model: o.Model = None, seed: o.Seed = None, device: o.Device = None) -> None:
    """Print the resolved config: defaults filled, files merged, flags and --set applied."""
    from llmx.cli.build import apply_flags, merged_files, resolve_cli

    raw = apply_flags(merged_files([Path(c) for c in configs]), model=model, seed=seed, device=device)
    run = resolve_cli(raw, sets, None, source=", ".join(configs), files=[Path(c) for c in configs])
    emit(run.to_dict(), lambda: stdout().print(run.to_yaml(), highlight=False))


@config_app.command("validate", epilog=examples("llmx config validate configs/smoke/*.yaml",
                                                 "llmx --json config validate my.yaml"))
def validate(configs: Annotated[list[str], typer.Argument(help="Config files to check, each on its own.")]) -> None:
    """Check each file (its params, then the data, files, models and checkpoints it names, as a run would before its
    first stage); report every problem with its path. Exit 2 if any file is invalid."""
    from llmx.cli.build import merged_files, resolve_cli
    from llmx.core.pipeline import check_references
    from llmx.errors import ConfigError, UsageError

    results = []
    for f in configs:
        try:
            check_references(resolve_cli(merged_files([Path(f)]), None, None, source=f, files=[Path(f)]))
            results.append({"file": f, "ok": True, "problems": []})
        except ConfigError as exc:
            results.append({"file": f, "ok": False, "problems": [str(p) for p in exc.problems]})
        except UsageError as exc:
            results.append({"file": f, "ok": False, "problems": [exc.message]})

    def render() -> None:
        err = stderr()
        for r in results:
            if r["ok"]:
                stdout().print(f"ok  {r['file']}", highlight=False)
            else:
                err.print(f"[red]invalid[/]  {r['file']}:", highlight=False)
                for p in r["problems"]:
                    err.print(f"  {p}", highlight=False, markup=False)

    emit(results, render)
    if not all(r["ok"] for r in results):
        raise typer.Exit(2)


DEFAULT_MODEL = "ref:llama"  # a config must run as written: the small reference model when --model is not given


@config_app.command("init", epilog=examples("llmx config init --method rtn -o quant.yaml",
                                             "llmx config init --method perplexity --model tiny:llama"))
def init(method: Annotated[str, typer.Option("--method", "-m", help="Method to configure.")],
         model: o.Model = None,
         stage: Annotated[Optional[str], typer.Option("--stage", help="Stage, if the method serves several.")] = None,
         output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write here instead of stdout.")] = None,
         force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False) -> None:
    """Write a complete config for a method, every parameter at its default."""
    from llmx.cli.build import resolve_cli
    from llmx.core import atomic
    from llmx.errors import UsageError

    raw = {"model": model or DEFAULT_MODEL, "pipeline": [{"method": method, **({"stage": stage} if stage else {})}]}
    run = resolve_cli(raw, None, None, source=None)
    if output is None:
        emit(run.to_dict(), lambda: stdout().print(run.to_yaml(), highlight=False))
        return
    if output.exists() and not force:
        raise UsageError(f"{output} exists; pass --force to overwrite")
    atomic.write_text(output, run.to_yaml())
    emit({"written": str(output)}, lambda: None if state.quiet else stderr().print(f"wrote {output}"))


def register(app: typer.Typer) -> None:
    app.add_typer(config_app, name="config")
