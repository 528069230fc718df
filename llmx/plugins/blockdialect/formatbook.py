"""Formatbooks: 16 dialects of 8 magnitudes on the half-unit grid, at most 7.5 (BlockDialect Sec. 3.2), so every
element is a small integer times the block's power of two. ``dialectfp4`` is the paper's (``dialectfp4.yaml``); any
YAML file with the same shape is checked the same way."""

from __future__ import annotations

from pathlib import Path

import yaml

from llmx.errors import UsageError

BUILTIN = {"dialectfp4": Path(__file__).with_name("dialectfp4.yaml")}
DIALECTS, MAGNITUDES, TOP = 16, 8, 7.5


def load(name: str) -> tuple[tuple[float, ...], ...]:
    """The dialects of a built-in formatbook or a YAML file (a list of 16 lists of 8 numbers)."""
    path = BUILTIN.get(name, Path(name))
    if not path.is_file():
        raise UsageError(f"formatbook '{name}': neither {', '.join(BUILTIN)} nor a YAML file")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise UsageError(f"formatbook {path}: not YAML ({str(exc).splitlines()[0]})") from exc
    return check(raw, str(path))


def check(raw: object, where: str) -> tuple[tuple[float, ...], ...]:
    if not isinstance(raw, list) or len(raw) != DIALECTS:
        raise UsageError(f"formatbook {where}: needs {DIALECTS} dialects (a 4-bit id each), got "
                         f"{len(raw) if isinstance(raw, list) else type(raw).__name__}")
    book = []
    for i, d in enumerate(raw):
        if not isinstance(d, list) or len(d) != MAGNITUDES or not all(isinstance(v, (int, float)) for v in d):
            raise UsageError(f"formatbook {where}: dialect {i} must list {MAGNITUDES} magnitudes (3-bit indices)")
        off = [v for v in d if not float(2 * v).is_integer()]
        if off:
            raise UsageError(f"formatbook {where}: dialect {i} has {off[0]}, not a multiple of 0.5 (the integer MAC "
                             "needs half-units)")
        if max(d) > TOP or min(d) < 0:
            raise UsageError(f"formatbook {where}: dialect {i} has a magnitude outside [0, {TOP}]")
        if sorted(d) != list(d) or d[0] != 0 or len(set(d)) != MAGNITUDES:
            raise UsageError(f"formatbook {where}: dialect {i} must be 8 distinct magnitudes, ascending from 0")
        book.append(tuple(float(v) for v in d))
    return tuple(book)
