"""A stage's output folder kept for the next run that would build it again: under ``$LLMX_CACHE_DIR/stages/KIND/KEY``,
KEY a digest of everything that determines it (the model's files or zoo entry, the stages before it in the run, the
stage's params, the run's seed, device and dtype, the llmx source and library versions). The
arms of a comparison that open with the same data stage on one seed then build it once (RePer's dialogues: five
arms, one build), and a rerun reads it back. An entry is written once, under a lock, with a manifest of its files
written last; one whose files no longer match it is rebuilt. ``LLMX_STAGE_CACHE=0`` turns it off."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmx.core import atomic
from llmx.errors import LlmxError

MANIFEST = ".manifest.json"
log = logging.getLogger("llmx.stagecache")


def key(ctx: Any, params: Any) -> str:
    """The digest of what determines the stage's output in this run."""
    from llmx.core.compare.provenance import inputs

    index = ctx.stage.index if ctx.stage is not None else 0
    before = [s.model_dump(mode="json") for s in ctx.config.pipeline[:index]]  # a stage may change the model
    blob = {"inputs": inputs({"model": ctx.config.model, "before": before, "params": params.model_dump(mode="json")}),
            "before": before,  # inputs fingerprints the files a param names (size, mtime): an edited file is new
            "params": params.model_dump(mode="json"),
            "seed": ctx.config.seed, "device": str(ctx.device), "dtype": ctx.config.dtype}
    return hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()[:16]


def provide(kind: str, digest: str, dest: Path, build: Callable[[Path], None]) -> bool:
    """``dest`` holds the stage's output: copied from the kept entry, or made by ``build(dest)`` and then kept.
    True where it was kept already. Keeping is best effort: a cache that cannot be written costs a warning."""
    from llmx.core.zoo.cache import locked

    entry = _where(kind, digest)
    if os.environ.get("LLMX_STAGE_CACHE", "1") == "0":
        build(dest)
        return False
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(locked(entry))  # a second builder waits, then reads the first's entry
        except (OSError, LlmxError) as exc:  # an unwritable cache: build without keeping
            log.warning("cannot keep %s's output in %s: %s", kind, entry, exc)
            build(dest)
            return False
        if _intact(entry):
            with atomic.folder(dest) as tmp:
                shutil.copytree(entry, tmp, dirs_exist_ok=True, ignore=shutil.ignore_patterns(MANIFEST))
            return True
        build(dest)
        try:
            shutil.rmtree(entry, ignore_errors=True)  # a damaged entry
            with atomic.folder(entry) as tmp:
                shutil.copytree(dest, tmp, dirs_exist_ok=True)
                (tmp / MANIFEST).write_text(json.dumps(_files(tmp)))
        except OSError as exc:  # a full disk: the stage's own output stands
            log.warning("could not keep %s's output in %s: %s", kind, entry, exc)
        return False


def _where(kind: str, digest: str) -> Path:
    from llmx.core.zoo.cache import cache_root

    return cache_root().parent / "stages" / kind / digest


def _files(folder: Path) -> dict[str, str]:
    return {str(f.relative_to(folder)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(folder.rglob("*")) if f.is_file() and f.name != MANIFEST}


def _intact(entry: Path) -> bool:
    manifest = entry / MANIFEST
    return manifest.is_file() and json.loads(manifest.read_text()) == _files(entry)
