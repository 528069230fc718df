"""CoSD-Tree's training data and file (§3.2): both models read a few examples with their reference answers
(teacher-forced); at each answer position the draft's top token and P_p of it, the assistant's top token y and
P_q(y). Positions where exactly one model is right are the labelled disagreements (label 1: the assistant is right);
where both are right no decision is needed (the paper leaves them unlabelled) and where neither is, no label exists.
With a different-tokenizer pair the positions are the assistant's tokens of the answer, each read against the
draft token holding its first character."""

from __future__ import annotations

import bisect

from llmx.core.models.stream import Stream
from llmx.plugins.cosd.bridge import decode, encode
from llmx.plugins.cosd.loop import Pair


def _gold(tok, prompt: str, answer: str) -> tuple[list[int], int, list[int]]:
    """Prompt ids then the answer's ids; where the answer starts; each answer token's end in characters."""
    head = encode(tok, prompt)
    body = list(tok(answer, add_special_tokens=False)["input_ids"])
    return head + body, len(head), [len(decode(tok, body[:i + 1])) for i in range(len(body))]


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
