"""Training rows from an earlier stage of the same run: a train stage whose ``data`` is left out trains on the rows
that the run's latest stage with a ``data_dir`` holding ``marker`` wrote there (``analyze --method backdoor`` writes
``backdoor.json`` beside its clean, poisoned and defence rows), so one run plants, defends and evaluates."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from llmx.errors import UsageError


def stage_folder(run_dir: Path, marker: str, hint: str) -> Path:
    """The ``data_dir`` of the latest finished stage of the run in ``run_dir`` whose folder holds ``marker``."""
    from llmx.core import runs

    metrics = Path(run_dir) / runs.METRICS
    for stage in reversed(json.loads(metrics.read_text())["stages"] if metrics.is_file() else []):
        folder = stage["metrics"].get("data_dir")
        if folder and (Path(folder) / marker).is_file():
            return Path(folder)
    raise UsageError(hint)


def with_rows(ctx: Any, p: Any, rows: str, held_out: str, marker: str, hint: str) -> Any:
    """``p`` as given when it names its data; else training on ``rows``.jsonl of that folder, held out on its
    ``held_out``.jsonl where ``p`` names no ``eval_data``."""
    if p.data:
        return p
    folder = stage_folder(ctx.run_dir, marker, hint)
    return p.model_copy(update={"data": str(folder / f"{rows}.jsonl"),
                                "eval_data": p.eval_data or str(folder / f"{held_out}.jsonl")})
