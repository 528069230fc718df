"""llmx: a plugin-based workbench for this year's LLM efficiency and alignment techniques.

The Python API (``llmx.load``, ``run``, ``quantize``, ``prune``, ``train``, ``align``, ``decode``, ``evaluate``; see
``llmx.api``), the plugin API (``hookimpl``, ``MethodSpec``, ``ModelSpec``, ``DatasetSpec``, ``LayerSpec``, ``TaskSpec``,
``Stage``, ``Params``, ``Method``, ``RunContext``) and the errors. Importing ``llmx`` never imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [  # the Python API (llmx.api) first, then the plugin API and the errors
    "load", "run", "apply", "quantize", "prune", "train", "align", "decode", "evaluate",
    "LayerSpec", "TaskSpec", "hookimpl", "MethodSpec", "ModelSpec", "DatasetSpec", "Stage", "Params", "Method", "RunContext",
    "LlmxError", "UsageError", "ConfigError", "MissingRequirement", "RunFailed",
]

if TYPE_CHECKING:
    from llmx.api import align, apply, decode, evaluate, load, prune, quantize, run, train
    from llmx.core.context import RunContext
    from llmx.core.method import Method
    from llmx.core.spec import DatasetSpec, LayerSpec, MethodSpec, ModelSpec, Params, Stage, TaskSpec
    from llmx.errors import ConfigError, LlmxError, MissingRequirement, RunFailed, UsageError
    from llmx.hookspecs import hookimpl

_WHERE = {
    "hookimpl": "llmx.hookspecs", "MethodSpec": "llmx.core.spec", "ModelSpec": "llmx.core.spec",
    "DatasetSpec": "llmx.core.spec", "LayerSpec": "llmx.core.spec", "TaskSpec": "llmx.core.spec",
    "Stage": "llmx.core.spec", "Params": "llmx.core.spec",
    "Method": "llmx.core.method", "RunContext": "llmx.core.context",
    "LlmxError": "llmx.errors", "UsageError": "llmx.errors", "ConfigError": "llmx.errors",
    "MissingRequirement": "llmx.errors", "RunFailed": "llmx.errors",
    **dict.fromkeys(__all__[:9], "llmx.api"),
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'llmx' has no attribute {name!r}")
