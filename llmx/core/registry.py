"""Method registry: dispatch by normalised name or alias (and stage), with did-you-mean and stage checks.

One name may be served by several specs for different stages (``clover`` prunes, and trains with its own
parameters), so a lookup is by (name, stage); without a stage it finds the name's first spec.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from llmx.core.names import did_you_mean, normalize
from llmx.core.spec import MethodSpec, Stage
from llmx.errors import UsageError


class MethodRegistry:
    def __init__(self, specs: Iterable[MethodSpec] = ()):
        self._specs: list[MethodSpec] = []
        self._index: dict[str, list[MethodSpec]] = {}
        for spec in specs:
            self.add(spec)

    def add(self, spec: MethodSpec) -> None:
        """Register ``spec``; a name or alias already serving one of its stages raises ValueError naming the owner."""
        keys = [normalize(spec.name)] + [normalize(a) for a in spec.aliases]
        for key in keys:
            for other in self._index.get(key, []):
                if set(other.stages) & set(spec.stages):
                    raise ValueError(f"method name {key!r} is already provided by plugin {other.plugin or '?'}")
        self._specs.append(spec)
        for key in keys:
            self._index.setdefault(key, []).append(spec)

    def copy(self) -> MethodRegistry:
        """A registry with the same specs in the same order (the order decides a name's default stage)."""
        return MethodRegistry(self._specs)

    def without(self, plugin: str) -> MethodRegistry:
        """A registry without ``plugin``'s methods (the rest in the same order)."""
        return MethodRegistry(s for s in self._specs if s.plugin != plugin)

    def __iter__(self) -> Iterator[MethodSpec]:
        return iter(sorted(self._specs, key=lambda s: (s.stages[0].value, s.name)))

    def __len__(self) -> int:
        return len(self._specs)

    def names(self, stage: Stage | None = None) -> list[str]:
        return sorted({s.name for s in self._specs if stage is None or stage in s.stages})

    def variants(self, name: str) -> list[MethodSpec]:
        """Every spec a name (or alias) resolves to, one per stage group (raises like :meth:`get` when unknown)."""
        self.get(name)
        return list(self._index[normalize(name)])

    def get(self, name: str, stage: Stage | str | None = None) -> MethodSpec:
        key = normalize(name)
        stage_ = Stage(stage) if stage else None
        if key not in self._index:
            pool = self.names(stage_) or self.names()
            aliases = [a for s in self._specs if stage_ is None or stage_ in s.stages for a in s.aliases]
            raise UsageError(
                f"unknown method '{name}'.{did_you_mean(name, pool + aliases)}",
                hint=f"Known{' ' + stage_.value if stage_ else ''} methods: {', '.join(pool) or 'none'}.",
            )
        candidates = self._index[key]
        if stage_ is None:
            return candidates[0]
        for spec in candidates:
            if stage_ in spec.stages:
                return spec
        supported = ", ".join(s.value for spec in candidates for s in spec.stages)
        others = self.names(stage_)
        raise UsageError(
            f"method '{candidates[0].name}' does not support stage '{stage_.value}' (it supports: {supported})",
            hint=f"Methods for {stage_.value}: {', '.join(others) or 'none'}.",
        )
