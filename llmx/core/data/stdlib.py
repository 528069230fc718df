"""The Python standard library's own source: a code corpus every machine with Python has.

Tests, generated tables and vendored packages are skipped; files are split into train/validation by a
hash of their path relative to the standard library, so the split is the same on every machine.

The index (the files in order, their sizes and modification times, and the split) is built once per process by a
walk that never enters a skipped folder (about 650 entries instead of the ~13,000 a full ``rglob`` visits); its
``key`` names the Python, the folder and every file's path, size and time, and keys the token cache
(``llmx.core.data.tokens``), so a second evaluation reads neither the folder's files nor tokenizes them.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from llmx.core.data import in_validation

SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "pydoc_data", "encodings"}
INDEX_FORMAT = 1  # part of every key: a change to what the index holds or how files are read starts a new cache


@dataclass(frozen=True)
class Split:
    """One split's files (absolute paths, in the corpus order) and the key of their contents."""

    paths: tuple[Path, ...]
    key: str

    def read(self, i: int) -> str:
        return read(self.paths[i])


@functools.cache
def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


@functools.lru_cache(maxsize=8)
def _index(root: str) -> tuple[tuple[str, int, int], ...]:
    """``(relative posix path, size, mtime_ns)`` of every corpus file under ``root``, in the order ``sorted`` puts
    their ``Path``s (part by part). Skipped folders are never entered; symlinked folders are not followed (as
    ``Path.rglob`` does not)."""
    found: list[tuple[tuple[str, ...], int, int]] = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
        rel_dir = os.path.relpath(folder, root)
        parts = () if rel_dir == "." else tuple(Path(rel_dir).parts)
        for name in names:
            if not name.endswith(".py") or name.startswith(("test_", "_sysconfigdata")):
                continue
            try:
                st = os.stat(os.path.join(folder, name))
            except OSError:  # a broken link: nothing to read
                continue
            found.append((parts + (name,), st.st_size, st.st_mtime_ns))
    fold = str.casefold if os.name == "nt" else str  # how Path orders names on this system
    found.sort(key=lambda f: tuple(map(fold, f[0])))
    return tuple(("/".join(parts), size, mtime) for parts, size, mtime in found)


def _root(root: Path | str | None) -> Path:
    return Path(root or stdlib_root())


def files(root: Path | None = None) -> list[Path]:
    base = _root(root)
    return [base.joinpath(rel) for rel, _, _ in _index(str(base))]


@functools.lru_cache(maxsize=16)
def corpus(split: str, root: Path | str | None = None) -> Split:
    """The files of ``split`` ('train' or 'validation') and their key: a hash of the Python (version,
    implementation, platform), the folder and each file's relative path, size and mtime: any edit, addition or
    removal changes it."""
    base = _root(root)
    want_val = split == "validation"
    entries = [e for e in _index(str(base)) if in_validation(e[0]) == want_val]
    ident = {"format": INDEX_FORMAT, "python": sys.version, "implementation": sys.implementation.cache_tag,
             "platform": platform.system(), "root": str(base), "split": split, "files": entries}
    key = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()
    return Split(tuple(base.joinpath(rel) for rel, _, _ in entries), key)


def documents(split: str, root: Path | None = None) -> list[str]:
    return [read(p) for p in corpus(split, _root(root)).paths]
