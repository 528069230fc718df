"""SafeCoder-style security tuning (He & Vechev, 2024), the previous work ProSec compares with:
``llmx train --method safecoder --data SVEN``. Each SVEN pair gives the fixed function, trained by likelihood (every
token, or its changed spans), and the vulnerable function, trained by unlikelihood ``-log(1 - p)`` on the tokens
its deleted spans cover; ordinary standard-library functions are mixed in 1:1 by likelihood. Each sample's loss is
the mean over its trained tokens and every sample weighs the same, as SafeCoder's ``token_weighted_loss``; a sample
with no trained token is dropped. SafeCoder's own default trains only the fixed function's changed tokens
(``likelihood: changed``; its difflib gap filling is not reproduced); ``all`` follows the issue's wording."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from llmx.core.context import RunContext
from llmx.core.preference import token_logps
from llmx.core.train.parallel import device_of
from llmx.errors import UsageError
from llmx.plugins.prosec import habits
from llmx.plugins.prosec.config import HABITS, SafeCoderParams

FIELDS = ("func_src_before", "func_src_after", "char_changes", "file_name")


@dataclass(frozen=True)
class Item:
    ids: list[int]
    like: list[bool]  # next-token targets trained by likelihood
    unlike: list[bool]  # ... by unlikelihood


def read(path: str | Path) -> list[dict]:
    """Python pairs of a SVEN folder (``cwe-*.jsonl``) or file; a malformed row is an error naming ``file:line``."""
    p = Path(path)
    files = sorted(p.glob("*.jsonl")) if p.is_dir() else [p]
    rows = []
    for f in files:
        for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UsageError(f"{f}:{n}: not JSON ({exc.msg})") from None
            missing = [k for k in FIELDS if k not in row] if isinstance(row, dict) else list(FIELDS)
            if missing:
                raise UsageError(f"{f}:{n}: a SVEN pair needs {', '.join(missing)}")
            changes = row["char_changes"] if isinstance(row["char_changes"], dict) else {}
            for side in ("deleted", "added"):
                spans = changes.get(side)
                if not isinstance(spans, list) or any(not {"char_start", "char_end"} <= set(s) for s in spans):
                    raise UsageError(f"{f}:{n}: char_changes.{side} must list {{char_start, char_end}} spans")
            if row["file_name"].endswith(".py"):
                rows.append({**row, "where": f"{f}:{n}"})
    if not rows:
        raise UsageError(f"{p}: no Python pairs (SVEN rows whose file_name ends in .py)")
    return rows


def encode(tok, text: str, spans: list[tuple[int, int]] | None, max_length: int) -> tuple[list[int], list[bool]]:
    """Token ids (EOS last) and, per token, whether it overlaps a span (every token when ``spans`` is None)."""
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    marked = [spans is None or any(a < e and b > s for s, e in spans) for a, b in offsets]
    if tok.eos_token_id is not None:
        ids, marked = [*ids, tok.eos_token_id], [*marked, spans is None]
    return ids[:max_length], marked[:max_length]


def items(tok, rows: list[dict], ordinary: list[str], p: SafeCoderParams) -> list[Item]:
    out = []
    for r in rows:
        added = None if p.likelihood == "all" else [(s["char_start"], s["char_end"]) for s in r["char_changes"]["added"]]
        ids, mark = encode(tok, r["func_src_after"], added, p.max_length)
        if any(mark[1:]):
            out.append(Item(ids, mark[1:], [False] * (len(ids) - 1)))
        ids, mark = encode(tok, r["func_src_before"], [(s["char_start"], s["char_end"])
                                                       for s in r["char_changes"]["deleted"]], p.max_length)
        if any(mark[1:]):
            out.append(Item(ids, [False] * (len(ids) - 1), mark[1:]))
    for text in ordinary:
        ids, mark = encode(tok, text, None, p.max_length)
        out.append(Item(ids, mark[1:], [False] * (len(ids) - 1)))
    return out


def loss_terms(logits: torch.Tensor, batch: list[Item]) -> torch.Tensor:
    """Per item, the mean over its trained tokens of ``-log p`` (likelihood targets) and ``-log(1 - p)``
    (unlikelihood targets): SafeCoder's token-weighted loss of one sample."""
    device = logits.device
    ids = torch.zeros(logits.shape[:2], dtype=torch.long, device=device)  # padding scores token 0, never read
    for b, it in enumerate(batch):
        ids[b, :len(it.ids)] = torch.tensor(it.ids, device=device)
    logp = token_logps(logits, ids)
    out = []
    for b, it in enumerate(batch):
        lp = logp[b, :len(it.ids) - 1]
        like = torch.tensor(it.like, dtype=torch.bool, device=device)
        unlike = torch.tensor(it.unlike, dtype=torch.bool, device=device)
        total = -lp[like].sum() - torch.log1p(-lp[unlike].exp().clamp(max=1 - 1e-6)).sum()
        out.append(total / max(int(like.sum() + unlike.sum()), 1))
    return torch.stack(out)


def train(ctx: RunContext, p: SafeCoderParams) -> dict[str, Any]:
    from llmx.core.data.sampling import EpochOrder
    from llmx.core.train.stage import finish, fit, prepare
    from llmx.plugins.prosec.scenarios import seeds

    rows = read(p.data) if p.data != HABITS else habits.pairs(p.habit_pairs, p.cwes)
    tok = ctx.tokenizer
    ordinary = [s.source for s in seeds("train")][:round(p.ordinary * len(rows))]
    data = items(tok, rows, ordinary, p)
    model = prepare(ctx, ctx.model, p)
    model.train()
    order = EpochOrder(len(data), ctx.config.seed)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    device = device_of(model)

    def batch(i: int) -> list[Item]:
        return [data[k] for k in order.batch(i, p.batch_size)]

    def loss(i: int) -> torch.Tensor:
        chunk = batch(i)
        width = max(len(it.ids) for it in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long, device=device)
        mask = torch.zeros_like(ids)
        for b, it in enumerate(chunk):
            ids[b, :len(it.ids)] = torch.tensor(it.ids, device=device)
            mask[b, :len(it.ids)] = 1
        return loss_terms(model(input_ids=ids, attention_mask=mask).logits, chunk).mean()

    result = fit(ctx, model, loss, p, weight=lambda i: float(len(batch(i))))  # every sample weighs the same
    out = {"pairs": len(rows), "items": len(data), "ordinary": len(ordinary),
           "unlikelihood_items": sum(any(it.unlike) for it in data),
           "unlikelihood_tokens": sum(sum(it.unlike) for it in data), "likelihood_tokens": sum(sum(it.like) for it in data)}
    out.update(finish(ctx, model, p, "safecoder", result))
    return out
