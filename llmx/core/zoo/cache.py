"""The zoo's folder: where entries live, their SHA-256 manifests, and one lock per entry so that concurrent builds
of the same model train it once."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from llmx.errors import UsageError

MANIFEST, INFO = "manifest.json", "zoo.json"
log = logging.getLogger("llmx.zoo")


def cache_root() -> Path:
    base = os.environ.get("LLMX_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "llmx")
    return Path(base) / "zoo"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_manifest(folder: Path) -> None:
    manifest = {p.name: sha256(p) for p in sorted(folder.iterdir()) if p.is_file()}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def verify(entry: Path) -> str | None:
    """None when the entry is complete and intact, else what is wrong with it."""
    if not entry.is_dir():
        return "missing"
    try:
        manifest = json.loads((entry / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError):
        return "no readable manifest"
    for name, digest in manifest.items():
        f = entry / name
        if not f.is_file():
            return f"{name} is missing"
        if sha256(f) != digest:
            return f"{name} does not match its checksum"
    return None


def info(entry: Path) -> dict:
    return json.loads((entry / INFO).read_text())


@contextlib.contextmanager
def locked(entry: Path) -> Iterator[None]:
    """Hold the entry's lock (``.locks/ENTRY.lock`` beside it); a second builder waits, then finds it built.
    An unwritable cache fails here, before any training."""
    from filelock import FileLock, Timeout

    folder = entry.parent / ".locks"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(folder / f"{entry.name}.lock"))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            log.info("waiting for another process building %s", entry.name)
            lock.acquire()
    except PermissionError as exc:
        raise UsageError(f"cannot write the zoo cache {entry.parent}: {exc.strerror}",
                         hint="Set LLMX_CACHE_DIR to a writable folder.") from exc
    try:
        yield
    finally:
        lock.release()
