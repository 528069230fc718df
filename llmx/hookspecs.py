"""The hooks a plugin may implement. Each yields typed specs; the registries dispatch by name."""

from __future__ import annotations

from collections.abc import Iterable

import pluggy

from llmx.core.compare.spec import ComparisonSpec
from llmx.core.spec import DatasetSpec, LayerSpec, MethodSpec, ModelSpec, TaskSpec

hookspec = pluggy.HookspecMarker("llmx")
hookimpl = pluggy.HookimplMarker("llmx")


@hookspec
def llmx_methods() -> Iterable[MethodSpec]:
    """Yield the techniques this plugin provides."""


@hookspec
def llmx_models() -> Iterable[ModelSpec]:
    """Yield named model sources (for example ``tiny:llama``)."""


@hookspec
def llmx_datasets() -> Iterable[DatasetSpec]:
    """Yield named text sources (for example ``stdlib``)."""


@hookspec
def llmx_layers() -> Iterable[LayerSpec]:
    """Yield the stored layer types this plugin saves and loads (see ``LayerSpec``)."""


@hookspec
def llmx_tasks() -> Iterable[TaskSpec]:
    """Yield evaluation tasks (prompts a program builds, answers a program judges; see ``TaskSpec``)."""


@hookspec
def llmx_comparisons() -> Iterable[ComparisonSpec]:
    """Yield the comparisons this plugin's papers make (``llmx compare``; see ``ComparisonSpec``)."""
