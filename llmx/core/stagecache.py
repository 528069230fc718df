"""A stage's output folder kept for the next run that would build it again: under ``$LLMX_CACHE_DIR/stages/KIND/KEY``,
KEY a digest of everything that determines it (the model's files or zoo entry, the stage's params, the run's seed,
device and dtype, the llmx source and library versions). The arms of a comparison that open with the same data stage
on one seed then build it once (RePer's dialogues: five arms, one build), and a rerun reads it back."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from llmx.core import atomic


def key(ctx: Any, params: Any) -> str:
    """The digest of what determines the stage's output in this run."""
    from llmx.core.compare.provenance import inputs

    blob = {"inputs": inputs({"model": ctx.config.model}), "params": params.model_dump(mode="json"),
            "seed": ctx.config.seed, "device": str(ctx.device), "dtype": ctx.config.dtype}
    return hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _where(kind: str, digest: str) -> Path:
    from llmx.core.zoo.cache import cache_root

    return cache_root().parent / "stages" / kind / digest


def restore(kind: str, digest: str, dest: Path) -> bool:
    """Copy the kept output into ``dest`` (replaced whole); False when none is kept."""
    kept = _where(kind, digest)
    if not kept.is_dir():
        return False
    with atomic.folder(dest) as tmp:
        shutil.copytree(kept, tmp, dirs_exist_ok=True)
    return True


def store(kind: str, digest: str, src: Path) -> None:
    """Keep a copy of ``src`` (a finished output folder)."""
    with atomic.folder(_where(kind, digest)) as tmp:
        shutil.copytree(src, tmp, dirs_exist_ok=True)
