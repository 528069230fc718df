"""Typed specs that plugins yield from their hooks. Importing this module never imports torch."""

from __future__ import annotations

import importlib
import importlib.util
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, model_validator

from llmx.errors import LlmxError


class Stage(str, Enum):
    """The pipeline stages a method can serve."""

    QUANTIZE = "quantize"
    PRUNE = "prune"
    TRAIN = "train"
    ALIGN = "align"
    DECODE = "decode"
    EVAL = "eval"
    ANALYZE = "analyze"
    EXPORT = "export"

    def __str__(self) -> str:
        return self.value


class Params(BaseModel):
    """Base of every method's parameter model: unknown keys are errors, defaults are validated."""

    model_config = ConfigDict(extra="forbid", validate_default=True)

    @model_validator(mode="before")
    @classmethod
    def _literal_ints_from_text(cls, data: Any) -> Any:
        """``--set bits=4`` arrives as text: a field that takes a few ints (``Literal[1, 2, 4, 8]``) gets the int, as
        an ``int`` field would by pydantic's own coercion (a ``Literal`` does not coerce)."""
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for name, value in data.items():
            field = cls.model_fields.get(name)
            choices = get_args(field.annotation) if field and get_origin(field.annotation) is Literal else ()
            if isinstance(value, str) and value.strip().lstrip("-").isdigit() and choices \
                    and all(isinstance(c, int) for c in choices):
                out[name] = int(value)
        return out


def load_object(path: str) -> Any:
    """Import ``"package.module:attr"`` lazily; the registry calls this only when a method runs."""
    module, _, attr = path.partition(":")
    obj = importlib.import_module(module)
    for part in filter(None, attr.split(".")):
        obj = getattr(obj, part)
    return obj


_REFERENCE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


class PluginError(LlmxError):
    """A plugin's declaration that cannot be honoured where it is used (a config reference that does not import)."""


class _LazyConfig:
    """``MethodSpec.config``: stores the class or ``"module:Class"`` as given; reading it gives the class, importing
    a string reference on first read (so listing methods imports no parameter model)."""

    GIVEN, LOADED = "_config_given", "_config_class"

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return Params  # the dataclass default
        cls = obj.__dict__.get(self.LOADED)
        if cls is None:
            cls = obj.__dict__[self.LOADED] = obj.resolve_config()
        return cls

    def __set__(self, obj: Any, value: Any) -> None:  # the dataclass __init__ (frozen: nothing else sets it)
        obj.__dict__[self.GIVEN] = value
        obj.__dict__.pop(self.LOADED, None)
        if not isinstance(value, str):
            obj.__dict__[self.LOADED] = value


@dataclass(frozen=True)
class MethodSpec:
    """What a plugin declares about one technique.

    ``impl`` is ``"module:callable"``, imported only when the method runs; the callable takes
    ``(ctx: RunContext, params)`` and returns a mapping of metrics (or None).
    ``config`` is the parameter model: a :class:`Params` subclass, or ``"module:Class"`` imported the first time
    ``spec.config`` is read (validating a run, ``llmx methods show``), never by ``llmx methods``. Reading
    ``spec.config`` always gives the class; ``config_ref`` is the reference as written.
    ``requires`` names hard requirements checked before the run: ``gpu``, ``cupy`` (the method's CUDA path runs
    CuPy kernels: needed with ``--device cuda`` only) or an importable module name such as ``bitsandbytes``.
    """

    name: str
    stages: tuple[Stage, ...]
    impl: str
    config: type[Params] | str = _LazyConfig()  # type: ignore[assignment]
    summary: str = ""
    paper: str = ""
    aliases: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()
    plugin: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "stages", tuple(Stage(s) for s in self.stages))
        if not self.stages:
            raise ValueError(f"method {self.name!r} declares no stages")
        if ":" not in self.impl:
            raise ValueError(f"method {self.name!r}: impl must be 'module:callable', got {self.impl!r}")
        ref = self.config_ref
        if isinstance(ref, str):
            if not _REFERENCE.fullmatch(ref):
                raise ValueError(f"method {self.name!r}: config must be a pydantic model class or 'module:Class', "
                                 f"got {ref!r}")
        elif not _is_model(ref):
            raise ValueError(f"method {self.name!r}: config must be a pydantic model class")

    @property
    def config_ref(self) -> type[Params] | str:
        """The config as the plugin wrote it: a class, or ``"module:Class"`` (reading this imports nothing)."""
        return self.__dict__[_LazyConfig.GIVEN]

    @property
    def config_name(self) -> str:
        """``"module:Class"`` for either form, without importing anything."""
        ref = self.config_ref
        return ref if isinstance(ref, str) else f"{ref.__module__}:{ref.__qualname__}"

    def check_config(self) -> None:
        """Cheap load-time check of a string reference: its module exists (found, not imported); raises ImportError."""
        ref = self.config_ref
        if not isinstance(ref, str) or _LazyConfig.LOADED in self.__dict__:
            return
        module = ref.partition(":")[0]
        try:
            found = importlib.util.find_spec(module)
        except (ImportError, ValueError) as exc:
            raise ImportError(f"method {self.name!r}: config {ref!r}: {type(exc).__name__}: {exc}") from exc
        if found is None:
            raise ModuleNotFoundError(f"method {self.name!r}: config {ref!r}: No module named {module!r}")

    def resolve_config(self) -> type[Params]:
        """Import a ``"module:Class"`` reference; a failure is a :class:`PluginError` naming the plugin and method."""
        ref = self.config_ref
        if not isinstance(ref, str):
            return ref
        try:
            cls = load_object(ref)
        except Exception as exc:  # noqa: BLE001 - any import failure is the plugin's, said so
            raise self._config_error(f"{type(exc).__name__}: {exc}") from exc
        if not _is_model(cls):
            raise self._config_error(f"{cls!r} is not a pydantic model class")
        return cls

    def _config_error(self, why: str) -> PluginError:
        who = f"plugin {self.plugin!r}: " if self.plugin else ""
        hint = "`llmx plugins` shows each plugin's status"
        if self.plugin:
            hint += f"; LLMX_DISABLE_PLUGINS={self.plugin} skips this one"
        return PluginError(f"{who}method {self.name!r}: config {self.config_ref!r} cannot be loaded: {why}",
                           hint=hint + ".")

    def load(self) -> Callable[..., Any]:
        return load_object(self.impl)

    def describe(self) -> dict[str, Any]:
        """A JSON-ready description, including the parameter schema."""
        params = []
        for fname, f in self.config.model_fields.items():
            default = None if f.is_required() else f.get_default(call_default_factory=True, validated_data={})
            params.append(
                {
                    "name": fname,
                    "type": _type_name(f.annotation),
                    "default": default if isinstance(default, (int, float, str, bool, type(None), list, dict)) else str(default),
                    "required": f.is_required(),
                    "help": f.description or "",
                }
            )
        return {
            "name": self.name,
            "aliases": list(self.aliases),
            "stages": [s.value for s in self.stages],
            "summary": self.summary,
            "paper": self.paper,
            "requires": list(self.requires),
            "plugin": self.plugin,
            "params": params,
        }


