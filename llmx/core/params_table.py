"""A method's parameters as one table: name, type, default and description, read from its pydantic params model.

``llmx methods show`` prints these rows and ``scripts/gen_docs.py`` writes them into each method's page, so the
terminal and the documentation cannot disagree (``tests/test_docs.py`` fails when a committed page is stale). A
nested params model (``lora``) adds one dotted row per field (``lora.r``), the dotted key ``--set`` takes. Importing
this module never imports torch.
"""

from __future__ import annotations

import enum
import types
import typing
from pathlib import PurePath
from typing import Any, NamedTuple

from pydantic import BaseModel

COLUMNS = ("name", "type", "default", "description")
REQUIRED = "(required)"


class Row(NamedTuple):
    name: str
    type: str
    default: str
    description: str


def rows(model: type[BaseModel], defaults: BaseModel | None = None, prefix: str = "") -> list[Row]:
    """One row per field of ``model``, in declaration order; ``defaults`` is an instance whose values are the
    defaults (a nested field's own default, which may differ from its class's)."""
    out: list[Row] = []
    for name, f in model.model_fields.items():
        if defaults is not None:
            value, required = getattr(defaults, name), False
        elif f.is_required():
            value, required = None, True
        else:
            value, required = f.get_default(call_default_factory=True, validated_data={}), False  # {}: pydantic 2.10
        nested = _model_class(f.annotation)
        out.append(Row(prefix + name, type_name(f.annotation, f.metadata),
                       REQUIRED if required else (f"({name}.* below)" if nested else default_text(value)),
                       " ".join((f.description or "").split())))
        if nested:
            out += rows(nested, value if isinstance(value, nested) else None, prefix=f"{prefix}{name}.")
    return out


def _model_class(annotation: Any) -> type[BaseModel] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def type_name(annotation: Any, metadata: list[Any] | tuple[Any, ...] = ()) -> str:
    """``int``, ``float | None``, ``'cosine' | 'linear'``, ``list[str]``, ``str (file)``, with the field's bounds
    (``int, >= 1``)."""
    bounds = [f"{op} {getattr(m, attr)}" for m in metadata for attr, op in
              (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")) if getattr(m, attr, None) is not None]
    return ", ".join([_name(annotation), *bounds])


def _name(t: Any) -> str:
    origin, args = typing.get_origin(t), typing.get_args(t)
    if t is type(None) or t is None:
        return "None"
    if origin is typing.Annotated:
        kinds = [str(m.kind) for m in args[1:] if type(m).__name__ == "Refers" and hasattr(m, "kind")]
        return _name(args[0]) + (f" ({kinds[0]})" if kinds else "")
    if origin is typing.Union or origin is types.UnionType:
        parts = [_name(a) for a in args if a is not type(None)]
        return " | ".join(parts + ["None"] * (len(parts) < len(args)))
    if origin is typing.Literal:
        return " | ".join(repr(a.value if isinstance(a, enum.Enum) else a) for a in args)
    if origin is not None:
        base = getattr(origin, "__name__", str(origin).replace("typing.", ""))
        return f"{base}[{', '.join('...' if a is Ellipsis else _name(a) for a in args)}]" if args else base
    if isinstance(t, type):
        return t.__name__
    return str(t).replace("typing.", "")


def default_text(value: Any) -> str:
    """A default as Python writes it (``'w4a16'``, ``None``, ``[0, 1]``); enums by value, paths as strings."""
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, PurePath):
        value = str(value)
    if isinstance(value, BaseModel):
        value = value.model_dump()
    return repr(value)


def markdown(table: list[Row]) -> str:
    """The rows as a Markdown table (the docs' copy): code spans for names, types and defaults."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in table:
        lines.append(f"| {code_cell(r.name)} | {code_cell(r.type)} | {code_cell(r.default)} | {text_cell(r.description)} |")
    return "\n".join(lines) + "\n"


def code_cell(text: str) -> str:
    """A table cell in a code span (Python-Markdown's tables do not split on a pipe inside one); a backtick in the
    text is fenced by two."""
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def text_cell(text: str) -> str:
    """Prose in a table cell, its `code spans` kept: outside them, pipes and HTML-looking brackets escaped."""
    parts = text.split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick: no code spans at all
        parts = [text.replace("`", "\\`")]
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts)
