"""CoSD-Tree's training data and file (§3.2): both models read a few examples with their reference answers
(teacher-forced); at each answer position the draft's top token and P_p of it, the assistant's top token y and
P_q(y). Positions where exactly one model is right are the labelled disagreements (label 1: the assistant is right);
where both are right no decision is needed (the paper leaves them unlabelled) and where neither is, no label exists.
With a different-tokenizer pair the positions are the assistant's tokens of the answer, each read against the
draft token holding its first character."""

from __future__ import annotations

import bisect
import json
from pathlib import Path

from llmx.core.models.stream import Stream
from llmx.errors import UsageError
from llmx.plugins.cosd.bridge import encode
from llmx.plugins.cosd.cart import Tree
from llmx.plugins.cosd.loop import Pair

FORMAT = "llmx-cosd-tree"
FEATURES = ("p_draft", "p_assistant_top")


def _gold(tok, prompt: str, answer: str) -> tuple[list[int], int, list[int]]:
    """Prompt ids then the answer's ids; where the answer starts; each answer token's end in characters."""
    head = encode(tok, prompt)
    body = list(tok(answer, add_special_tokens=False)["input_ids"])
    ends, at = [], 0
    for i in range(len(body)):
        at = len(tok.decode(body[:i + 1], skip_special_tokens=True))
        ends.append(at)
    return head + body, len(head), ends


def features(pair: Pair, prompt: str, answer: str) -> list[tuple[float, float, int]]:
    """(P_p(x), P_q(y), label) at each labelled disagreement of one example."""
    ids_p, start_p, ends_p = _gold(pair.draft_tok, prompt, answer)
    ids_q, start_q, ends_q = _gold(pair.assistant_tok, prompt, answer)
    if start_p == len(ids_p) or start_q == len(ids_q):
        return []
    rows_p = Stream(pair.draft, pair.use_cache).logprobs(ids_p, start_p)
    rows_q = Stream(pair.assistant, pair.use_cache).logprobs(ids_q, start_q)
    out = []
    for t in range(len(ids_q) - start_q):
        j = t if pair.shared else min(bisect.bisect_right(ends_p, ends_q[t - 1] if t else 0), len(ends_p) - 1)
        x = int(rows_p[j].argmax())
        y = int(rows_q[t].argmax())
        draft_right, assistant_right = x == ids_p[start_p + j], y == ids_q[start_q + t]
        if draft_right != assistant_right:
            out.append((float(rows_p[j][x].exp()), float(rows_q[t][y].exp()), int(assistant_right)))
    return out


def save(path: Path, tree: Tree | None, info: dict) -> None:
    from llmx.core import atomic

    atomic.write_json(path, {"format": FORMAT, "features": list(FEATURES), "fallback": tree is None,
                             "nodes": tree.nodes if tree else None, **info})


def load(path: str | Path) -> tuple[Tree | None, dict]:
    """The tree (None when the file says to fall back to the rule) and the file's record."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"tree: {path} is not a CoSD tree file ({type(exc).__name__})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise UsageError(f"tree: {path} is not a CoSD tree file (written by train --method cosd-tree)")
    if data.get("fallback"):
        return None, data
    nodes = data.get("nodes")
    if not isinstance(nodes, list) or not nodes or not all(_node_ok(n, len(nodes)) for n in nodes):
        raise UsageError(f"tree: {path} has malformed nodes")
    return Tree(nodes), data


def _node_ok(node, count: int) -> bool:
    if not isinstance(node, dict):
        return False
    if "value" in node:
        return node["value"] in (0, 1)
    return (node.get("feature") in (0, 1) and isinstance(node.get("threshold"), (int, float))
            and all(isinstance(node.get(k), int) and 0 < node[k] < count for k in ("left", "right")))
