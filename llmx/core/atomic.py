"""Atomic file and folder writes: a reader (or an interrupted run) never sees a half-written artifact."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any


def write_bytes(path: str | Path, data: bytes) -> Path:
    """Write to a temporary file beside ``path``, fsync, then rename over it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


@functools.lru_cache(maxsize=1)
def _umask() -> int:
    """The process umask, read once (tempfile creates 0600 files and 0700 folders whatever it is: a shared cache or
    runs folder would be unreadable to others): from ``/proc/self/status`` where Linux has it, else by setting it
    for an instant (another thread creating a file then would get umask 0)."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/self/status") as f:
            return int(next(line for line in f if line.startswith("Umask:")).split()[1], 8)
    mask = os.umask(0)
    os.umask(mask)
    return mask


def conform(path: str | Path) -> Path:
    """Give ``path`` (and, for a folder, everything in it) the one rule for what llmx writes: files
    ``0666 & ~umask``, folders ``0777 & ~umask``, whatever wrote them (safetensors writes 0600 files)."""
    path = Path(path)
    for p in [path, *path.rglob("*")] if path.is_dir() else [path]:
        if not p.is_symlink():
            os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~_umask())
    return path


def leftovers(path: str | Path) -> list[Path]:
    """Temporary files or folders an interrupted write of ``path`` left beside it."""
    path = Path(path)
    return sorted(path.parent.glob(f".{path.name}.*.tmp")) + [p for p in [path.with_name(f".{path.name}.old")]
                                                               if p.exists()]


def write_text(path: str | Path, text: str) -> Path:
    return write_bytes(path, text.encode())


def write_json(path: str | Path, obj: Any) -> Path:
    return write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def write_jsonl(path: str | Path, rows: Iterable[Any]) -> Path:
    """One JSON object per line."""
    return write_text(path, "".join(json.dumps(r, default=str) + "\n" for r in rows))


@contextlib.contextmanager
def folder(path: str | Path) -> Iterator[Path]:
    """Yield a temporary folder beside ``path``; on success it replaces ``path``, on any error
    (Ctrl-C included) it is removed and ``path`` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    old = path.with_name(f".{path.name}.old")
    try:
        yield tmp
        conform(tmp)
        if path.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        if not path.exists() and old.exists():  # a signal between the two renames: the old folder goes back
            os.replace(old, path)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
