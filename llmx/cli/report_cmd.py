"""``llmx report RUN_DIR...``: one row per run, one column per stage metric."""

from __future__ import annotations

import csv
import io
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from llmx.cli.app import examples
from llmx.cli.output import emit, fmt, state, table


class Format(str, Enum):
    table = "table"
    md = "md"
    csv = "csv"
    json = "json"


def collect(paths: list[str]) -> tuple[list[str], list[dict[str, Any]]]:
    """Expand folders of runs, read each run and flatten its metrics to ``method.metric`` columns."""
    from llmx.core import runs

    folders: list[Path] = []
    for p in map(Path, paths):
        if (p / runs.CONFIG).is_file():
            folders.append(p)
        elif p.is_dir() and (inner := sorted(d for d in p.iterdir() if (d / runs.CONFIG).is_file())):
            folders.extend(inner)
        else:
            runs.read(p)  # raises the "not a run folder" error
    for root in dict.fromkeys(f.parent for f in folders):
        runs.sweep(root)
    columns: list[str] = []
    rows = []
    for folder in folders:
        data = runs.read(folder)
        stages = data["metrics"].get("stages", [])
        counts: dict[str, int] = {}
        for s in stages:
            counts[s["method"]] = counts.get(s["method"], 0) + 1
        row: dict[str, Any] = {"run": folder.name, "status": data["meta"].get("status", "?")}
        for s in stages:
            prefix = s["method"] if counts[s["method"]] == 1 else f"{s['index']}:{s['method']}"
            for k, v in s["metrics"].items():
                if isinstance(v, (int, float, str, bool)) or v is None:
                    row[f"{prefix}.{k}"] = v
        columns += [k for k in row if k not in columns]
        rows.append(row)
    return columns, rows


def report(
    run_dirs: Annotated[list[str], typer.Argument(help="Run folders, or folders holding run folders.")],
    format: Annotated[Format, typer.Option("--format", "-f", help="table, md, csv or json.")] = Format.table,
) -> None:
    """Tabulate the metrics of runs side by side."""
    columns, rows = collect(run_dirs)
    if state.json or format is Format.json:
        emit(rows)
    elif format is Format.csv:
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
        sys.stdout.write(buf.getvalue())
    elif format is Format.md:
        lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(fmt(r.get(c)) for c in columns) + " |" for r in rows]
        sys.stdout.write("\n".join(lines) + "\n")
    else:
        table(None, columns, [[r.get(c) for c in columns] for r in rows])


def register(app: typer.Typer) -> None:
    app.command(epilog=examples("llmx report runs/*", "llmx report runs --format md",
                                "llmx report runs/2026* --format csv > results.csv"))(report)
