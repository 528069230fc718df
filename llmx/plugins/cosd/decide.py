"""CoSD's decision functions (§3 of the paper): at a draft position with draft token ``x`` and the assistant's own top
token ``y``, keep ``x`` or put ``y`` in its place. A decision returns the replacement token, or None to keep ``x``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from llmx.plugins.cosd.cart import Tree


@dataclass(frozen=True)
class Position:
    x: int  # the draft's token (in the assistant's vocabulary)
    px: float  # P_p(x): the draft's probability of it
    y: int  # the assistant's top token
    qy: float  # P_q(y)
    qx: float  # P_q(x): the assistant's probability of the draft token
    residual_top: int | None = None  # argmax relu(P_q - P_p), where both share a vocabulary


class Decision(Protocol):
    def __call__(self, pos: Position) -> int | None: ...


@dataclass(frozen=True)
class Rule:
    """CoSD-Rule: replace iff x != y, P_p(x) < alpha and P_q(y) > beta * P_p(x)."""

    alpha: float = 0.5
    beta: float = 0.5

    def __call__(self, pos: Position) -> int | None:
        return pos.y if pos.x != pos.y and pos.px < self.alpha and pos.qy > self.beta * pos.px else None


@dataclass(frozen=True)
class ReleasedRule:
    """The released code's test (MCSD's ``_MCSSwoReplacement`` with 0.5 written in): at a disagreement keep x iff
    P_p(x) > beta * P_q(x) and P_q(x) < alpha, both of the *draft* token; otherwise take the argmax of
    relu(P_q - P_p) (its residual, greedily). With the one-hot assistant distribution its greedy mode uses, P_q(x)
    is 0 at every disagreement and x is always kept; here P_q is the assistant's softmax."""

    alpha: float = 0.5
    beta: float = 0.5
    needs_residual = True

    def __call__(self, pos: Position) -> int | None:
        if pos.x == pos.y or (pos.px > self.beta * pos.qx and pos.qx < self.alpha):
            return None
        return pos.y if pos.residual_top is None else pos.residual_top


@dataclass(frozen=True)
class TreeRule:
    """CoSD-Tree: a CART on (P_p(x), P_q(y)) says 1 (the assistant is right) at a disagreement."""

    tree: Tree

    def __call__(self, pos: Position) -> int | None:
        return pos.y if pos.x != pos.y and self.tree.predict_one((pos.px, pos.qy)) == 1 else None
