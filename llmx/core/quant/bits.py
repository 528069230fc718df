"""``--bits`` strings: ``w{N}a{M}`` (weight bits, activation bits; 16 means not quantized)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from llmx.errors import UsageError

_PATTERN = re.compile(r"^w(\d+)a(\d+)$")


@dataclass(frozen=True)
class BitSpec:
    weight: int
    act: int

    def __str__(self) -> str:
        return f"w{self.weight}a{self.act}"


def parse_bits(text: str, allowed: tuple[str, ...]) -> BitSpec:
    """Parse ``text`` and check it is one of ``allowed``; the error names the valid values."""
    m = _PATTERN.match(text.strip().lower())
    if not m:
        raise UsageError(f"bad --bits value '{text}': expected w<N>a<M>, one of {', '.join(allowed)}")
    spec = BitSpec(int(m.group(1)), int(m.group(2)))
    if str(spec) not in allowed:
        raise UsageError(f"--bits {spec} is not supported here; valid: {', '.join(allowed)}")
    return spec
