"""Helpers for the benchmark scripts: run llmx pipelines in-process and write result files."""

from __future__ import annotations

import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def run_pipeline(model: str, stages: list[dict[str, Any]], output_dir: str | None = None, **run: Any) -> list[dict]:
    """Resolve and execute a pipeline (run folders go to ``output_dir``, default a temporary directory removed
    afterwards); return each stage's metrics."""
    from llmx.core.config import resolve
    from llmx.core.pipeline import execute
    from llmx.core.plugins import host

    with tempfile.TemporaryDirectory() as tmp:
        raw = {"model": model, "output_dir": output_dir or tmp, "pipeline": stages, **run}
        result = execute(resolve(raw, host().methods), show_progress=False)
        return [s["metrics"] for s in result.stages]


def timed(fn, *args, repeats: int = 10) -> float:
    """Median seconds per call of ``fn(*args)`` after one warm-up call."""
    fn(*args)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def machine() -> dict[str, Any]:
    import torch

    return {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
            "threads": torch.get_num_threads()}


def write(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    return path


def publish(name: str, rows: list[dict[str, Any]], **payload: Any) -> None:
    """``results/<name>.json`` (the rows, the machine and ``payload``) and ``results/<name>.md`` (the rows' table)."""
    write(name, {"benchmark": name, **payload, "machine": machine(), "rows": rows})
    table = markdown(list(rows[0]), rows)
    (RESULTS / f"{name}.md").write_text(table + "\n")
    print(table)


def markdown(columns: list[str], rows: list[dict[str, Any]]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return "-" if v is None else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)
