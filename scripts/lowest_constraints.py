"""Print pip constraints that hold every runtime dependency of pyproject.toml at its lowest allowed version.

`make test-lowest` installs the package under these constraints in a second environment and runs the fast suite, so
the lower bounds pyproject.toml states are ones the tests have passed on. torch is left out: the environment takes the
local CPU wheel first (its lowest bound, the CUDA images' 2.11, is checked by scripts/gpu-check.sh on a GPU machine).
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

SKIP = {"torch"}  # installed beforehand from the CPU wheel (see the module docstring)


def lowest(requirement: str) -> str | None:
    """``name>=1.2,<2`` -> ``name==1.2``; ``name==1.0.3`` stays; None where no lower bound is stated."""
    m = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*(.*)$", requirement)
    name, spec = m.group(1), m.group(2)
    if name.lower() in SKIP:
        return None
    pin = re.search(r"(?:==|>=|~=)\s*([0-9][0-9A-Za-z.]*)", spec)
    return f"{name}=={pin.group(1)}" if pin else None


def main(path: str = "pyproject.toml") -> None:
    deps = tomllib.loads(Path(path).read_text())["project"]["dependencies"]
    for line in filter(None, map(lowest, deps)):
        print(line)


if __name__ == "__main__":
    main(*sys.argv[1:])
