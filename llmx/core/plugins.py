"""Plugin loading: built-ins, entry points (group ``llmx``) and loose files, each isolated.

A plugin that fails to import or whose hook raises is recorded as broken (shown by ``llmx plugins``)
and warned about; it never breaks the CLI. ``LLMX_STRICT_PLUGINS=1`` re-raises instead.
A method's ``config="module:Class"`` is imported when first needed: loading only checks that the module exists
(strict mode imports it), ``llmx plugins`` imports every one (a failure marks the plugin broken, as above) and a
command that needs a broken reference stops with a :class:`PluginError` naming the plugin.
``LLMX_DISABLE_PLUGINS=a,b`` skips plugins by name (``*`` skips every non-built-in one).
``LLMX_PLUGINS_DIR`` (``os.pathsep``-separated) and ``--plugins-dir`` add folders of loose ``.py`` plugins.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import importlib.util
import os
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pluggy

from llmx import hookspecs
from llmx.core.compare.spec import ComparisonSpec
from llmx.core.registry import MethodRegistry
from llmx.core.spec import DatasetSpec, LayerSpec, MethodSpec, ModelSpec, PluginError, TaskSpec

ENTRY_POINT_GROUP = "llmx"


class PluginWarning(UserWarning):
    """A third-party plugin could not be loaded."""


@dataclass
class PluginInfo:
    name: str
    source: str  # builtin | entrypoint | file
    location: str
    version: str | None = None
    status: str = "ok"  # ok | broken | disabled
    error: str | None = None
    methods: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)
    datasets: list[str] = field(default_factory=list)
    tasks: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _strict() -> bool:
    return os.environ.get("LLMX_STRICT_PLUGINS", "") not in ("", "0", "false", "no")


def _disabled() -> set[str]:
    return {p.strip() for p in os.environ.get("LLMX_DISABLE_PLUGINS", "").split(",") if p.strip()}


class PluginHost:
    """Loads every plugin once and builds the method, model, dataset, layer and task registries."""

    def __init__(self, plugin_dirs: list[Path] | None = None):
        self.pm = pluggy.PluginManager("llmx")
        self.pm.add_hookspecs(hookspecs)
        self.infos: list[PluginInfo] = []
        self.methods = MethodRegistry()
        self.models: dict[str, ModelSpec] = {}
        self.datasets: dict[str, DatasetSpec] = {}
        self.layers: dict[str, LayerSpec] = {}
        self.tasks: dict[str, TaskSpec] = {}
        self.comparisons: dict[str, ComparisonSpec] = {}
        env_dirs = [Path(p) for p in os.environ.get("LLMX_PLUGINS_DIR", "").split(os.pathsep) if p]
        self._load(list(plugin_dirs or []) + env_dirs)

    def _load(self, plugin_dirs: list[Path]) -> None:
        from llmx.plugins import BUILTIN

        disabled = _disabled()
        for modname in BUILTIN:
            short = modname.removeprefix("llmx.plugins.").removesuffix(".plugin")
            info = PluginInfo(short, "builtin", modname)
            self._add(info, lambda m=modname: importlib.import_module(m), disabled, builtin=True)
        for ep in sorted(md.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            dist = getattr(ep, "dist", None)
            info = PluginInfo(ep.name, "entrypoint", ep.value, version=dist.version if dist else None)
            self._add(info, ep.load, disabled)
        for folder in plugin_dirs:
            for path in sorted(Path(folder).glob("*.py")):
                info = PluginInfo(path.stem, "file", str(path))
                self._add(info, lambda p=path: _import_file(p), disabled)

    def _add(self, info: PluginInfo, loader, disabled: set[str], builtin: bool = False) -> None:
        self.infos.append(info)
        if info.name in disabled or ("*" in disabled and not builtin):
            info.status = "disabled"
            return
        plugin = None
        try:
            plugin = loader()
            self.pm.register(plugin, name=f"{info.source}:{info.name}")
            self._collect(plugin, info)
        except Exception as exc:  # noqa: BLE001 - isolation is the point
            if plugin is not None and self.pm.is_registered(plugin):
                self.pm.unregister(plugin)
            self._broken(info, exc)

    def _broken(self, info: PluginInfo, exc: Exception) -> None:
        info.status, info.error = "broken", f"{type(exc).__name__}: {exc}"
        if _strict():
            raise exc
        warnings.warn(f"llmx plugin {info.name!r} failed to load: {info.error}", PluginWarning, stacklevel=3)

    def _collect(self, plugin: object, info: PluginInfo) -> None:
        """Call this plugin's hooks only, so an error is attributed to it; commit only if all succeed."""
        methods = [_tag(s, info.name) for s in _call(plugin, "llmx_methods", MethodSpec)]
        for s in methods:  # a config reference's module must exist; strict mode imports it
            if _strict():
                _ = s.config
            else:
                s.check_config()
        models = [_tag(s, info.name) for s in _call(plugin, "llmx_models", ModelSpec)]
        datasets = [_tag(s, info.name) for s in _call(plugin, "llmx_datasets", DatasetSpec)]
        layers = [_tag(s, info.name) for s in _call(plugin, "llmx_layers", LayerSpec)]
        tasks = [_tag(s, info.name) for s in _call(plugin, "llmx_tasks", TaskSpec)]
        comparisons = [_tag(s, info.name) for s in _call(plugin, "llmx_comparisons", ComparisonSpec)]
        for table, specs in ((self.models, models), (self.datasets, datasets), (self.layers, layers),
                             (self.tasks, tasks), (self.comparisons, comparisons)):
            for s in specs:
                if s.name in table:
                    raise ValueError(f"{s.name!r} is already provided by plugin {table[s.name].plugin}")
        staged = self.methods.copy()
        for s in methods:
            staged.add(s)
        self.methods = staged
        self.models.update({s.name: s for s in models})
        self.datasets.update({s.name: s for s in datasets})
        self.layers.update({s.name: s for s in layers})
        self.tasks.update({s.name: s for s in tasks})
        self.comparisons.update({s.name: s for s in comparisons})
        info.methods = [s.name for s in methods]
        info.models = [s.name for s in models]
        info.datasets = [s.name for s in datasets]
        info.tasks = [s.name for s in tasks]

    def check_configs(self) -> None:
        """Import every method's parameter model (``llmx plugins`` does): a plugin whose reference fails is marked
        broken, warned about (strict mode re-raises) and its methods leave the registry."""
        for info in self.infos:
            if info.status != "ok":
                continue
            try:
                for spec in self.methods:
                    if spec.plugin == info.name:
                        _ = spec.config
            except PluginError as exc:
                self.methods = self.methods.without(info.name)
                info.methods = []
                self._broken(info, exc)

    def comparison(self, name: str) -> ComparisonSpec:
        """The comparison called ``name`` (case and separators ignored), or a usage error with a did-you-mean."""
        from llmx.core.names import did_you_mean, normalize
        from llmx.errors import UsageError

        found = {normalize(n): s for n, s in self.comparisons.items()}.get(normalize(name))
        if found is None:
            raise UsageError(f"unknown comparison '{name}'.{did_you_mean(name, self.comparisons)}",
                             hint=f"Known comparisons: {', '.join(sorted(self.comparisons)) or 'none'} "
                                  "(llmx compare list).")
        return found

    def task(self, name: str) -> TaskSpec:
        """The task called ``name`` (case and separators ignored), or a usage error with a did-you-mean."""
        from llmx.core.names import did_you_mean, normalize
        from llmx.errors import UsageError

        found = {normalize(n): s for n, s in self.tasks.items()}.get(normalize(name))
        if found is None:
            raise UsageError(f"unknown task '{name}'.{did_you_mean(name, self.tasks)}",
                             hint=f"Known tasks: {', '.join(sorted(self.tasks)) or 'none'} (llmx tasks).")
        return found


