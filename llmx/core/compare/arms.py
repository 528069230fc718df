"""Arm stages several plugins' comparisons share (plain dicts: importing this loads no parameter model)."""

from __future__ import annotations

from typing import Any


def strongest_int(method: str, bits: str, **extra) -> dict[str, Any]:
    """An integer weight format at its strongest common setting: asymmetric, groups of 128, not saved (GPTQ with
    ``actorder=True`` in ``extra``)."""
    return {"method": method, "params": {"bits": bits, "group_size": 128, "symmetric": False, "save": False, **extra}}
