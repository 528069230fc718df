"""``llmx env``: versions, devices and optional extras, for bug reports."""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil

import typer

from llmx.cli.app import examples
from llmx.cli.output import emit, table


def env() -> None:
    """Show versions, threads, CUDA / CuPy availability, and the registered models and datasets."""
    from llmx.core.plugins import host
    from llmx.core.runs import versions

    info: dict = {"versions": versions(), "platform": platform.platform(), "cpus": os.cpu_count()}
    if importlib.util.find_spec("torch"):
        import torch

        info.update(torch_threads=torch.get_num_threads(), cuda=torch.cuda.is_available(),
                    cuda_devices=[torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
    info["cupy_installed"] = importlib.util.find_spec("cupy") is not None
    info["nvcc"] = shutil.which("nvcc")
    h = host()
    info["models"] = {n: s.summary for n, s in sorted(h.models.items())}
    info["datasets"] = {n: s.summary for n, s in sorted(h.datasets.items())}
    info["plugins"] = {i.name: i.status for i in h.infos}
    info["environment"] = {k: v for k, v in os.environ.items() if k.startswith("LLMX_")}

    def render() -> None:
        rows = [[k, v] for k, v in info["versions"].items()]
        rows += [[k, info[k]] for k in ("platform", "cpus", "torch_threads", "cuda", "cupy_installed", "nvcc") if k in info]
        rows += [[f"model {n}", s] for n, s in info["models"].items()]
        rows += [[f"dataset {n}", s] for n, s in info["datasets"].items()]
        rows += [[k, v] for k, v in info["environment"].items()]
        table("llmx env", ["what", "value"], rows)

    emit(info, render)


def register(app: typer.Typer) -> None:
    app.command(epilog=examples("llmx env", "llmx --json env"))(env)
