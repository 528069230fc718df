"""Pasta-SFT (notes §2, "Stage 1"): the ``sft`` stage on annotated rows, each laid out as the interpreter runs it
(``layout.build``): chunk tokens see the prefix through their promise and themselves, later main-stream tokens see no
chunk until ``<sync/>``, positions after a promise skip its N, each token predicts the next token of its own stream.
``annotated: false`` is Baseline-SFT: the same rows with their tags stripped, through the same code (a plain causal
layout). Rows longer than ``max_length`` are left out whole (a cut would split a chunk from its promise)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llmx.core.train.sft.run import Codec
from llmx.plugins.pasta import annotate, lang, layout


@dataclass
class Item:
    lay: layout.Layout
    prompt_cut: bool = False
    completion_cut: bool = False

    @property
    def ids(self) -> list[int]:
        return self.lay.ids

    @property
    def trained(self) -> list[bool]:
        return [t != layout.IGNORE for t in self.lay.targets]


def codec(model, tag_ids: dict[str, int], annotated: bool) -> Codec:
    def encode(tok, row: dict, p) -> Item | None:
        response = row["response"] if annotated else row.get("plain") or lang.strip(row["response"])
        lay = layout.build(layout.encode(tok, row["prompt"], prompt=True), layout.encode(tok, response), tag_ids,
                           tok.decode, eos=tok.eos_token_id)
        return Item(lay) if len(lay.ids) <= p.max_length else None

    def collate(items: list[Item], pad: int, device) -> dict[str, torch.Tensor]:
        return batch([it.lay for it in items], pad, model, device)

    return Codec(annotate.load, encode, collate, packs=False)


def batch(lays: list[layout.Layout], pad: int, model, device) -> dict[str, torch.Tensor]:
    """Rows padded to the longest, with their 4-D masks and position ids; ``labels[i + 1]`` is token i's target
    (transformers' causal-LM loss reads logits[i] against labels[i + 1]). A pad token sees itself only."""
    width = max(len(lay.ids) for lay in lays)
    ids = torch.full((len(lays), width), pad, dtype=torch.long)
    pos = torch.arange(width).repeat(len(lays), 1)
    labels = torch.full_like(ids, layout.IGNORE)
    seen = torch.eye(width, dtype=torch.bool).repeat(len(lays), 1, 1)
    for b, lay in enumerate(lays):
        n = len(lay.ids)
        ids[b, :n] = torch.tensor(lay.ids)
        pos[b, :n] = torch.tensor(lay.positions)
        labels[b, 1:n] = torch.tensor(lay.targets[:-1])
        seen[b, :n, :n] = lay.visible()
    return {"input_ids": ids.to(device), "position_ids": pos.to(device), "labels": labels.to(device),
            "attention_mask": layout.attention_mask(seen.to(device), model), "use_cache": False}