def _is_model(obj: Any) -> bool:
    return isinstance(obj, type) and issubclass(obj, BaseModel)


def _type_name(annotation: Any) -> str:
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


@dataclass(frozen=True)
class ModelSpec:
    """A named model source (``tiny:llama``, ``ref:llama``): ``impl`` builds or loads it lazily.

    The callable takes ``(name: str, dtype: str, device: str)`` and returns ``(model, tokenizer)``.
    """

    name: str
    impl: str
    summary: str = ""
    plugin: str = field(default="", compare=False)


@dataclass(frozen=True)
class LayerSpec:
    """A layer type llmx saves in its own stored form (a packed QuantLinear, a bitsandbytes layer, a pruned
    attention): a saved model's ``llmx.json`` names the layer (``"layer": name``) and loading calls the ``builder``
    registered here, ``(spec, tensors, dtype, config) -> module``; code is never imported by a name read from a file."""

    name: str
    builder: str
    summary: str = ""
    plugin: str = field(default="", compare=False)


@dataclass(frozen=True)
class DatasetSpec:
    """A named text source (``stdlib``): ``impl`` returns an iterable of documents for a split."""

    name: str
    impl: str
    summary: str = ""
    plugin: str = field(default="", compare=False)


@dataclass(frozen=True)
class TaskSpec:
    """An evaluation whose rows a program builds and whose answers a program judges (``llmx tasks``).

    ``rows`` (``"module:callable"`` or a callable) takes ``(split, seed)`` and returns a list of dicts, each with a
    ``prompt``; kind ``choice`` rows add ``choices`` (label words or answers) and ``answer`` (the right one's index),
    scored by log-likelihood of ``delimiter + choice``; kind ``generate`` rows are completed by the model (up to a
    ``stop`` string, kept when ``include_stop``) and ``judge(row, completion)`` scores each completion: a bool or a
    float (1 or more passes), or ``(score, note)`` where the note says why. A row's ``reference`` (a gold
    completion) adds its NLL to the metrics. ``samples`` and ``temperature`` are the task's defaults; ``metrics``
    names what it reports; ``requires`` are importable modules it needs; ``runs_code`` says its judge runs
    model-written code in the sandbox (``core.eval.sandbox``), so a machine that cannot confine it is refused before
    any generation.
    """

    name: str
    rows: str | Callable[..., list[dict]]
    judge: str | Callable[..., Any] | None = None
    kind: str = "generate"
    splits: tuple[str, ...] = ("validation",)
    metrics: tuple[str, ...] = ("score",)
    stop: tuple[str, ...] = ()
    include_stop: bool = False
    max_new_tokens: int = 64
    samples: int = 1
    temperature: float = 0.0
    delimiter: str = " "
    requires: tuple[str, ...] = ()
    runs_code: bool = False
    summary: str = ""
    plugin: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.kind not in ("generate", "choice"):
            raise ValueError(f"task {self.name!r}: kind must be 'generate' or 'choice', got {self.kind!r}")
        if self.kind == "generate" and self.judge is None:
            raise ValueError(f"task {self.name!r}: a generate task needs a judge")
        if not self.splits:
            raise ValueError(f"task {self.name!r} declares no splits")

    def load_rows(self) -> Callable[..., list[dict]]:
        return load_object(self.rows) if isinstance(self.rows, str) else self.rows

    def load_judge(self) -> Callable[..., Any]:
        return load_object(self.judge) if isinstance(self.judge, str) else self.judge

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "splits": list(self.splits), "metrics": list(self.metrics),
                "samples": self.samples, "temperature": self.temperature, "max_new_tokens": self.max_new_tokens,
                "stop": list(self.stop), "include_stop": self.include_stop, "delimiter": self.delimiter,
                "requires": list(self.requires), "runs_code": self.runs_code, "summary": self.summary,
                "plugin": self.plugin}
