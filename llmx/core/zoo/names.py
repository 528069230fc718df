"""User names for zoo entries (``llmx zoo build --name NAME`` -> ``ref:NAME``): one small JSON file per name under
``.names/``, holding the entry it points to and the request that builds it again if the entry is lost."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from llmx.core import atomic
from llmx.core.zoo.cache import cache_root
from llmx.core.zoo.request import NAME, RefRequest


def _folder() -> Path:
    return cache_root() / ".names"


def bind(name: str, entry: Path, req: RefRequest) -> None:
    atomic.write_json(_folder() / f"{name}.json", {"entry": entry.name, "request": asdict(portable(req))})


def portable(req: RefRequest) -> RefRequest:
    """File paths made absolute, so that the request builds the same entry again from any folder."""
    from llmx.core.refs import absolute

    return replace(req, **{f: absolute(getattr(req, f)) for f in ("data", "tokenizer") if getattr(req, f)})


def lookup(name: str) -> dict[str, Any] | None:
    if not NAME.match(name):
        return None
    f = _folder() / f"{name}.json"
    return json.loads(f.read_text()) if f.is_file() else None


def bound() -> dict[str, dict[str, Any]]:
    """Every name and what it points to."""
    folder = _folder()
    return {f.stem: json.loads(f.read_text()) for f in sorted(folder.glob("*.json"))} if folder.is_dir() else {}


def unbind(name: str) -> None:
    (_folder() / f"{name}.json").unlink(missing_ok=True)
