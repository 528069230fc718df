"""Pasta-Lang rows from the standard library, annotated by program (the paper annotates SlimOrca with an LLM, notes
§2; code gives independence for free: a method that touches no sibling can be written in parallel with them).

A row's prompt is a class's header and docstring (or ``# <file>`` for a run of module-level functions); its response
is the rest of the source, exactly, with each independent method or function an async chunk where its text was:
``<promise topic="NAME" tokens="N"/><async>TEXT</async>``, N the positions the chunk occupies (both tags counted).
Class attributes, ``__init__``, comments between members and every member that refers to a sibling member
(``self.name``, ``cls.name``, ``Class.name``; a bare ``name`` between functions; a decorator such as ``@name.setter``)
stay in the main stream; ``<sync/>`` closes the response. Files split train/validation as the ``stdlib`` corpus does.
"""

from __future__ import annotations

import ast
import sysconfig
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from llmx.core.data import in_validation, stdlib
from llmx.core.data.files import json_lines
from llmx.errors import UsageError
from llmx.plugins.pasta import lang

Tokenize = Callable[[str], list[int]]
_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)


@dataclass(frozen=True)
class Options:
    max_chars: int = 1200  # prompt + plain response
    max_method_lines: int = 12
    min_chunks: int = 2
    max_chunks: int = 6
    functions: bool = True
    limit: int | None = None


@dataclass
class Report:
    files: int = 0
    classes: int = 0
    function_runs: int = 0
    rows: Counter = field(default_factory=Counter)  # by split
    skipped: Counter = field(default_factory=Counter)  # by reason (files unread or unparsed included)

    def as_dict(self) -> dict:
        return {"files": self.files, "classes_scanned": self.classes, "function_runs_scanned": self.function_runs,
                "rows": sum(self.rows.values()), "rows_train": self.rows["train"],
                "rows_validation": self.rows["validation"], "skipped": dict(sorted(self.skipped.items()))}


@dataclass(frozen=True)
class _Unit:
    """A candidate row: ``prompt``, then source lines ``start..end`` (1-based) holding ``members`` in order."""

    name: str
    prompt: str
    start: int
    end: int
    members: list[ast.FunctionDef | ast.AsyncFunctionDef]
    asyncs: list[bool]


def _lines(text: str) -> list[str]:
    """Lines split at ``\\n`` only, as ``ast`` numbers them (``splitlines`` also splits at form feeds)."""
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _first(node: ast.AST) -> int:
    return min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])


def _span(node: ast.AST) -> int:
    return node.end_lineno - _first(node) + 1


def _sibling_refs(node: ast.AST, owners: set[str]) -> set[str]:
    """Names ``node`` reaches through ``owner.name`` (owners: self, cls, the class) or, for functions (owners
    empty), as bare names; decorators' bare names count in both cases (``@prop.setter``)."""
    out = {n.id for d in node.decorator_list for n in ast.walk(d) if isinstance(n, ast.Name)}
    for n in ast.walk(node):
        if owners and isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in owners:
            out.add(n.attr)
        elif not owners and isinstance(n, ast.Name):
            out.add(n.id)
    return out


def _asyncs(members: list, class_name: str | None) -> list[bool]:
    """Which members become chunks: not ``__init__``, and no reference to another member."""
    out = []
    for m in members:
        others = {o.name for o in members if o is not m}
        args = m.args.posonlyargs + m.args.args
        owners = set()
        if class_name:
            owners = {class_name, args[0].arg} if args else {class_name}
        out.append(m.name != "__init__" and not (_sibling_refs(m, owners) & others))
    return out


def _class_unit(node: ast.ClassDef, lines: list[str], module: str, opts: Options, report: Report) -> _Unit | None:
    report.classes += 1
    members = [n for n in node.body if isinstance(n, _FUNCS)]
    if len(members) < 2:
        report.skipped["few_methods"] += 1
        return None
    if any(_span(m) > opts.max_method_lines for m in members):
        report.skipped["long_method"] += 1
        return None
    doc, rest = node.body[0], node.body[1:]
    if isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str):
        head_end = doc.end_lineno
    else:  # the header: its last line before the body that is neither blank nor a comment
        head_end = max(i for i in range(node.lineno, _first(doc)) if lines[i - 1].strip()[:1] not in ("", "#"))
        rest = node.body
    if _first(rest[0]) <= head_end:
        report.skipped["shared_line"] += 1
        return None
    prompt = "".join(lines[_first(node) - 1:head_end])
    return _Unit(f"{module}:{node.name}", prompt, head_end + 1, node.end_lineno, members, _asyncs(members, node.name))


def _runs(body: list[ast.stmt], opts: Options) -> Iterator[list]:
    """Maximal runs of consecutive short module-level functions (two or more)."""
    run: list = []
    for stmt in [*body, None]:
        if isinstance(stmt, _FUNCS) and _span(stmt) <= opts.max_method_lines:
            run.append(stmt)
            continue
        if len(run) >= 2:
            yield run
        run = []


