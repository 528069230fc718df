"""The contract a method's implementation fulfils."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from llmx.core.context import RunContext
from llmx.core.spec import Params


class Method(Protocol):
    """``impl`` of a MethodSpec: called once per stage with the run context and validated params.

    It reads ``ctx.model`` / ``ctx.tokenizer`` (loaded lazily), hands a transformed model on with
    ``ctx.set_model``, writes artifacts under ``ctx.artifact(name)`` and returns its metrics.
    """

    def __call__(self, ctx: RunContext, params: Params) -> Mapping[str, Any] | None: ...
