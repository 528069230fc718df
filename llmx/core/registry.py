"""Method registry: dispatch by normalised name or alias, with did-you-mean and stage checks."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from llmx.core.names import did_you_mean, normalize
from llmx.core.spec import MethodSpec, Stage
from llmx.errors import UsageError


class MethodRegistry:
    def __init__(self, specs: Iterable[MethodSpec] = ()):
        self._specs: dict[str, MethodSpec] = {}
        self._index: dict[str, str] = {}
        for spec in specs:
            self.add(spec)

    def add(self, spec: MethodSpec) -> None:
        """Register ``spec``; a name or alias already taken raises ValueError naming the owner."""
        keys = [normalize(spec.name)] + [normalize(a) for a in spec.aliases]
        for key in keys:
            if key in self._index:
                owner = self._specs[self._index[key]]
                raise ValueError(f"method name {key!r} is already provided by plugin {owner.plugin or '?'}")
        self._specs[spec.name] = spec
        for key in keys:
            self._index[key] = spec.name

    def __iter__(self) -> Iterator[MethodSpec]:
        return iter(sorted(self._specs.values(), key=lambda s: (s.stages[0].value, s.name)))

    def __len__(self) -> int:
        return len(self._specs)

    def names(self, stage: Stage | None = None) -> list[str]:
        return sorted(s.name for s in self._specs.values() if stage is None or stage in s.stages)

    def get(self, name: str, stage: Stage | str | None = None) -> MethodSpec:
        key = normalize(name)
        if key not in self._index:
            stage_ = Stage(stage) if stage else None
            pool = self.names(stage_) or self.names()
            aliases = [a for s in self._specs.values() if stage_ is None or stage_ in s.stages for a in s.aliases]
            raise UsageError(
                f"unknown method '{name}'.{did_you_mean(name, pool + aliases)}",
                hint=f"Known{' ' + stage_.value if stage_ else ''} methods: {', '.join(pool) or 'none'}.",
            )
        spec = self._specs[self._index[key]]
        if stage is not None and Stage(stage) not in spec.stages:
            supported = ", ".join(s.value for s in spec.stages)
            others = self.names(Stage(stage))
            raise UsageError(
                f"method '{spec.name}' does not support stage '{Stage(stage).value}' (it supports: {supported})",
                hint=f"Methods for {Stage(stage).value}: {', '.join(others) or 'none'}.",
            )
        return spec
