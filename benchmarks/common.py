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


def heldout_windows(tokenizer, max_tokens: int, seq_len: int):
    """The first ``max_tokens`` held-out standard-library tokens as ``[n, seq_len]`` windows (no overlap)."""
    from llmx.core.data import token_stream

    tokens = token_stream(tokenizer, "stdlib", "test", max_tokens)
    return tokens[: len(tokens) // seq_len * seq_len].reshape(-1, seq_len)


def heldout_scores(model, windows, fp_logp=None, batch: int = 16):
    """Perplexity of ``model`` on ``windows``; with the FP model's log-probs also KL(FP || model) per token and
    top-1 agreement. Returns ``(scores, log-probs)`` (the FP call's log-probs are what later calls compare to)."""
    import math

    import torch

    nll, kl, agree, logps = 0.0, 0.0, 0, []
    with torch.no_grad():
        for i in range(0, windows.shape[0], batch):
            ids = windows[i:i + batch]
            logp = torch.log_softmax(model(ids).logits[:, :-1].float(), -1)
            nll -= logp.gather(-1, ids[:, 1:, None]).sum().item()
            if fp_logp is None:
                logps.append(logp)
            else:
                ref = fp_logp[i:i + batch]
                kl += (ref.exp() * (ref - logp)).sum().item()
                agree += (ref.argmax(-1) == logp.argmax(-1)).sum().item()
    n = windows.shape[0] * (windows.shape[1] - 1)
    out = {"perplexity": math.exp(nll / n)}
    if fp_logp is not None:
        out.update(kl=kl / n, top1_agreement=agree / n)
    return out, torch.cat(logps) if logps else fp_logp
