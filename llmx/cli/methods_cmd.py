"""``llmx methods [show NAME]`` and ``llmx plugins``."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from llmx.cli.app import examples
from llmx.cli.output import emit, stdout, table

methods_app = typer.Typer(help="List the methods that plugins provide, or show one.", no_args_is_help=False,
                          invoke_without_command=True)


@methods_app.callback(epilog=examples("llmx methods", "llmx methods --stage quantize", "llmx --json methods",
                                       "llmx methods show rtn"))
def methods(ctx: typer.Context,
            stage: Annotated[Optional[str], typer.Option("--stage", help="Only methods for this stage.")] = None) -> None:
    """List the methods that plugins provide (piped: one line per method, name, stages and summary)."""
    if ctx.invoked_subcommand:
        return
    from llmx.core.plugins import host
    from llmx.core.spec import Stage
    from llmx.errors import UsageError

    try:
        wanted = Stage(stage) if stage else None
    except ValueError:
        raise UsageError(f"unknown stage '{stage}'; stages: {', '.join(s.value for s in Stage)}") from None
    specs = [s for s in host().methods if wanted is None or wanted in s.stages]
    data = [{"name": s.name, "stages": [x.value for x in s.stages], "aliases": list(s.aliases), "summary": s.summary,
             "paper": s.paper, "plugin": s.plugin, "requires": list(s.requires)} for s in specs]
    if sys.stdout.isatty():
        emit(data, lambda: table("methods", ["name", "stages", "summary", "plugin"],
                                 [[d["name"], d["stages"], d["summary"], d["plugin"]] for d in data]))
    else:  # piped: whole lines, for grep, wc and cut; never wrapped or cut at a terminal width
        emit(data, lambda: sys.stdout.write(lines(data)))


def lines(data: list[dict]) -> str:
    """One line per method: name, stages (comma-joined) and summary in aligned columns, summary whole."""
    stages = [",".join(d["stages"]) for d in data]
    wide = (max((len(d["name"]) for d in data), default=0), max(map(len, stages), default=0))
    return "".join(f"{d['name']:<{wide[0]}}  {s:<{wide[1]}}  {' '.join(d['summary'].split())}".rstrip() + "\n"
                   for d, s in zip(data, stages, strict=True))


@methods_app.command("show", epilog=examples("llmx methods show rtn", "llmx methods show clover",
                                              "llmx --json methods show perplexity"))
def show(name: Annotated[str, typer.Argument(help="Method name or alias.")]) -> None:
    """Show one method: stages, paper, requirements and every parameter with its default (per stage, when a
    method serves several stages with different parameters)."""
    from llmx.core import params_table
    from llmx.core.plugins import host

    specs = host().methods.variants(name)
    found = [s.describe() for s in specs]

    def render() -> None:
        out = stdout()
        for spec, d in zip(specs, found, strict=True):
            out.print(f"[bold]{d['name']}[/]  ({', '.join(d['stages'])})  plugin: {d['plugin']}")
            out.print(d["summary"], highlight=False)
            if d["paper"]:
                out.print(f"paper: {d['paper']}", highlight=False)
            if d["aliases"]:
                out.print(f"aliases: {', '.join(d['aliases'])}")
            if d["requires"]:
                out.print(f"requires: {', '.join(d['requires'])}")
            # the same rows as the docs' parameter tables (scripts/gen_docs.py)
            table(f"params ({', '.join(d['stages'])})", list(params_table.COLUMNS),
                  [list(r) for r in params_table.rows(spec.config)])

    emit(found, render)


def plugins() -> None:
    """List plugins: built-in, from entry points (group `llmx`) and loose files, with their status (every method's
    parameter model is imported here, so a plugin whose config does not load shows as broken, with why)."""
    from llmx.core.plugins import host

    h = host()
    h.check_configs()
    data = [i.as_dict() for i in h.infos]
    emit(data, lambda: table("plugins", ["name", "source", "status", "version", "provides", "error"],
                             [[d["name"], d["source"], d["status"], d["version"],
                               d["methods"] + d["models"] + d["datasets"] + d["tasks"], d["error"]] for d in data]))


def register(app: typer.Typer) -> None:
    app.add_typer(methods_app, name="methods")
    app.command(epilog=examples("llmx plugins", "LLMX_DISABLE_PLUGINS=myplugin llmx plugins",
                                "llmx --plugins-dir ./my_plugins plugins", "LLMX_STRICT_PLUGINS=1 llmx plugins"))(plugins)
