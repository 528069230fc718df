"""A small CART (Breiman et al., 1984) for CoSD-Tree: binary splits ``x[f] <= t`` at midpoints between sorted distinct
values, chosen by the largest weighted Gini decrease (as scikit-learn's ``DecisionTreeClassifier``, against which it
is tested where no two splits tie: scikit-learn breaks ties by a random feature order), depth-limited, with optional
balanced class weights; an impure node splits even when no split lowers its impurity (as scikit-learn). Stored as
plain JSON, so a fitted tree is read without pickles."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llmx.errors import UsageError

FORMAT = "llmx-cosd-tree"
FEATURES = ("p_draft", "p_assistant_top")


@dataclass(frozen=True)
class Tree:
    nodes: list[dict]  # {"feature", "threshold", "left", "right"} or {"value", "counts"}; node 0 is the root

    def predict_one(self, x: Sequence[float]) -> int:
        node = self.nodes[0]
        while "value" not in node:
            node = self.nodes[node["left"] if x[node["feature"]] <= node["threshold"] else node["right"]]
        return int(node["value"])

    def predict(self, xs) -> np.ndarray:
        return np.array([self.predict_one(x) for x in np.asarray(xs, dtype=np.float64)], dtype=np.int64)

    @property
    def depth(self) -> int:
        def down(i: int) -> int:
            node = self.nodes[i]
            return 0 if "value" in node else 1 + max(down(node["left"]), down(node["right"]))

        return down(0)


def _gini(weights: np.ndarray) -> float:
    total = weights.sum()
    return 0.0 if total <= 0 else 1.0 - float(((weights / total) ** 2).sum())


def fit(xs, ys, max_depth: int = 3, min_samples_leaf: int = 1, balanced: bool = False, classes: int = 2) -> Tree:
    x = np.asarray(xs, dtype=np.float64)
    y = np.asarray(ys, dtype=np.int64)
    if x.ndim != 2 or len(x) != len(y) or len(y) == 0:
        raise ValueError("fit needs a non-empty 2-D x and one label per row")
    counts = np.bincount(y, minlength=classes).astype(np.float64)
    class_weight = np.where(counts > 0, len(y) / (classes * np.maximum(counts, 1)), 0.0) if balanced else np.ones(classes)
    w = class_weight[y]
    nodes: list[dict] = []

    def leaf(idx: np.ndarray) -> dict:
        weights = np.bincount(y[idx], weights=w[idx], minlength=classes)
        return {"value": int(np.argmax(weights)), "counts": [float(c) for c in weights]}

    def grow(idx: np.ndarray, depth: int) -> int:
        me = len(nodes)
        nodes.append(leaf(idx))
        parent = np.bincount(y[idx], weights=w[idx], minlength=classes)
        if depth >= max_depth or len(idx) < 2 * min_samples_leaf or _gini(parent) == 0.0:
            return me
        best = None  # (impurity, feature, threshold)
        total = parent.sum()
        for f in range(x.shape[1]):
            order = idx[np.argsort(x[idx, f], kind="stable")]
            values = x[order, f]
            left = np.cumsum(np.eye(classes)[y[order]] * w[order, None], axis=0)
            for k in range(min_samples_leaf, len(order) - min_samples_leaf + 1):
                if values[k - 1] == values[k]:
                    continue
                lw, rw = left[k - 1], parent - left[k - 1]
                impurity = (lw.sum() * _gini(lw) + rw.sum() * _gini(rw)) / total
                if best is None or impurity < best[0] - 1e-12:
                    best = (impurity, f, (values[k - 1] + values[k]) / 2)
        if best is None:
            return me
        _, f, threshold = best
        go_left = x[idx, f] <= threshold
        nodes[me] = {"feature": f, "threshold": float(threshold)}
        nodes[me]["left"] = grow(idx[go_left], depth + 1)
        nodes[me]["right"] = grow(idx[~go_left], depth + 1)
        return me

    grow(np.arange(len(y)), 0)
    return Tree(nodes)


def save(path: Path, tree: Tree | None, info: dict) -> None:
    """A fitted tree, or ``None``: the file then says to fall back to the rule."""
    from llmx.core import atomic

    atomic.write_json(path, {"format": FORMAT, "features": list(FEATURES), "fallback": tree is None,
                             "nodes": tree.nodes if tree else None, **info})


def load(path: str | Path) -> tuple[Tree | None, dict]:
    """The tree (None when the file says to fall back to the rule) and the file's record."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{path} is not a CoSD tree file ({type(exc).__name__})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise UsageError(f"{path} is not a CoSD tree file (written by train --method cosd-tree)")
    if data.get("fallback"):
        return None, data
    nodes = data.get("nodes")
    if not isinstance(nodes, list) or not nodes or not all(_node_ok(n, len(nodes)) for n in nodes):
        raise UsageError(f"{path} has malformed nodes")
    return Tree(nodes), data


def _node_ok(node, count: int) -> bool:
    if not isinstance(node, dict):
        return False
    if "value" in node:
        return node["value"] in (0, 1)
    return (node.get("feature") in (0, 1) and isinstance(node.get("threshold"), (int, float))
            and all(isinstance(node.get(k), int) and 0 < node[k] < count for k in ("left", "right")))
