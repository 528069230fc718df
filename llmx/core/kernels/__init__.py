"""CuPy raw kernels: compile ``.cu`` sources once (cached), dispatch CUDA tensors to them, everything else to the
PyTorch reference.

``available()`` is true only with CuPy installed *and* a CUDA device (``import cupy`` works without a GPU, but every
device call fails). ``compile_check`` compiles a source without a device (nvcc with an explicit architecture, or
NVRTC through CuPy), so CI proves every kernel compiles.
"""

from __future__ import annotations

import functools
import importlib.util
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # the llmx package
DEFAULT_ARCH = "sm_80"


def sources() -> list[Path]:
    """Every ``.cu`` file shipped inside llmx (core kernels and plugins' ``kernels/`` folders)."""
    return sorted(ROOT.rglob("*.cu"))


@functools.lru_cache(maxsize=1)
def available() -> bool:
    if importlib.util.find_spec("cupy") is None:
        return False
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no driver / no device: the reference path runs
        return False


def use_kernel(*tensors: Any) -> bool:
    """True when every tensor is on a CUDA device and the kernels can run there."""
    return all(getattr(t, "is_cuda", False) for t in tensors) and available()


@functools.cache
def module(path: str, options: tuple[str, ...] = ("-std=c++17",)) -> Any:
    """The compiled ``cupy.RawModule`` for a source file (compiled on first use, then cached by CuPy on disk too)."""
    import cupy

    return cupy.RawModule(code=Path(path).read_text(), options=options)


def function(path: str | Path, name: str) -> Any:
    return module(str(path)).get_function(name)


def launch(path: str | Path, name: str, grid: tuple[int, ...], block: tuple[int, ...], args: tuple, like: Any,
           shared_mem: int = 0) -> None:
    """Run kernel ``name`` on the device of the torch tensor ``like``, on torch's current stream there (CuPy's own
    current device and stream are neither), so it is ordered with the torch ops around it. An empty grid (no rows, no
    columns) launches nothing: CUDA rejects a zero-sized grid."""
    if min(grid) <= 0:
        return
    import cupy
    import torch

    with cupy.cuda.Device(like.device.index):
        stream = cupy.cuda.ExternalStream(torch.cuda.current_stream(like.device).cuda_stream, like.device.index)
        function(path, name)(grid, block, args, shared_mem=shared_mem, stream=stream)


def compile_check(path: str | Path, arch: str = DEFAULT_ARCH) -> str:
    """Compile without a GPU; returns the compiler used. Raises RuntimeError with the compiler's message."""
    path = Path(path)
    nvcc = shutil.which("nvcc")
    if nvcc:
        with tempfile.TemporaryDirectory() as tmp:
            proc = subprocess.run([nvcc, f"-arch={arch}", "-std=c++17", "--cubin", "-o", str(Path(tmp) / "k.cubin"),
                                   str(path)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"nvcc failed on {path.name}:\n{proc.stderr.strip()}")
        return "nvcc"
    if importlib.util.find_spec("cupy") is not None:
        from cupy.cuda import compiler

        try:
            compiler.compile_using_nvrtc(path.read_text(), options=(f"-arch=compute_{arch.split('_')[1]}", "-std=c++17"))
        except Exception as exc:  # noqa: BLE001
            raise RuntimeError(f"NVRTC failed on {path.name}: {exc}") from exc
        return "nvrtc"
    raise FileNotFoundError("no CUDA compiler: install the CUDA toolkit (nvcc) or the gpu extra (CuPy + NVRTC)")