def _function_units(tree: ast.Module, lines: list[str], module: str, rel: str, opts: Options,
                    report: Report) -> Iterator[_Unit]:
    """Each run packed greedily into groups of at most ``max_chunks`` functions that fit ``max_chars``."""
    prompt = f"# {rel}\n"
    for run in _runs(tree.body, opts):
        i = 0
        while i < len(run):
            j = i + 1
            while (j < len(run) and j - i < opts.max_chunks and len(prompt)
                   + sum(map(len, lines[_first(run[i]) - 1:run[j].end_lineno])) <= opts.max_chars):
                j += 1
            group, i = run[i:j], j
            if len(group) < 2:
                continue
            report.function_runs += 1
            yield _Unit(f"{module}:{group[0].name}@{_first(group[0])}", prompt, _first(group[0]),
                        group[-1].end_lineno, group, _asyncs(group, None))


def _row(unit: _Unit, lines: list[str], split: str, tokenize: Tokenize, opts: Options, report: Report) -> dict | None:
    plain = "".join(lines[unit.start - 1:unit.end])
    chunks = sum(unit.asyncs)
    reason = ("special_text" if any(s in unit.prompt + plain for s in (*lang.SPECIALS, "\t", "\r"))
              else "too_long" if len(unit.prompt) + len(plain) > opts.max_chars
              else "few_chunks" if chunks < opts.min_chunks else "many_chunks" if chunks > opts.max_chunks else None)
    if reason:
        report.skipped[reason] += 1
        return None
    pieces: list[str | lang.Promise] = []
    at = unit.start
    for m, is_async in zip(unit.members, unit.asyncs, strict=True):
        if not is_async:
            continue
        before, text = "".join(lines[at - 1:_first(m) - 1]), "".join(lines[_first(m) - 1:m.end_lineno])
        pieces += [before] if before else []
        pieces.append(lang.Promise(m.name, len(tokenize(lang.ASYNC_OPEN + text + lang.ASYNC_CLOSE)), text))
        at = m.end_lineno + 1
    tail = "".join(lines[at - 1:unit.end])
    pieces += [tail] if tail else []
    response = lang.render(pieces, sync=len(pieces))
    if lang.strip(response) != plain:
        raise RuntimeError(f"pasta annotate: {unit.name} does not strip back to its source")
    report.rows[split] += 1
    promises = [p for p in pieces if isinstance(p, lang.Promise)]
    return {"name": unit.name, "split": split, "prompt": unit.prompt, "response": response, "plain": plain,
            "chunks": len(promises), "chunk_tokens": [p.tokens for p in promises]}


def build(tokenize: Tokenize, opts: Options = Options(), root: Path | None = None) -> tuple[list[dict], Report]:
    """Annotated rows from the standard library under ``root``, in sorted file order, and what was skipped."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    rows, report = [], Report()
    for path in stdlib.files(root):
        rel = path.relative_to(root).as_posix()
        try:
            text = path.read_bytes().decode("utf-8")
            tree = ast.parse(text)
        except (UnicodeDecodeError, SyntaxError, ValueError):
            report.skipped["unparsed_file"] += 1
            continue
        report.files += 1
        lines, split = _lines(text), "validation" if in_validation(rel) else "train"
        module = rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        units = [_class_unit(n, lines, module, opts, report) for n in tree.body if isinstance(n, ast.ClassDef)]
        if opts.functions:
            units += _function_units(tree, lines, module, rel, opts, report)
        for unit in sorted((u for u in units if u), key=lambda u: u.start):
            row = _row(unit, lines, split, tokenize, opts, report)
            if row:
                rows.append(row)
                if opts.limit is not None and len(rows) >= opts.limit:
                    return rows, report
    return rows, report


def load(path: str | Path) -> list[dict]:
    """Rows of an annotated .jsonl, each response checked by ``lang.parse`` (and against ``plain`` and
    ``chunk_tokens`` when present); a bad row is a ``UsageError`` naming ``file:line``."""
    rows = []
    for where, row in json_lines(path):
        try:
            rows.append(_check(row))
        except (UsageError, ValueError) as e:
            raise UsageError(f"{where}: {getattr(e, 'message', e)}") from None
    if not rows:
        raise UsageError(f"{path}: no annotated rows")
    return rows


def _check(row: object) -> dict:
    if not isinstance(row, dict) or not all(isinstance(row.get(k), str) for k in ("prompt", "response")):
        raise ValueError("a row needs string fields 'prompt' and 'response'")
    parsed = lang.parse(row["response"])
    if "plain" in row and lang.strip(row["response"]) != row["plain"]:
        raise ValueError("'response' without its tags differs from 'plain'")
    if "chunk_tokens" in row and row["chunk_tokens"] != [p.tokens for p in parsed.promises]:
        raise ValueError("'chunk_tokens' differs from the promises' tokens")
    return row
