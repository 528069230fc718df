"""``llmx zoo build|list``: the trained reference models."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from llmx.cli.app import examples
from llmx.cli.output import emit, state, stdout, table

zoo_app = typer.Typer(help="Build and list the reference models trained from real text (ref:NAME).", no_args_is_help=True)


@zoo_app.command("build", epilog=examples("llmx zoo build llama", "llmx zoo build mamba2 --preset bench",
                                           "llmx zoo build llama --preset test --seed 1", "llmx --json zoo build moe --force"))
def build(
    name: Annotated[str, typer.Argument(help="llama, mamba, mamba2 or moe.")],
    preset: Annotated[str, typer.Option("--preset", help="small (default), bench (longer) or test (seconds).")] = "small",
    steps: Annotated[Optional[int], typer.Option("--steps", help="Override the preset's maximum training steps.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed: the same seed gives identical weights.")] = 0,
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if a verified entry exists.")] = False,
) -> None:
    """Train (or reuse) a reference model on the standard-library corpus and report its figures."""
    from llmx.core import zoo

    req = zoo.RefRequest(name.removeprefix("ref:"), preset, seed, steps)
    path = zoo.ensure(req, force=force, show_progress=state.show_progress)
    data = {"path": str(path), **zoo.info(path)}
    keys = ("name", "preset", "params", "vocab", "steps_run", "best_step", "train_seconds", "val_perplexity",
            "unigram_perplexity")
    emit(data, lambda: (table(None, ["figure", "value"], [[k, data[k]] for k in keys]),
                        stdout().print(f"cached at {path}", highlight=False)))


@zoo_app.command("list", epilog=examples("llmx zoo list", "llmx --json zoo list"))
def list_() -> None:
    """List cached reference models with their validation figures."""
    from llmx.core import zoo

    data = zoo.entries()
    emit(data, lambda: table(f"zoo ({zoo.cache_root()})", ["entry", "ok", "params", "val ppl", "unigram ppl", "seconds"],
                             [[d["entry"], d["problem"] or "ok", d.get("params"), d.get("val_perplexity"),
                               d.get("unigram_perplexity"), d.get("train_seconds")] for d in data]))


def register(app: typer.Typer) -> None:
    app.add_typer(zoo_app, name="zoo")