def _call(plugin: object, hook: str, kind: type) -> list:
    fn = getattr(plugin, hook, None)
    if fn is None:
        return []
    out = list(fn() or [])
    for item in out:
        if not isinstance(item, kind):
            raise TypeError(f"{hook}() yielded {type(item).__name__}, expected {kind.__name__}")
    return out


def _tag(spec, plugin_name: str):
    object.__setattr__(spec, "plugin", plugin_name)
    return spec


def _import_file(path: Path) -> ModuleType:
    """Import a loose plugin file under its own name (so ``impl="my_plugin:run"`` resolves as written), unless that
    name is another module's; then under a private one."""
    name = path.stem
    if name in sys.modules or _elsewhere(name, path):
        name = f"llmx_user_plugin_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _elsewhere(name: str, path: Path) -> bool:
    try:
        found = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    return found is not None and (found.origin is None or Path(found.origin).resolve() != path.resolve())


_HOST: PluginHost | None = None
_HOST_DIRS: list[Path] = []


def configure(plugin_dirs: list[Path]) -> None:
    """Set the loose-plugin folders (from ``--plugins-dir``) before the host is first built."""
    global _HOST, _HOST_DIRS
    _HOST_DIRS = list(plugin_dirs)
    _HOST = None


def host() -> PluginHost:
    """The process-wide host, built on first use."""
    global _HOST
    if _HOST is None:
        _HOST = PluginHost(_HOST_DIRS)
    return _HOST
