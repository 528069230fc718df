"""``llmx report RUN_DIR...``: one row per run and stage with its headline metrics, tables for scripts, and plots."""

from __future__ import annotations

import csv
import io
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from llmx.cli.app import examples
from llmx.cli.output import emit, fmt, info, state, table


class Format(str, Enum):
    table = "table"
    md = "md"
    csv = "csv"
    json = "json"


def _flat(row, metrics: list[str] | None) -> dict[str, Any]:
    chosen = {k: row.metrics.get(k) for k in metrics} if metrics else row.key_metrics()
    return {"run": row.run, "status": row.status, "stage": row.label, "seconds": row.seconds, **chosen}


def report(
    run_dirs: Annotated[list[str], typer.Argument(help="Run folders, or folders holding run folders.")],
    format: Annotated[Format, typer.Option("--format", "-f", help="table, md, csv (every metric) or json.")] = Format.table,
    metrics: Annotated[Optional[str], typer.Option("--metrics", "-m", help="Comma-separated metrics to show, one "
                                                   "column each (default: each stage's headline metrics).")] = None,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="Also write pareto/loss/bars PNGs, each with the CSV "
                                                 "it was drawn from, into this folder (needs matplotlib).")] = None,
) -> None:
    """Tabulate runs, one row per run and stage; --plot draws the figures."""
    from llmx.core.report import rows as read_rows

    chosen = [m.strip() for m in metrics.split(",") if m.strip()] if metrics else None
    rows = read_rows(run_dirs)
    if plot is not None:
        from llmx.core.plots import plot as draw

        pngs = draw(rows, plot, metric=chosen[0] if chosen else None)
        info("wrote " + (", ".join(str(p) for p in pngs) if pngs else "no figure: these runs have nothing to plot"))
    if state.json or format is Format.json:
        emit([{"run": r.run, "status": r.status, "index": r.index, "method": r.method, "stage": r.stage,
               "seconds": r.seconds, "metrics": r.metrics} for r in rows])
    elif format is Format.csv:
        flat = [{**_flat(r, chosen or list(r.metrics))} for r in rows]
        columns = list(dict.fromkeys(k for f in flat for k in f))
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=columns)
        writer.writeheader()
        writer.writerows(flat)
        sys.stdout.write(buf.getvalue())
    elif format is Format.md:
        flat = [_flat(r, chosen) for r in rows]
        columns = ["run", "status", "stage", "seconds"] + (chosen or ["metrics"])
        lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        for r, f in zip(rows, flat, strict=True):
            cells = [f.get(c) for c in columns[:4]] + ([f.get(c) for c in chosen] if chosen else [_pairs(r.key_metrics())])
            lines.append("| " + " | ".join(fmt(c) for c in cells) + " |")
        sys.stdout.write("\n".join(lines) + "\n")
    else:
        _table(rows, chosen)


def _pairs(metrics: dict[str, Any]) -> str:
    return "  ".join(f"{k} {fmt(v)}" for k, v in metrics.items())


def _table(rows, chosen: list[str] | None) -> None:
    """Narrow enough for 80 columns: the run named once per group, the metrics as ``name value`` pairs (or one
    column per ``--metrics`` entry)."""
    from llmx.core.report import short_run

    columns = ["run", "stage", "s"] + (chosen or ["metrics"])
    out, last = [], None
    for r in rows:
        name = "" if r.run == last else f"{short_run(r.run)}" + ("" if r.status == "ok" else f" [{r.status}]")
        last = r.run
        cells = [r.metrics.get(c) for c in chosen] if chosen else [_pairs(r.key_metrics())]
        out.append([name, r.label, r.seconds, *cells])
    table(None, columns, out)


def register(app: typer.Typer) -> None:
    app.command(epilog=examples("llmx report runs/*", "llmx report runs --metrics perplexity,bits,stored_weight_bytes",
                                "llmx report runs --plot plots/", "llmx report runs --format md",
                                "llmx report runs/2026* --format csv > results.csv"))(report)
