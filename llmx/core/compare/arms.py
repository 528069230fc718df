"""Arm stages several plugins' comparisons share (plain dicts: importing this loads no parameter model)."""

from __future__ import annotations

from typing import Any


def strongest_int(method: str, bits: str, **extra) -> dict[str, Any]:
    """An integer weight format at its strongest common setting: asymmetric, groups of 128, not saved."""
    return {"method": method, "params": {"bits": bits, "group_size": 128, "symmetric": False, "save": False, **extra}}


def strongest_gptq(bits: str) -> dict[str, Any]:
    """GPTQ at its strongest: :func:`strongest_int`'s format with act-order and true-sequential calibration (the
    reference llama.py's ``--act-order --true-sequential``, its Llama setting), ``percdamp`` 0.01 (0.1 was no better
    on ``ref:llama`` at w3 and w4 g128, calibration seeds 0-2; issue 67). On that model true-sequential is within the
    calibration seeds' spread either way; it stays as the reference's recommended setting."""
    return strongest_int("gptq", bits, actorder=True, true_sequential=True, percdamp=0.01)
