"""The runs grid: JSON lines of upcycled and from-scratch points, checked row by row."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llmx.errors import UsageError

NEEDS = {"upcycled": ("D1", "D2", "loss", "active_params", "dense_params"),
         "moe": ("tokens", "loss", "active_params"), "dense": ("tokens", "loss", "active_params")}


@dataclass
class Grid:
    d1: np.ndarray
    d2: np.ndarray
    loss: np.ndarray
    run: np.ndarray  # the upcycled run each row came from (its 'run' field, else its D1)
    active: float  # the upcycled MoE's active parameters
    dense: float  # the dense source's parameters
    scratch: dict[str, tuple[np.ndarray, np.ndarray, float]]  # kind -> (tokens, loss, active_params)


def _positive(path: Path, line: int, row: dict, key: str) -> float:
    v = row[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise UsageError(f"upcycling-law: {path}:{line}: {key} must be a positive number (got {v!r})")
    return float(v)


def read(path: str) -> Grid:
    p = Path(path)
    up: list[tuple[float, float, float]] = []
    runs: list[str] = []
    scratch: dict[str, list[tuple[float, float]]] = {}
    sizes: dict[str, set[float]] = {"upcycled": set(), "dense_source": set(), "moe": set(), "dense": set()}
    for line, text in enumerate(p.read_text().splitlines(), 1):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UsageError(f"upcycling-law: {p}:{line} is not JSON ({exc.msg})") from None
        kind = row.get("kind", "upcycled") if isinstance(row, dict) else None
        if kind not in NEEDS:
            raise UsageError(f"upcycling-law: {p}:{line}: kind must be one of {', '.join(NEEDS)} (got {kind!r})")
        missing = [k for k in NEEDS[kind] if k not in row]
        if missing:
            raise UsageError(f"upcycling-law: {p}:{line}: a {kind} row needs {', '.join(missing)}")
        v = {k: _positive(p, line, row, k) for k in NEEDS[kind]}
        sizes[kind].add(v["active_params"])
        if kind == "upcycled":
            sizes["dense_source"].add(v["dense_params"])
            up.append((v["D1"], v["D2"], v["loss"]))
            runs.append(str(row.get("run", v["D1"])))
        else:
            scratch.setdefault(kind, []).append((v["tokens"], v["loss"]))
    for kind, seen in sizes.items():
        if len(seen) > 1:
            raise UsageError(f"upcycling-law: {p}: the {kind} rows have several parameter counts "
                             f"({sorted(seen)}); a law is fitted for one model configuration")
    if not up:
        raise UsageError(f"upcycling-law: {p} has no upcycled rows")
    arr = np.array(up)
    return Grid(arr[:, 0], arr[:, 1], arr[:, 2], np.array(runs), sizes["upcycled"].pop(), sizes["dense_source"].pop(),
                {k: (np.array([t for t, _ in r]), np.array([x for _, x in r]), sizes[k].pop())
                 for k, r in scratch.items()})
