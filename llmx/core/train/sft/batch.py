"""SFT micro-batches: padded rows with an attention mask, or packed rows whose position ids restart at each
document, so attention never crosses a document boundary (transformers' padding-free format); labels are -100
outside the trained tokens."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llmx.core.train.parallel import device_of
from llmx.core.train.sft.encode import Encoded
from llmx.errors import UsageError

IGNORE = -100


@dataclass
class Pack:
    ids: list[int]
    trained: list[bool]
    positions: list[int]


def pack(items: list[Encoded], max_length: int) -> list[Pack]:
    """Greedy packing in order: a row joins the current pack while it fits, else starts the next one."""
    packs: list[Pack] = []
    for e in items:
        if not packs or len(packs[-1].ids) + len(e.ids) > max_length:
            packs.append(Pack([], [], []))
        cur = packs[-1]
        cur.ids += e.ids
        cur.trained += e.trained
        cur.positions += list(range(len(e.ids)))
    return packs


def padded(items: list[Encoded], pad_id: int, device) -> dict[str, torch.Tensor]:
    width = max(len(e.ids) for e in items)
    ids = torch.full((len(items), width), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    labels = torch.full_like(ids, IGNORE)
    for i, e in enumerate(items):
        row = torch.tensor(e.ids)
        ids[i, :len(row)], attn[i, :len(row)] = row, 1
        labels[i, :len(row)] = torch.where(torch.tensor(e.trained), row, IGNORE)
    return {"input_ids": ids.to(device), "attention_mask": attn.to(device), "labels": labels.to(device)}


def packed(packs: list[Pack], pad_id: int, width: int, device) -> dict[str, torch.Tensor]:
    """Packs padded to ``width`` with a final pad document (its own positions, never a target); no attention
    mask and no cache, so transformers derives the block-diagonal causal mask from the position ids."""
    ids = torch.full((len(packs), width), pad_id, dtype=torch.long)
    pos = torch.zeros_like(ids)
    labels = torch.full_like(ids, IGNORE)
    for i, pk in enumerate(packs):
        n = len(pk.ids)
        row = torch.tensor(pk.ids)
        ids[i, :n] = row
        pos[i, :n] = torch.tensor(pk.positions)
        pos[i, n:] = torch.arange(width - n)
        labels[i, :n] = torch.where(torch.tensor(pk.trained), row, IGNORE)
    return {"input_ids": ids.to(device), "position_ids": pos.to(device), "labels": labels.to(device), "use_cache": False}


@torch.no_grad()  # an evaluation: no graph (under FSDP a forward with one would wait for its backward)
def labelled_nll(model, batches) -> float:
    """Mean NLL per labelled token over ``batches`` (model inputs with ``labels``, passed on: a model may read which
    tokens are answers, as Parrot's router does), the model in eval mode."""
    was = model.training
    model.eval()
    total, count = 0.0, 0
    for t in batches:
        target = t["labels"][:, 1:]
        logits = model(**t).logits[:, :-1].float()
        keep = target != IGNORE
        total += float(torch.nn.functional.cross_entropy(logits[keep], target[keep], reduction="sum"))
        count += int(keep.sum())
    model.train(was)
    return total / max(count, 1)


@torch.no_grad()
def check_packing(model, vocab: int) -> None:
    """Packing is only sound when the model honours restarting position ids; refuse it where it does not."""
    device = device_of(model)
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randint(3, vocab, (1, n), generator=gen).to(device) for n in (5, 7))
    was = model.training
    model.eval()
    joint = model(input_ids=torch.cat([a, b], 1),
                  position_ids=torch.cat([torch.arange(5, device=device), torch.arange(7, device=device)])[None],
                  use_cache=False).logits
    alone = model(input_ids=b).logits
    model.train(was)
    if not torch.allclose(joint[:, 5:].float(), alone.float(), atol=1e-3, rtol=1e-3):
        raise UsageError(f"{type(model).__name__} does not keep packed documents apart (its attention ignores "
                         "restarting position ids); set packing: false")
