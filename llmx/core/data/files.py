"""Reading users' text files: UTF-8 or a one-line error naming the file and line, never replacement characters
scored as text."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from llmx.errors import UsageError


def read_text(path: str | Path) -> str:
    """The file decoded as UTF-8 (a BOM is dropped); a binary file or another encoding is a usage error."""
    p = Path(path)
    data = p.read_bytes()
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise UsageError(f"{p}: UTF-16 (it starts with a UTF-16 byte-order mark), not UTF-8; convert it first, "
                         "e.g. iconv -f utf-16 -t utf-8")
    nul = data.find(b"\0")
    if nul >= 0:
        raise UsageError(f"{p}:{_line(data, nul)}: NUL byte at offset {nul}: binary or UTF-16, "
                         "not UTF-8 text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{p}:{_line(data, exc.start)}: not UTF-8 (byte 0x{data[exc.start]:02x} at offset "
                         f"{exc.start}); convert it first, e.g. iconv -f latin1 -t utf-8") from None


def check_not_empty(path: str | Path) -> None:
    """A usage error when the file holds nothing but whitespace (read a chunk at a time, up to the first text)."""
    p = Path(path)
    with p.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            if chunk.strip():
                return
    raise UsageError(f"{p}: the file is empty" + (" (whitespace only)" if p.stat().st_size else ""))


def _line(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


def json_lines(path: str | Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(file:line, object)`` for every non-blank line of a JSON Lines file."""
    p = Path(path)
    for n, line in enumerate(read_text(p).split("\n"), 1):  # not splitlines(): U+2028 may sit inside a JSON string
        if not line.strip():
            continue
        where = f"{p}:{n}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{where}: not valid JSON ({exc.msg})") from exc
        if not isinstance(row, dict):
            raise UsageError(f"{where}: expected a JSON object")
        yield where, row
