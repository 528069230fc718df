"""Fields that name something outside the config (a text source, a data file, a model, a checkpoint), declared by
type so that a run checks every stage's before its first stage starts: a typo in the last stage must not cost the
work of the first. Importing this module never imports torch."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

from llmx.errors import Problem


@dataclass(frozen=True)
class Refers:
    kind: Literal["text", "file", "model", "path", "source"]


TextSource = Annotated[str, Refers("text")]  # a dataset name, hf:NAME or a .txt/.jsonl file
DataFile = Annotated[str, Refers("file")]  # a file that must exist
ModelRef = Annotated[str, Refers("model")]  # tiny:/ref: names, a model folder or a hub id
ExistingPath = Annotated[str, Refers("path")]  # a file or folder that must exist (checkpoints)
DataSource = Annotated[str, Refers("source")]  # a dataset name, or a file or folder that must exist


def problem(kind: str, value: str) -> str | None:
    """None when ``value`` can be what ``kind`` says, else why not (without loading anything)."""
    from llmx.core.names import did_you_mean
    from llmx.core.plugins import host

    path = Path(value).expanduser()
    if kind == "text":
        specs = host().datasets
        if value in specs or value.startswith("hf:"):
            return None
        if path.is_file():
            from llmx.core.data.files import check_not_empty
            from llmx.errors import UsageError

            try:
                check_not_empty(path)
            except UsageError as exc:
                return exc.message
            return None
        return f"'{value}' is neither a dataset ({', '.join(specs)}) nor a file.{did_you_mean(value, specs)}"
    if kind == "file":
        return None if path.is_file() else f"file not found: {value}"
    if kind == "path":
        return None if path.exists() else f"not found: {value}"
    if kind == "source":
        specs = host().datasets
        return None if value in specs or path.exists() else (
            f"not found: {value} (neither a file nor a folder nor a dataset: {', '.join(specs)}){did_you_mean(value, specs)}")
    return model_problem(value)


def model_problem(name: str) -> str | None:
    from llmx.core.names import did_you_mean
    from llmx.core.plugins import host

    specs = host().models
    namespace, sep, rest = name.partition(":")
    if name in specs:
        return None
    if sep and f"{namespace}:*" in specs:
        if namespace == "ref":
            from llmx.core.zoo import known_names

            known = known_names()
            return None if name in known else f"unknown model '{name}'.{did_you_mean(name, known)}"
        return None
    if sep and namespace in {s.split(":")[0] for s in specs}:
        known = sorted(s for s in specs if s.startswith(namespace + ":"))
        return f"unknown model '{name}'.{did_you_mean(name, known)}"
    from llmx.core.models import hub, known_names
    from llmx.core.models.storage import check_weight_files
    from llmx.errors import UsageError

    path = Path(name).expanduser()
    try:
        if path.exists() or name.startswith((".", "/", "~")) or name.count("/") > 1:
            if not path.is_dir():
                return f"model folder not found: {name}"
            check_weight_files(path)
        else:
            hub.check(name, known_names())
    except UsageError as exc:
        return exc.message
    return None


def field_kind(info: Any) -> str | None:
    """The ``Refers`` kind of a pydantic field, whether its type is ``TextSource`` or ``TextSource | None``."""
    found = [m.kind for m in info.metadata if isinstance(m, Refers)]
    stack = [info.annotation]
    while stack and not found:
        t = stack.pop()
        found = [m.kind for m in getattr(t, "__metadata__", ()) if isinstance(m, Refers)]
        stack += list(get_args(t)) if get_origin(t) is not Annotated else []
    return found[0] if found else None


def check_params(params: Any, prefix: str) -> list[Problem]:
    """Problems with the referring fields of a pydantic model (nested models and lists of them included)."""
    from pydantic import BaseModel

    out: list[Problem] = []
    for name, info in type(params).model_fields.items():
        value = getattr(params, name)
        kind = field_kind(info)
        for i, item in enumerate(value) if isinstance(value, list) else [(None, value)]:
            where = f"{prefix}{name}" + ("" if i is None else f".{i}")
            if kind and isinstance(item, str):
                why = problem(kind, item)
                if why:
                    out.append(Problem(where, why))
            elif isinstance(item, BaseModel):
                out += check_params(item, f"{where}.")
    return out


def rebase_run(run: Any, folder: Path) -> None:
    """``rebase`` every part of a resolved run: the run's fields, each stage's params, the zoo section."""
    from dataclasses import replace

    rebase(run.config, folder)
    for stage in run.stages:
        rebase(stage.params, folder)
    if run.zoo is not None and _relative(run.zoo.data) and (folder / run.zoo.data).exists() \
            and not Path(run.zoo.data).exists():
        run.zoo = replace(run.zoo, data=str(folder / run.zoo.data))


def rebase(params: Any, folder: Path) -> None:
    """Relative paths in a recipe's referring fields resolve from the recipe's folder (``data: rows.jsonl`` beside
    the recipe); one that exists only from the current folder keeps working as before."""
    from pydantic import BaseModel

    def moved(value: str) -> str:
        beside = folder / value
        return str(beside) if _relative(value) and beside.exists() and not Path(value).exists() else value

    for name, info in type(params).model_fields.items():
        value = getattr(params, name)
        kind = field_kind(info)
        if kind and isinstance(value, str):
            setattr(params, name, moved(value))
        elif kind and isinstance(value, list):
            setattr(params, name, [moved(v) if isinstance(v, str) else v for v in value])
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, BaseModel):
                rebase(item, folder)


def absolute(value: str) -> str:
    """``value`` resolved when it is an existing path (not a ``ns:name`` such as ``ref:x`` or ``hf:x``), else as is:
    ``./corpus.txt`` and ``corpus.txt`` are one file wherever they are read from."""
    path = Path(value).expanduser()
    return str(path.resolve()) if ":" not in value and path.exists() else value


def _relative(value: str) -> bool:
    return ":" not in value and not Path(value).expanduser().is_absolute() and not value.startswith("~")
