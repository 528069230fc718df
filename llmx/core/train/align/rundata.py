"""Preference rows from an earlier stage of the same run. An align stage whose ``data`` is left out trains on the
rows of the run's latest stage that reported a ``data_dir`` (``analyze --method task``: the starting model's own
judged samples, ``train_paired.jsonl`` and ``train_unpaired.jsonl``), so one run samples, aligns and evaluates, and
each arm of a comparison builds its data from the model it starts from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from llmx.errors import UsageError

DEFAULT = ("Training preference data (.jsonl); default: the {kind} rows of the run's latest earlier stage that wrote "
           "some (analyze --method task: the model's own judged samples).")


def with_data(ctx: Any, p: Any, kind: str) -> Any:
    """``p`` as given when it names its data; else with ``data`` set to the run's own ``kind`` rows."""
    return p if p.data else p.model_copy(update={"data": str(run_rows(ctx.run_dir, kind))})


def run_rows(run_dir: Path, kind: str) -> Path:
    """``train_<kind>.jsonl`` (else the first ``*_<kind>.jsonl``) in the ``data_dir`` of the latest finished stage
    of the run in ``run_dir`` that reported one."""
    from llmx.core import runs

    metrics = Path(run_dir) / runs.METRICS
    stages = json.loads(metrics.read_text())["stages"] if metrics.is_file() else []
    for stage in reversed(stages):
        folder = stage["metrics"].get("data_dir")
        if not folder:
            continue
        folder = Path(folder)
        found = [f for f in [folder / f"train_{kind}.jsonl", *sorted(folder.glob(f"*_{kind}.jsonl"))] if f.is_file()]
        if not found:
            raise UsageError(f"stage {stage['index']} ({stage['method']}) of this run wrote no {kind} rows in {folder}")
        return found[0]
    raise UsageError(f"no preference data: pass data (a .jsonl of {kind} rows), or put analyze --method task before "
                     "this stage in the same run")
