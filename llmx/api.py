"""The Python API: the CLI's stages from notebooks and scripts, on in-memory models, with the same validation, checks
and errors (``UsageError``, ``ConfigError``, ``MissingRequirement``) as ``llmx`` on the command line.

    import llmx

    model, tok = llmx.load("ref:llama-test")
    model, metrics = llmx.quantize(model, tokenizer=tok, method="gptq", bits="w4a16", calib_samples=16)
    metrics = llmx.evaluate(model, tokenizer=tok, method="perplexity", max_tokens=2048)
    result = llmx.run("configs/smoke/rtn.yaml", set=["seed=1"])

Each call is one run: its folder goes to ``output_dir`` when given (as ``llmx ... -o DIR``), else to a temporary
folder removed afterwards (saved artifacts included; pass ``output_dir`` to keep them).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from llmx.errors import UsageError


def load(name: str, dtype: str = "float32", device: str = "cpu") -> tuple[Any, Any]:
    """``(model, tokenizer)`` for any name ``--model`` takes: a folder, a hub id, ``tiny:ARCH``, ``ref:NAME``."""
    from llmx.core import models

    return models.load(name, dtype=dtype, device=device)


@contextlib.contextmanager
def _folder(output_dir: str | Path | None) -> Iterator[str]:
    if output_dir is not None:
        yield str(output_dir)
        return
    with tempfile.TemporaryDirectory(prefix="llmx-") as tmp:
        yield tmp


def run(config: str | Path | dict[str, Any], *, set: list[str] | tuple[str, ...] = (),  # noqa: A002 - as --set
        output_dir: str | Path | None = None, progress: bool = False) -> dict[str, Any]:
    """Run a recipe (a YAML path or the same mapping) as ``llmx run`` does; returns ``{"run_dir", "stages"}``. The
    run folder goes to ``output_dir``, else to the recipe's own ``output_dir``, else to a temporary folder (then
    ``run_dir`` no longer exists when this returns)."""
    from llmx.core.config import apply_sets, load_yaml, resolve
    from llmx.core.pipeline import execute
    from llmx.core.plugins import host

    source = str(config) if isinstance(config, (str, Path)) else None
    raw = load_yaml(config) if source else dict(config)
    with _folder(output_dir or raw.get("output_dir")) as folder:
        raw["output_dir"] = folder
        resolved = resolve(apply_sets(raw, list(set)), host().methods, source=source,
                           folder=Path(config).parent if source else None)
        return execute(resolved, show_progress=progress).as_dict()


def apply(stage: str, model: Any, *, method: str, tokenizer: Any = None, data: str | dict | None = None,
          device: str = "cpu", dtype: str = "float32", seed: int = 0, output_dir: str | Path | None = None,
          progress: bool = False, **params: Any) -> tuple[Any, dict[str, Any]]:
    """Run one ``stage`` with ``method`` on ``model`` (a loaded model with its ``tokenizer``, or any name ``load``
    takes); ``params`` are the method's (``llmx methods METHOD``); ``data`` is a source for the stage (as ``--data``)
    or a whole ``data`` section (``{"source": "notes.txt", "validation_percent": 20}``). Returns the resulting model
    and the metrics."""
    from llmx.core.config import resolve, route_data
    from llmx.core.pipeline import execute
    from llmx.core.plugins import host
    from llmx.core.spec import Stage

    methods = host().methods
    raw: dict[str, Any] = {"name": stage, "seed": seed, "device": device, "dtype": dtype,
                           "pipeline": [{"method": method, "stage": stage, "params": params}]}
    start = None
    if isinstance(model, (str, Path)):
        raw["model"] = str(model)
    elif tokenizer is None:
        raise UsageError("a loaded model needs its tokenizer: pass tokenizer=... (llmx.load returns both)")
    else:
        start = (model, tokenizer)
    if isinstance(data, dict):  # a whole ``data`` section: source, text_split, validation_percent, ...
        raw["data"] = data
    elif data is not None:
        raw = route_data(raw, Stage(stage), data, methods)
    with _folder(output_dir) as folder:
        raw["output_dir"] = folder
        result = execute(resolve(raw, methods), show_progress=progress, model=start)
    return result.model, result.stages[0]["metrics"]


def quantize(model: Any, *, method: str, bits: str | None = None, **kw: Any) -> tuple[Any, dict[str, Any]]:
    """``llmx quantize``: e.g. ``quantize(model, tokenizer=tok, method="gptq", bits="w4a16")``."""
    return apply("quantize", model, method=method, **({"bits": bits} if bits else {}), **kw)


def prune(model: Any, *, method: str, **kw: Any) -> tuple[Any, dict[str, Any]]:
    return apply("prune", model, method=method, **kw)


def train(model: Any, *, method: str, **kw: Any) -> tuple[Any, dict[str, Any]]:
    return apply("train", model, method=method, **kw)


def align(model: Any, *, method: str, **kw: Any) -> tuple[Any, dict[str, Any]]:
    return apply("align", model, method=method, **kw)


def decode(model: Any, *, method: str, **kw: Any) -> dict[str, Any]:
    return apply("decode", model, method=method, **kw)[1]


def evaluate(model: Any, *, method: str = "perplexity", **kw: Any) -> dict[str, Any]:
    """``llmx eval``: the metrics of ``method`` on ``model`` (unchanged)."""
    return apply("eval", model, method=method, **kw)[1]
