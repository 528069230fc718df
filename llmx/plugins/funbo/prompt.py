"""FunSearch's prompt and completion handling (``sampler.py``, ``evaluator.py``): the chosen programs, ascending by
score, renamed ``acquisition_function_v0``, ``_v1``, ... (each after the first with an "Improved version of" docstring),
then the next version's header for the model to complete; a completion is cut to the first function body (lines after
a syntax error dropped until it parses) and calls to the new version's name renamed back."""

from __future__ import annotations

import ast
import re
import textwrap

from llmx.plugins.funbo.program import NAME, ProgramError

PREAMBLE = '''"""Finds acquisition functions for Bayesian optimisation. Given a Gaussian process's predictive mean and variance
on a grid of candidate points and the incumbent (the lowest value observed; lower is better), return the index of the
point to evaluate next."""
import numpy as np
from scipy.stats import norm
'''
SIGNATURE = "(predictive_mean, predictive_var, incumbent, beta=1.0):"
FIRST_DOC = '  """Returns the index of the point to collect next."""'


def body(source: str) -> list[str]:
    """The statements of a program's function, docstring dropped, as source lines (indentation kept)."""
    fn = ast.parse(source).body[-1]
    stmts = fn.body[1:] if _docstring(fn) else fn.body
    lines = source.splitlines()
    return lines[stmts[0].lineno - 1: fn.end_lineno] if stmts else ["  pass"]


def _docstring(fn: ast.FunctionDef) -> bool:
    first = fn.body[0]
    return isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)


def header(version: int) -> str:
    doc = FIRST_DOC if version == 0 else f'  """Improved version of `{NAME}_v{version - 1}`."""'
    return f"def {NAME}_v{version}{SIGNATURE}\n{doc}"


def build(sources: list[str]) -> str:
    """The prompt for sources sorted ascending by score."""
    parts = [PREAMBLE]
    for v, source in enumerate(sources):
        text = "\n".join(body(source))
        parts.append(f"\n{header(v)}\n{_rename(text, NAME, f'{NAME}_v{v}')}\n")
    parts.append(f"\n{header(len(sources))}\n")
    return "\n".join(parts)


def _rename(text: str, old: str, new: str) -> str:
    return re.sub(rf"\b{re.escape(old)}\b(?=\s*\()", new, text)


def trim(completion: str) -> str:
    """The completion's first function body (FunSearch's ``_trim_function_body``); ProgramError when there is none."""
    code = f"def fake_function_header():\n{completion}"
    tree = None
    while tree is None:
        try:
            tree = ast.parse(code)
        except SyntaxError as e:
            if not e.lineno or e.lineno <= 1:
                raise ProgramError("the completion has no parseable function body") from None
            code = "\n".join(code.splitlines()[: e.lineno - 1])
    fn = tree.body[0]
    if not isinstance(fn, ast.FunctionDef) or not fn.body:
        raise ProgramError("the completion has no function body")
    return "\n".join(code.splitlines()[1: fn.end_lineno]) + "\n"


def to_program(completion: str, version: int) -> str:
    """A completion of version ``version``'s header as a full program named ``acquisition_function``."""
    text = textwrap.indent(textwrap.dedent(_rename(trim(completion), f"{NAME}_v{version}", NAME)), "  ")
    return f"def {NAME}{SIGNATURE}\n{FIRST_DOC}\n{text}"


def programs_in(prompt: str) -> list[str]:
    """The versions a prompt shows, as programs (what an offline proposer may use of its prompt)."""
    tree = ast.parse(prompt)
    lines = prompt.splitlines()
    out = []
    for fn in tree.body:
        if isinstance(fn, ast.FunctionDef) and fn.name.startswith(f"{NAME}_v") and len(fn.body) > 1:
            text = "\n".join(lines[fn.body[1].lineno - 1: fn.end_lineno])
            out.append(to_program(_rename(text, fn.name, NAME), -1))
    return out
