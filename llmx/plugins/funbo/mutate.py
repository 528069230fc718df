"""``sampler: mutate``, an offline stand-in for the LLM, labelled so in every output: AST mutation and crossover of
the programs its prompt shows, with generic operators only (perturb a constant, swap an arithmetic operator, wrap an
expression in an elementwise function, extend one by an operation with a variable or constant of the function, or
graft an expression of the other parent). None is picked from the published acquisition functions (the notes' CPU
prototype used operators chosen after seeing them, e.g. "add c·β·σ"; these are not)."""

from __future__ import annotations

import ast
import copy

import numpy as np

from llmx.plugins.funbo import prompt as P
from llmx.plugins.funbo.program import ARGS

WRAPS = ("np.sqrt(np.abs({}))", "np.exp({})", "np.log1p(np.abs({}))", "np.tanh({})", "np.square({})", "(-({}))")
OPS = (ast.Add, ast.Sub, ast.Mult, ast.Div)


INDEX_WRAPPERS = {"int", "argmax", "argmin", "nanargmax", "nanargmin", "int64", "int32"}


def _call_name(node: ast.expr) -> str:
    func = node.func if isinstance(node, ast.Call) else None
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def _targets(fn: ast.FunctionDef) -> list[ast.expr]:
    """Expressions a mutation may replace: operands and values, never a call's function, an attribute's object, an
    index, a keyword argument, a loop's iterable, or the returned index itself (through ``int(np.argmax(...))``, down
    to the scores argmax is given)."""
    skip: set[int] = set()

    def skip_tree(node: ast.AST) -> None:
        skip.update(id(n) for n in ast.walk(node))

    for node in ast.walk(fn):
        if isinstance(node, ast.Return) and node.value is not None:
            value = node.value
            skip.add(id(value))
            while isinstance(value, ast.Call) and _call_name(value) in ("int", "int64", "int32") and value.args:
                value = value.args[0]
                skip.add(id(value))
        if isinstance(node, ast.Call):
            skip_tree(node.func)
            for kw in node.keywords:
                skip_tree(kw.value)
        if isinstance(node, ast.Attribute):
            skip_tree(node.value)
        if isinstance(node, ast.Subscript):
            skip_tree(node.slice)
        if isinstance(node, (ast.For, ast.comprehension)):
            skip_tree(node.iter)
    out = []
    for node in ast.walk(fn):
        if id(node) in skip or not isinstance(node, (ast.BinOp, ast.UnaryOp, ast.Call, ast.Name, ast.Constant)):
            continue
        if isinstance(node, ast.Call) and _call_name(node) in INDEX_WRAPPERS:
            continue  # an index-valued call: wrapping it in arithmetic would return a float
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            continue
        if isinstance(node, ast.Constant) and (isinstance(node.value, bool) or not isinstance(node.value, (int, float))):
            continue
        out.append(node)
    return out


def _line(fn: ast.FunctionDef, node: ast.expr) -> int | None:
    """The line of the innermost statement holding ``node`` (a node built by an earlier mutation has none)."""
    lines = [stmt.lineno for stmt in ast.walk(fn)
             if isinstance(stmt, ast.stmt) and stmt is not fn and any(n is node for n in ast.walk(stmt))]
    return lines[-1] if lines else None


def _variables(fn: ast.FunctionDef, before: int | None = None) -> list[str]:
    """The arguments and the names assigned on lines before ``before`` (all when None)."""
    assigned = {t.id for node in ast.walk(fn) if isinstance(node, ast.Assign) for t in node.targets
                if isinstance(t, ast.Name) and (before is None or node.lineno < before)}
    return sorted(set(ARGS) | assigned)


def _replace(fn: ast.FunctionDef, old: ast.expr, new: ast.expr) -> None:
    for parent in ast.walk(fn):
        for name, value in ast.iter_fields(parent):
            if value is old:
                setattr(parent, name, new)
                return
            if isinstance(value, list):
                for i, item in enumerate(value):
                    if item is old:
                        value[i] = new
                        return


class Mutator:
    def __init__(self, seed: int = 0, crossover: float = 0.3, max_ops: int = 2):
        self.rng = np.random.default_rng(seed)
        self.crossover, self.max_ops = crossover, max_ops

    def _constant(self) -> float:
        return float(np.round(10 ** self.rng.uniform(-2, 1), 3))

    def _mutate_once(self, fn: ast.FunctionDef, donor: ast.FunctionDef | None) -> None:
        targets = _targets(fn)
        if not targets:
            return
        node = targets[int(self.rng.integers(len(targets)))]
        ops = ["wrap", "extend"] + (["constant"] if isinstance(node, ast.Constant) else []) \
            + (["operator"] if isinstance(node, ast.BinOp) else []) + (["graft"] if donor is not None else [])
        op = ops[int(self.rng.integers(len(ops)))]
        if op == "constant":
            node.value = float(np.round(node.value * np.exp(self.rng.normal(0, 0.5)), 4))
        elif op == "operator":
            node.op = OPS[int(self.rng.integers(len(OPS)))]()
        elif op == "wrap":
            new = ast.parse(WRAPS[int(self.rng.integers(len(WRAPS)))].format(ast.unparse(node)), mode="eval").body
            _replace(fn, node, new)
        elif op == "extend":
            names = _variables(fn, _line(fn, node))
            other = ast.Name(names[int(self.rng.integers(len(names)))], ast.Load()) if self.rng.random() < 0.6 \
                else ast.Constant(self._constant())
            _replace(fn, node, ast.BinOp(node, OPS[int(self.rng.integers(len(OPS)))](), other))
        else:
            known = set(_variables(fn, _line(fn, node))) | {"np", "norm"}
            pool = [e for e in _targets(donor) if {n.id for n in ast.walk(e) if isinstance(n, ast.Name)} <= known]
            if pool:
                _replace(fn, node, copy.deepcopy(pool[int(self.rng.integers(len(pool)))]))

    def child(self, parents: list[str]) -> str:
        """One offspring's function body (a completion of the prompt's next header)."""
        trees = [ast.parse(p).body[-1] for p in parents]
        a = int(self.rng.integers(len(trees)))
        fn = copy.deepcopy(trees[a])
        donor = trees[1 - a] if len(trees) > 1 and self.rng.random() < self.crossover else None
        for _ in range(int(self.rng.integers(1, self.max_ops + 1))):
            self._mutate_once(fn, donor)
        ast.fix_missing_locations(fn)
        return "\n".join(P.body(ast.unparse(fn)))

    def sample(self, prompt: str, n: int) -> list[str]:
        parents = P.programs_in(prompt)
        return [self.child(parents) for _ in range(n)]
