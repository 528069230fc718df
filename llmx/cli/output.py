"""Process-wide CLI state and output: human tables on stdout, messages on stderr, or one JSON document."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class State:
    json: bool = False
    verbose: int = 0
    quiet: bool = False
    dry_run: bool = False

    @property
    def show_progress(self) -> bool:
        return not (self.json or self.quiet)  # a bar on a terminal, periodic lines off one


state = State()


def stdout():
    from rich.console import Console

    return Console(soft_wrap=True)


def stderr():
    from rich.console import Console

    return Console(stderr=True, soft_wrap=True)


def emit(data: Any, render: Callable[[], None] | None = None) -> None:
    """``--json``: exactly one JSON document on stdout; otherwise call ``render`` (or pretty-print)."""
    if state.json:
        sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    elif render is not None:
        render()
    else:
        stdout().print_json(data=data, default=str)


def info(message: str) -> None:
    if not (state.quiet or state.json):
        stderr().print(message, highlight=False)


def error(lines: list[str], code: int) -> None:
    """One clear message on stderr (plus hints); under ``--json`` also the error document on stdout."""
    from rich.markup import escape

    console = stderr()
    console.print(f"[bold red]error:[/] {escape(lines[0])}", highlight=False)
    for line in lines[1:]:
        console.print(escape(line), highlight=False)
    if state.json:
        error_document(lines, code)


def error_document(lines: list[str], code: int) -> None:
    """The ``--json`` answer of a failure: one JSON document on stdout."""
    sys.stdout.write(json.dumps({"ok": False, "exit_code": code, "error": lines[0], "details": lines[1:]}) + "\n")


def table(title: str | None, columns: list[str], rows: list[list[Any]]) -> None:
    """Cells are plain text: ``[failed]`` in a value is shown, not read as rich markup."""
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=title, show_lines=False)
    for c in columns:
        t.add_column(escape(c), overflow="fold")
    for r in rows:
        t.add_row(*[escape(fmt(v)) for v in r])
    stdout().print(t)


def fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.4e}"
    if v is None:
        return "-"
    if isinstance(v, (list, tuple)):
        return ", ".join(map(str, v))
    return str(v)
