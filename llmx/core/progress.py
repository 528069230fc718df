"""Progress on stderr, so stdout stays clean for ``--json``: a bar on a terminal, and off one (a log file, CI) a line
every ``LLMX_PROGRESS_SECONDS`` (default 30) with the count, elapsed time and an estimate of what is left. Lines go
to the ``llmx.progress`` logger, which the CLI shows unless ``-q`` or ``--json``."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")
log = logging.getLogger("llmx.progress")


def note(message: str) -> None:
    """One line about long work starting."""
    log.info(message)


def track(items: Iterable[T], total: int | None = None, description: str = "", enabled: bool = True) -> Iterator[T]:
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    if not enabled:
        yield from items
    elif sys.stderr.isatty():
        yield from _bar(items, total, description)
    else:
        yield from _lines(items, total, description, _every())


def _every() -> float:
    try:
        return max(0.0, float(os.environ.get("LLMX_PROGRESS_SECONDS", 30)))
    except ValueError:
        return 30.0


def _bar(items: Iterable[T], total: int | None, description: str) -> Iterator[T]:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn()]
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=total)
        for item in items:
            yield item
            bar.advance(task)


def _lines(items: Iterable[T], total: int | None, description: str, every: float) -> Iterator[T]:
    t0 = last = time.monotonic()
    for done, item in enumerate(items, 1):
        yield item
        now = time.monotonic()
        if now - last >= every:
            last = now
            left = f", about {clock((now - t0) / done * (total - done))} left" if total else ""
            of = f"/{total} ({100 * done // total}%)" if total else ""
            log.info("%s: %s%s, %s elapsed%s", description or "progress", done, of, clock(now - t0), left)


def clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m // 60}h{m % 60:02d}m" if m >= 60 else (f"{m}m{s:02d}s" if m else f"{s}s")
