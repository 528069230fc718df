"""Seed functions from the standard library and the scenarios spliced from them.

A seed is a top-level function with a docstring and a short body (2-20 lines) in a standard-library file of one
split (files split by path hash, as the ``stdlib`` corpus). Its benign prompt is the signature and docstring (the
utility prompt); its inducing variant for a CWE adds the elicitor's imports and task sentence to the docstring. The
model then continues the elicitor's statement start, so a response is ``start + completion``."""

from __future__ import annotations

import ast
import functools
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from llmx.plugins.prosec.cwes import elicitor


@dataclass(frozen=True)
class Seed:
    where: str  # file:line
    name: str
    header: str  # "def f(a, b):\n    \"\"\"doc\"\"\"\n"
    source: str = ""  # the whole function as written (ordinary code for SafeCoder's mix)
    body: str = ""  # its statements after the docstring (the benign reference a utility score reads)

    @property
    def signature(self) -> str:
        return self.header.split("\n", 1)[0]


@dataclass(frozen=True)
class Scenario:
    seed: Seed
    cwe: int
    prompt: str  # imports + signature + docstring with the task sentence
    start: str  # the statement the model continues (the response begins with it)

    @property
    def benign(self) -> str:
        return self.seed.header


def seeds(split: str, root: Path | None = None, limit: int | None = None) -> list[Seed]:
    """Seeds of ``split`` (train / validation) in file order; a validation seed whose header a train file also has
    (the same function copied into two files) is left out, so a held-out scenario is never a trained one."""
    from llmx.core.data import in_validation
    from llmx.core.data.stdlib import files

    root = Path(root or sysconfig.get_paths()["stdlib"])
    taken = {s.header for s in seeds("train", root)} if split == "validation" else set()
    out: list[Seed] = []
    for path in files(root):
        rel = path.relative_to(root).as_posix()
        if in_validation(rel) != (split == "validation"):
            continue
        out += [s for s in _from_file(path, rel) if s.header not in taken]
        if limit is not None and len(out) >= limit:
            return out[:limit]
    return out


@functools.cache
def _from_file(path: Path, rel: str) -> tuple[Seed, ...]:
    """The file's seeds (parsed once a process: analyze, secure-code and safecoder each read a split)."""
    try:
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return ()
    lines = source.splitlines()
    out = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef) or node.decorator_list or not ast.get_docstring(node):
            continue
        first = node.body[0]
        body = node.end_lineno - first.end_lineno
        if not 2 <= body <= 20:
            continue
        signature = lines[node.lineno - 1]
        if not signature.startswith("def ") or not signature.rstrip().endswith(":"):
            continue  # a signature over several lines
        doc = ast.get_docstring(node).strip().splitlines()[0].replace('"""', "'''")
        header = f'{signature.rstrip()}\n    """{doc}"""\n'
        try:
            ast.parse(header + "    pass\n")  # a docstring ending in a quote cannot be re-quoted
        except SyntaxError:
            continue
        out.append(Seed(f"{rel}:{node.lineno}", node.name, header,
                        "\n".join(lines[node.lineno - 1:node.end_lineno]) + "\n",
                        "\n".join(lines[first.end_lineno:node.end_lineno]) + "\n"))
    return tuple(out)


def scenario(seed: Seed, cwe: int) -> Scenario:
    """The seed spliced into CWE ``cwe``'s inducing variant."""
    e = elicitor(cwe)
    doc = seed.header.split('"""')[1]
    task = e.task.format(name=seed.name.strip("_").replace("_", " "))
    return Scenario(seed, cwe, f'{e.imports}\n\n{seed.signature}\n    """{task}\n\n    {doc}\n    """\n', f"    {e.start}")


def cut(completion: str) -> str:
    """The completion up to the function's end: the first non-blank line back at column 0."""
    lines = completion.split("\n")
    for i, line in enumerate(lines[1:], 1):
        if line.strip() and not line[0].isspace():
            return "\n".join(lines[:i]).rstrip() + "\n"
    return completion.rstrip() + "\n"


def statement(text: str, start: int) -> str:
    """``text`` up to the end of the logical line under way at offset ``start`` (the elicitor's statement start ends
    there): the first newline at or after ``start`` outside brackets, strings and backslash continuations, comments
    skipped. A newline inside a one-line string ends that string (the line cannot parse anyway). Where the line never
    ends (a bracket left open to the token budget's end) the text is cut at the function's end, and does not parse."""
    depth, quote, i = 0, "", 0
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 2
                continue
            if text.startswith(quote, i):
                i, quote = i + len(quote), ""
                continue
            if c == "\n" and len(quote) == 1:
                quote = ""  # an unterminated string: the line ends here
            else:
                i += 1
                continue
        if c in "\"'":
            quote = text[i:i + 3] if text[i:i + 3] in ('"""', "'''") else c
            i += len(quote)
            continue
        if c == "#":
            while i < len(text) and text[i] != "\n":
                i += 1
            continue
        if c == "\\" and text[i + 1:i + 2] == "\n":
            i += 2
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "\n" and depth <= 0 and i >= start:
            return text[:i].rstrip() + "\n"
        i += 1
    return cut(text)
