"""The zoo's folder: where entries live (each with a SHA-256 manifest, ``core.manifest``), and one lock per entry so
that concurrent builds of the same model train it once."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from llmx.errors import UsageError

INFO = "zoo.json"
log = logging.getLogger("llmx.zoo")


def cache_root() -> Path:
    base = os.environ.get("LLMX_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "llmx")
    return Path(base) / "zoo"


def info(entry: Path) -> dict:
    return json.loads((entry / INFO).read_text())


@contextlib.contextmanager
def locked(entry: Path) -> Iterator[None]:
    """Hold the entry's lock (``.locks/ENTRY.lock`` beside it); a second builder waits, then finds it built.
    An unwritable cache fails here, before any training. The lock file goes with its holder
    (``.locks`` stays: removing it could fail another builder between making it and locking in it)."""
    from filelock import Timeout

    from llmx.core.runs import drop, take

    folder = entry.parent / ".locks"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        try:
            lock = take(folder / f"{entry.name}.lock", timeout=0)
        except Timeout:
            log.info("waiting for another process building %s", entry.name)
            lock = take(folder / f"{entry.name}.lock")
    except OSError as exc:  # read-only, not a folder, full: before any training
        raise UsageError(f"cannot write the zoo cache {entry.parent}: {exc.strerror or exc}",
                         hint="Set LLMX_CACHE_DIR to a writable folder.") from exc
    try:
        yield
    finally:
        drop(lock)  # removes the lock file, while still held (``runs.drop``: race-safe)
