"""In-context classification: each label word scored after the prompt by its summed token log-probability
(multi-token labels included), and the demonstration selectors (random; similarity on the model's own mean
last-layer hidden states). A prompt that does not fit the model's context is an error, never
cut silently."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import torch

from llmx.core.data.icl import Format
from llmx.core.eval.score import encode_pair, next_logprobs, scoring_limit, token_logprobs
from llmx.errors import UsageError


def label_scores(model, tok, prompts: Sequence[str], labels: Sequence[str], batch_size: int = 16,
                 progress: Callable = lambda x, **_: x, limit: int | None = None) -> torch.Tensor:
    """``[prompts, labels]`` summed log-probabilities of each label's tokens after each prompt (lm-eval's encoding,
    ``core.eval.score``). When every label is one token after a shared prompt encoding, one forward per prompt
    serves them all; otherwise each (prompt, label) pair is scored on its own. A prompt past ``limit`` tokens
    (default: the model's context) is an error."""
    limit = min(limit or scoring_limit(model, tok), scoring_limit(model, tok))
    pairs = [[encode_pair(tok, p, lab) for lab in labels] for p in prompts]
    for p, row in zip(prompts, pairs, strict=True):
        longest = max(len(h) + len(t) for h, t in row)
        if longest > limit + 1:
            raise UsageError(f"an in-context prompt is {longest} tokens, past the model's {limit}-token context; "
                             f"use fewer demonstrations (shots, max_node_size)", hint=f"Prompt starts: {p[:80]!r}")
    fast = all(len({tuple(h) for h, _ in row}) == 1 and all(len(t) == 1 for _, t in row) for row in pairs)
    if fast:
        heads = [row[0][0] for row in pairs]
        ids = [[t[0] for _, t in row] for row in pairs]
        return next_logprobs(model, tok, heads, ids, batch_size, progress)
    flat = token_logprobs(model, tok, [pair for row in pairs for pair in row], batch_size, progress)
    return torch.tensor([s.logprob for s in flat], dtype=torch.float64).view(len(prompts), len(labels))


def classify(model, tok, prompts: Sequence[str], labels: Sequence[str], batch_size: int = 16,
             progress: Callable = lambda x, **_: x, limit: int | None = None) -> list[str]:
    """The highest-scoring label word after each prompt."""
    if not prompts:
        return []
    scores = label_scores(model, tok, prompts, labels, batch_size, progress, limit)
    return [labels[int(i)] for i in scores.argmax(dim=1)]


def random_demos(pool: Sequence[int], k: int, rng: random.Random) -> list[int]:
    """``k`` pool indices drawn without replacement, in pool-index order (all of them when the pool is smaller)."""
    return sorted(rng.sample(list(pool), min(k, len(pool))))


@torch.inference_mode()
def embed(model, tok, texts: Sequence[str], batch_size: int = 16) -> torch.Tensor:
    """Unit-norm mean of the last layer's hidden states over each text's tokens (padding excluded)."""
    device = next(model.parameters()).device
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    out = []
    for s in range(0, len(texts), batch_size):
        enc = [tok(t)["input_ids"] for t in texts[s:s + batch_size]]
        width = max(len(e) for e in enc)
        ids = torch.full((len(enc), width), pad, dtype=torch.long, device=device)
        mask = torch.zeros_like(ids)
        for b, e in enumerate(enc):
            ids[b, :len(e)] = torch.tensor(e, dtype=torch.long, device=device)
            mask[b, :len(e)] = 1
        last = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[-1].float()
        mean = (last * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
        out.append(torch.nn.functional.normalize(mean, dim=-1))
    return torch.cat(out)


def similar_demos(query: torch.Tensor, pool_vectors: torch.Tensor, pool: Sequence[int], k: int) -> list[int]:
    """The ``k`` pool indices whose vectors are nearest the query's by cosine (ties to the lower index), in
    pool-index order."""
    sims = pool_vectors @ query
    order = sorted(range(len(pool)), key=lambda j: (-float(sims[j]), pool[j]))
    return sorted(pool[j] for j in order[:k])


def demo_tokens(tok, fmt: Format, rows: Sequence[dict]) -> list[int]:
    """Each row's tokens as a demonstration with its separator (byte-level BPE splits at the row boundary, so a
    prompt's demonstrations take the sum)."""
    return [len(tok(fmt.demo(r) + fmt.separator, add_special_tokens=False)["input_ids"]) for r in rows]


def demo_budget(tok, fmt: Format, rows: Sequence[dict], labels: Sequence[str], limit: int) -> int:
    """Tokens left for demonstrations in a ``limit``-token context after the longest query (with its special
    tokens) and the longest label after it, as ``label_scores`` encodes them."""
    longest = max((r["input"] for r in rows), key=lambda text: len(tok(fmt.query(text))["input_ids"]))
    query = fmt.query(longest)
    label = max(len(encode_pair(tok, query, lab)[1]) for lab in labels)
    return limit + 1 - len(tok(query)["input_ids"]) - label
