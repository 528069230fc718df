"""The Python standard library's own source: a code corpus every machine with Python has.

Tests, generated tables and vendored packages are skipped; files are split into train/validation by a
hash of their path relative to the standard library, so the split is the same on every machine.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

from llmx.core.data import in_validation

SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "pydoc_data", "encodings"}


def files(root: Path | None = None) -> list[Path]:
    root = Path(root or sysconfig.get_paths()["stdlib"])
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if SKIP_DIRS & set(rel.parts[:-1]) or rel.name.startswith(("test_", "_sysconfigdata")):
            continue
        out.append(path)
    return out


def documents(split: str, root: Path | None = None) -> list[str]:
    root = Path(root or sysconfig.get_paths()["stdlib"])
    want_val = split == "validation"
    return [p.read_text(encoding="utf-8", errors="replace") for p in files(root)
            if in_validation(p.relative_to(root).as_posix()) == want_val]
