"""SHA-256 manifests of saved folders (zoo entries, models llmx saves): written last, checked on every load, so a
damaged or edited file is found instead of loaded (flipped packed codes would otherwise load silently)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

MANIFEST = "manifest.json"  # a zoo entry's
SAVED = "llmx-manifest.json"  # a model folder llmx saved (its own name: other tools' folders may hold a manifest.json)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write(folder: Path, name: str = MANIFEST) -> None:
    """Checksums of every file in ``folder`` (not in subfolders), into ``folder/name``."""
    sums = {p.name: sha256(p) for p in sorted(folder.iterdir()) if p.is_file() and p.name != name}
    (folder / name).write_text(json.dumps(sums, indent=2) + "\n")


def verify(folder: Path, name: str = MANIFEST) -> str | None:
    """None when every listed file is there and matches, else what is wrong."""
    if not folder.is_dir():
        return "missing"
    try:
        sums = json.loads((folder / name).read_text())
    except (OSError, json.JSONDecodeError):
        return "no readable manifest"
    for file, digest in sums.items():
        f = folder / file
        if not f.is_file():
            return f"{file} is missing"
        if sha256(f) != digest:
            return f"{file} does not match its checksum"
    return None
