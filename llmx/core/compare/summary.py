"""Many comparisons' results in one table: one row per judged baseline (the target's improvement over it, its
interval and verdict, the model, seeds and the machines the runs were made on), read from ``result.json`` files.
``llmx compare summary`` prints it; the README's and the docs' results tables are generated from it, so that a figure
quoted is a figure some ``llmx compare`` run wrote."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from llmx.errors import UsageError


def load(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """The results at ``paths``: a ``result.json`` (or any comparison result JSON), or a folder searched for them."""
    found: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            found += sorted(f for f in path.rglob("*.json") if f.name == "result.json" or f.parent == path)
        elif path.is_file():
            found.append(path)
        else:
            raise UsageError(f"no comparison result at {path}")
    results = []
    for f in found:
        try:
            data = json.loads(f.read_text())
        except ValueError as exc:
            raise UsageError(f"{f}: not JSON ({exc})") from None
        if isinstance(data, dict) and "comparison" in data and "verdicts" in data:
            results.append({**data, "_path": str(f)})
    if not results:
        raise UsageError(f"no comparison results under {', '.join(map(str, paths))}")
    return sorted(results, key=lambda r: (r["comparison"], r["model"], r["quick"]))


def rows(results: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in results:
        values = {a["name"]: a for a in r["arms"]}
        for v in r["verdicts"]:
            out.append({"comparison": r["comparison"], "target": r["target"], "baseline": v["baseline"],
                        "metric": r["metric"], "higher_is_better": r["higher_is_better"],
                        "target_value": values[r["target"]][r["metric"]],
                        "baseline_value": values[v["baseline"]][r["metric"]],
                        "improvement": v["improvement"], "low": v["low"], "high": v["high"], "verdict": v["verdict"],
                        "model": r["model"], "seeds": r["seeds"], "quick": r["quick"], "options": r.get("options") or {},
                        "machines": [where(m) for m in r.get("run_machines") or [r["machine"]]]})
    return out


def where(machine: dict[str, Any]) -> str:
    """A machine in a few words: the GPU, else the CPU model and torch's kernel capability."""
    if machine.get("cuda"):
        return str(machine["cuda"])
    return f"{machine.get('cpu_model') or machine.get('cpu')} ({machine.get('torch_cpu_capability')})"


def variant(row: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in row["options"].items())


def cell(row: dict[str, Any]) -> str:
    if row["improvement"] is None:
        return "-"
    return f"{row['improvement']:+.4f} [{row['low']:+.4f}, {row['high']:+.4f}]"


def markdown(results: list[dict[str, Any]]) -> str:
    """The summary table (Markdown), generated: the README's and the docs' copies are checked against it."""
    lines = ["| comparison | target vs baseline | metric | target | baseline | improvement [95%] | verdict | model, "
             "seeds | machine |", "|---|---|---|---|---|---|---|---|---|"]
    for row in rows(results):
        fmt = lambda x: "-" if x is None else f"{x:.4f}"  # noqa: E731
        lines.append(f"| {row['comparison']} | {row['target']} vs {row['baseline']} | {row['metric']} "
                     f"({'higher' if row['higher_is_better'] else 'lower'} is better) | {fmt(row['target_value'])} | "
                     f"{fmt(row['baseline_value'])} | {cell(row)} | {row['verdict']} | {row['model']}, "
                     f"{len(row['seeds'])} seed{'s' if len(row['seeds']) != 1 else ''}"
                     f"{' (quick)' if row['quick'] else ''}{' (a variant: ' + variant(row) + ')' if row['options'] else ''}"
                     f" | {'; '.join(row['machines'])} |")
    return "\n".join(lines) + "\n"
