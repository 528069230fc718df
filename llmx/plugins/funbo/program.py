"""An evolved program: ``acquisition_function(predictive_mean, predictive_var, incumbent, beta=1.0)`` returning a grid
index (notes §2.2 step 1). ``check`` is the static half of the sandbox (an AST allow-list, run before any process
starts); ``compile_program`` executes a checked source with only a numpy subset, ``norm`` and safe builtins in scope."""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Callable
from types import SimpleNamespace

import numpy as np

NAME = "acquisition_function"
ARGS = ("predictive_mean", "predictive_var", "incumbent", "beta")
MAX_CHARS = 20_000

FORBIDDEN_NODES = (ast.Import, ast.ImportFrom, ast.Global, ast.Nonlocal, ast.ClassDef, ast.AsyncFunctionDef,
                   ast.Await, ast.AsyncFor, ast.AsyncWith, ast.Yield, ast.YieldFrom,
                   ast.Match)  # a class pattern names attributes as strings, past the attribute checks
FORBIDDEN_NAMES = frozenset({"exec", "eval", "compile", "open", "getattr", "setattr", "delattr", "globals", "locals",
                             "vars", "input", "breakpoint", "help", "exit", "quit", "memoryview", "type", "object",
                             "super", "dir", "id", "classmethod", "staticmethod", "property", "print"})
FORBIDDEN_ATTRS = frozenset({"tofile", "dump", "dumps", "ctypes", "data", "base", "format", "format_map", "setflags",
                             "mro", "type", "gi_frame", "gi_code", "f_back", "f_globals", "f_locals", "f_builtins", "f_code",
                             "tb_frame", "tb_next", "cr_frame", "ag_frame"})

NUMPY_NAMES = (
    "abs absolute add all amax amin any arange arccos arccosh arcsin arcsinh arctan arctan2 arctanh argmax argmin "
    "argpartition argsort array asarray cbrt ceil clip concatenate copy cos cosh count_nonzero cumprod cumsum diff "
    "divide dot e errstate exp exp2 expm1 float32 float64 floor fmax fmin full full_like greater heaviside hypot inf "
    "int32 int64 isclose isfinite isinf isnan less linspace log log10 log1p log2 logaddexp logical_and logical_not "
    "logical_or max maximum mean median min minimum multiply nan nan_to_num nanargmax nanargmin nanmax nanmin "
    "negative newaxis ones ones_like partition percentile pi power prod quantile reciprocal round sign sin sinh sort "
    "sqrt square stack std subtract sum tan tanh unique var where zeros zeros_like").split()
BUILTINS = ("abs all any bool dict enumerate filter float int isinstance len list map max min pow range reversed "
            "round sorted sum tuple zip ArithmeticError Exception FloatingPointError IndexError ValueError "
            "ZeroDivisionError").split()


class ProgramError(ValueError):
    """A program refused before it runs; the message is the reason."""


def check(source: str) -> ast.FunctionDef:
    """The program's function definition, or ProgramError naming the first thing the allow-list refuses."""
    if len(source) > MAX_CHARS:
        raise ProgramError(f"program of {len(source)} characters (at most {MAX_CHARS})")
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise ProgramError(f"syntax error at line {e.lineno}: {e.msg}") from None
    defs = [s for s in tree.body if isinstance(s, ast.FunctionDef) and s.name == NAME]
    others = [s for s in tree.body if s not in defs and not _is_docstring(s)]
    if len(defs) != 1 or others:
        raise ProgramError(f"a program is one top-level `def {NAME}(...)` and nothing else")
    fn = defs[0]
    names = tuple(a.arg for a in fn.args.posonlyargs + fn.args.args)
    if names != ARGS or fn.args.vararg or fn.args.kwarg or fn.args.kwonlyargs or len(fn.args.defaults) > 1:
        raise ProgramError(f"signature must be {NAME}({', '.join(ARGS[:3])}, beta=1.0), got ({', '.join(names)})")
    for node in ast.walk(fn):
        if isinstance(node, FORBIDDEN_NODES):
            raise ProgramError(f"line {node.lineno}: {type(node).__name__} is not allowed")
        if isinstance(node, ast.Name) and (node.id in FORBIDDEN_NAMES or node.id.startswith("__")):
            raise ProgramError(f"line {node.lineno}: the name '{node.id}' is not allowed")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "__" in node.value:
            raise ProgramError(f"line {node.lineno}: a string with '__' is not allowed (format fields walk attributes)")
        if isinstance(node, ast.Attribute):
            if node.attr.startswith("_") or node.attr in FORBIDDEN_ATTRS:
                raise ProgramError(f"line {node.lineno}: the attribute '.{node.attr}' is not allowed")
            if not isinstance(node.ctx, ast.Load):
                raise ProgramError(f"line {node.lineno}: assigning or deleting attributes is not allowed")
    return fn


def _is_docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def _norm() -> SimpleNamespace:
    """scipy.stats.norm's cdf, pdf, sf, ppf, isf and their logs (loc, scale) through scipy.special: the child starts
    without importing scipy.stats."""
    from scipy import special as S

    def std(fn):
        return lambda x, loc=0.0, scale=1.0: fn((np.asarray(x, dtype=float) - loc) / scale)

    def q(fn):
        return lambda p, loc=0.0, scale=1.0: loc + scale * fn(np.asarray(p, dtype=float))

    log_pdf = std(lambda z: -0.5 * z * z - 0.5 * np.log(2 * np.pi))
    return SimpleNamespace(
        cdf=std(S.ndtr), sf=std(lambda z: S.ndtr(-z)), logcdf=std(S.log_ndtr), logsf=std(lambda z: S.log_ndtr(-z)),
        pdf=lambda x, loc=0.0, scale=1.0: np.exp(log_pdf(x, loc, scale)) / scale,
        logpdf=lambda x, loc=0.0, scale=1.0: log_pdf(x, loc, scale) - np.log(scale),
        ppf=q(S.ndtri), isf=q(lambda p: -S.ndtri(p)))


def namespace() -> dict:
    import builtins

    return {"__builtins__": {b: getattr(builtins, b) for b in BUILTINS},
            "np": SimpleNamespace(**{n: getattr(np, n) for n in NUMPY_NAMES}), "norm": _norm()}


def compile_program(source: str) -> Callable:
    """The checked program's function, executed in the restricted namespace."""
    check(source)
    scope = namespace()
    exec(compile(source, "<program>", "exec"), scope)  # noqa: S102 -- checked source, restricted builtins
    return scope[NAME]


def key(source: str) -> str:
    """A duplicate's key: the function's AST without docstrings or its name (comments and layout vanish in parsing)."""
    fn = ast.parse(source).body[-1]
    for node in ast.walk(fn):
        if isinstance(node, (ast.FunctionDef, ast.Module)) and node.body and _is_docstring(node.body[0]):
            node.body = node.body[1:] or [ast.Pass()]
    fn.name = NAME
    return hashlib.sha1(ast.dump(fn, annotate_fields=False).encode()).hexdigest()[:16]


