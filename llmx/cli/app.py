"""The ``llmx`` command: global options, error handling and exit codes. No torch import here."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import traceback
from pathlib import Path
from typing import Annotated, Optional

import typer

from llmx import __version__
from llmx.cli.output import error, state
from llmx.errors import LlmxError


def examples(*lines: str) -> str:
    """An epilog of copy-pasteable examples, one per line (``\\b``: click keeps the paragraph unwrapped)."""
    return "Examples:\n\n\b\n" + "\n".join(f"  {line}" for line in lines)


app = typer.Typer(
    name="llmx",
    help="Apply, compare and ship LLM efficiency and alignment techniques, one plugin per paper.",
    epilog=examples(
        "llmx methods",
        "llmx quantize --method rtn --bits w4a16 --model tiny:llama --eval perplexity",
        "llmx run configs/smoke/rtn.yaml --set seed=1",
        "llmx report runs/*",
    ),
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from llmx.cli.output import emit

        emit({"version": __version__}, lambda: typer.echo(f"llmx {__version__}"))
        raise typer.Exit(0)


@app.callback()
def _global(
    json_: Annotated[bool, typer.Option("--json", help="Print exactly one JSON document on stdout.")] = False,
    verbose: Annotated[int, typer.Option("--verbose", "-v", count=True, help="More logging; tracebacks on error.")] = 0,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only errors on stderr; no progress bars.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Resolve and validate, print the config and the training "
                                          "stages' memory plan (llmx plan), run nothing.")] = False,
    plugins_dir: Annotated[
        Optional[list[Path]], typer.Option("--plugins-dir", help="Also load loose *.py plugins from this folder.")
    ] = None,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version and exit.")
    ] = False,
) -> None:
    state.json, state.verbose, state.quiet, state.dry_run = json_, verbose, quiet, dry_run
    _logging(verbose, quiet)
    from llmx.core import plugins

    plugins.configure(plugins_dir or [])


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time of the record (it may have been replaced since)."""

    _llmx = True
    threshold = logging.WARNING

    def filter(self, record: logging.LogRecord) -> bool:  # progress records pass at INFO whatever the threshold
        return record.levelno >= self.threshold or record.name == "llmx.progress"

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def _logging(verbose: int, quiet: bool) -> None:
    level = logging.ERROR if quiet else (logging.WARNING, logging.INFO, logging.DEBUG)[min(verbose, 2)]
    root = logging.getLogger("llmx")
    root.setLevel(logging.DEBUG)
    if not any(getattr(h, "_llmx", False) for h in root.handlers):
        root.addHandler(_StderrHandler())
    for h in root.handlers:
        if getattr(h, "_llmx", False):
            h.threshold = level
    # progress lines (off a terminal) and notes on long work: shown by default, hidden by -q and --json
    logging.getLogger("llmx.progress").setLevel(logging.WARNING if quiet or state.json else logging.INFO)
    if verbose < 2:
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


def _register() -> None:
    from llmx.cli import (
        compare_cmd,
        config_cmd,
        env_cmd,
        export_cmd,
        methods_cmd,
        plan_cmd,
        report_cmd,
        run_cmd,
        tasks_cmd,
        zoo_cmd,
    )

    for module in (run_cmd, plan_cmd, export_cmd, methods_cmd, tasks_cmd, compare_cmd, config_cmd, report_cmd, zoo_cmd,
                   env_cmd):
        module.register(app)


_register()


VALUED_FLAG = "--plugins-dir"
GLOBAL_FLAGS = ("--json", "--dry-run", "--quiet", "-q", "--verbose", "-v", "-vv", "-vvv")


def hoist_global_flags(argv: list[str]) -> list[str]:
    """Let global flags stand anywhere (``llmx methods --json``, ``llmx methods --plugins-dir DIR``): move them
    before the command. Arguments after ``--`` are left alone."""
    end = argv.index("--") if "--" in argv else len(argv)
    flags, rest, i = [], [], 0
    while i < end:
        a = argv[i]
        if a in GLOBAL_FLAGS or a.startswith(f"{VALUED_FLAG}="):
            flags.append(a)
        elif a == VALUED_FLAG and i + 1 < end:
            flags += [a, argv[i + 1]]
            i += 1
        else:
            rest.append(a)
        i += 1
    return flags + rest + argv[end:]


def main(argv: list[str] | None = None) -> int:
    """Entry point: returns the exit code (0 ok, 1 failed, 2 usage, 3 missing requirement, 130 interrupted, 143
    terminated by SIGTERM, which ends a run as Ctrl-C does)."""
    from llmx.core.signals import EXIT_CODE, Terminated, terminating_raises

    try:
        with terminating_raises():
            return _main(argv)
    except Terminated:  # between the handler's install and _main's own handling: still one line
        error(["interrupted (SIGTERM)"], EXIT_CODE)
        return EXIT_CODE


def _main(argv: list[str] | None) -> int:
    from typer import _click
    from typer.main import get_command

    from llmx.core.signals import EXIT_CODE, Terminated

    command = get_command(app)
    args = hoist_global_flags(list(sys.argv[1:] if argv is None else argv))
    end = args.index("--") if "--" in args else len(args)
    state.json = "--json" in args[:end]  # before parsing: a parse error must still answer in JSON
    held = io.StringIO()  # under --json, stdout is released only for the one document (typer prints help text)
    try:
        with contextlib.redirect_stdout(held) if state.json else contextlib.nullcontext():
            rv = command.main(args=args, prog_name="llmx", standalone_mode=False)
        sys.stdout.write(held.getvalue())
        if rv == 130:  # typer turns Ctrl-C inside a command into a silent exit 130
            raise KeyboardInterrupt
        return rv if isinstance(rv, int) else 0
    except _click.exceptions.ClickException as exc:
        from typer import rich_utils

        if state.json:
            message = "missing command" if isinstance(exc, _click.exceptions.NoArgsIsHelpError) else exc.format_message()
            error([message], exc.exit_code)
            return exc.exit_code
        rich_utils.rich_format_error(exc)
        return exc.exit_code
    except (typer.Abort, KeyboardInterrupt):  # click turns Ctrl-C into Abort
        error(["interrupted"], 130)
        return 130
    except Terminated:
        error(["interrupted (SIGTERM)"], EXIT_CODE)
        return EXIT_CODE
    except LlmxError as exc:
        if state.verbose:
            traceback.print_exc()
        error(exc.lines(), exc.exit_code)
        return exc.exit_code
    except Exception as exc:  # noqa: BLE001 - the last line of defence: one message, traceback with -v
        if state.verbose:
            traceback.print_exc()
        error([f"internal error: {type(exc).__name__}: {exc}", "Run with -v for the traceback."], 1)
        return 1

