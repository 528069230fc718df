"""``llmx tasks [show NAME]``: the evaluation tasks that plugins register."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from llmx.cli.app import examples
from llmx.cli.output import emit, stdout, table

tasks_app = typer.Typer(help="List the evaluation tasks that plugins provide, or show one with example rows.",
                        no_args_is_help=False, invoke_without_command=True)


@tasks_app.callback(epilog=examples("llmx tasks", "llmx --json tasks", "llmx tasks show humaneval --rows 1",
                                     "llmx eval --method task --set task=humaneval --set limit=10 --model ref:llama",
                                     "llmx analyze --method task --set task=brackets --model ref:llama"))
def tasks(ctx: typer.Context) -> None:
    """List the evaluation tasks (run one with: llmx eval --method task --set task=NAME)."""
    if ctx.invoked_subcommand:
        return
    from llmx.core.plugins import host

    data = [s.describe() for s in sorted(host().tasks.values(), key=lambda s: s.name)]
    emit(data, lambda: table("tasks", ["name", "kind", "splits", "summary"],
                             [[d["name"], d["kind"], d["splits"], d["summary"]]
                              for d in data]))


@tasks_app.command("show", epilog=examples("llmx tasks show brackets", "llmx tasks show humaneval --rows 2",
                                            "llmx --json tasks show brackets --split train"))
def show(name: Annotated[str, typer.Argument(help="Task name.")],
         split: Annotated[Optional[str], typer.Option("--split", help="Default: the task's last split.")] = None,
         rows: Annotated[int, typer.Option("--rows", min=0, help="Example rows to print.")] = 2) -> None:
    """Show one task: kind, splits, decoding defaults, metrics and its first rows."""
    from llmx.core.eval import tasks as runner
    from llmx.core.pipeline import require_modules
    from llmx.core.plugins import host

    spec = host().task(name)
    require_modules(f"task '{spec.name}'", spec.requires)
    d = spec.describe()
    d["rows"] = runner.rows(spec, split or spec.splits[-1], 0, rows)

    def render() -> None:
        out = stdout()
        out.print(f"[bold]{d['name']}[/]  ({d['kind']})  plugin: {d['plugin']}")
        out.print(d["summary"], highlight=False)
        out.print(f"splits: {', '.join(d['splits'])}   metrics: {', '.join(d['metrics'])}", highlight=False)
        out.print(f"defaults: samples {d['samples']}, temperature {d['temperature']}, max_new_tokens "
                  f"{d['max_new_tokens']}, stop {d['stop']!r}", highlight=False)
        for row in d["rows"]:
            out.rule()
            out.print(row, highlight=False)

    emit(d, render)


def register(app: typer.Typer) -> None:
    app.add_typer(tasks_app, name="tasks")
