"""The machine a figure was measured on: the CPU as the kernels see it and the GPU, so that every timing or result
names where it ran (figures from one CPU do not hold on another)."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_int8", "amx_bf16")  # what picks kernels


def cpu_model() -> dict[str, Any]:
    """The CPU as the kernels see it: its model name (``/proc/cpuinfo``, else ``platform.processor()``), torch's
    kernel capability (``ATEN_CPU_CAPABILITY`` lowers it), the instruction-set flags the CPU kernels choose by, and any
    variable that emulates a smaller CPU for torch (read at startup) or oneDNN."""
    import torch

    name, flags = None, set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and name is None:
                name = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    emulated = {k: os.environ[k] for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA") if k in os.environ}
    return {"cpu_model": name or platform.processor() or platform.machine(), "processor": platform.processor(),
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cpu_flags": {f: f in flags for f in CPU_FLAGS} if flags else None,
            **({"emulated": emulated} if emulated else {})}


def machine() -> dict[str, Any]:
    import torch

    return {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
            "threads": torch.get_num_threads(), **cpu_model(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
