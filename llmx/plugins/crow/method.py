"""``train --method crow``: the ``sft`` stage (prompt masking, LoRA through PEFT, the shared loop) with CROW's
objective in place of the LM loss, its micro-batches weighing equally (the official trainer's accumulation)."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from llmx.core.context import RunContext
from llmx.core.train.sft.batch import IGNORE, padded
from llmx.core.train.sft.run import PLAIN
from llmx.core.train.sft.run import run as sft
from llmx.plugins.crow.config import CrowParams
from llmx.plugins.crow.loss import crow_loss


def collate(items: list, pad_id: int, device, multiple: int = 8) -> dict[str, torch.Tensor]:
    """The sft stage's right-padded micro-batch, widened to a multiple of ``multiple`` (the official
    ``DataCollatorForSeq2Seq(pad_to_multiple_of=8)``): the padding is masked out of attention and labels, and counts
    in the consistency mean unless ``mask_padding``."""
    b = padded(items, pad_id, device)
    extra = -b["input_ids"].shape[1] % multiple
    return {"input_ids": F.pad(b["input_ids"], (0, extra), value=pad_id),
            "attention_mask": F.pad(b["attention_mask"], (0, extra), value=0),
            "labels": F.pad(b["labels"], (0, extra), value=IGNORE)}


def run(ctx: RunContext, p: CrowParams) -> dict[str, Any]:
    model = ctx.model if p.strategy == "fsdp" else None  # (loading it here would merge a continued adapter)
    head = model.get_output_embeddings() if model is not None else None
    if head is not None and head.weight is model.get_input_embeddings().weight:
        from llmx.errors import CannotRun

        raise CannotRun("crow cannot train this model under strategy fsdp: its loss calls the input embeddings "
                        "outside the model's forward, and tied to the output head they cannot be their own FSDP "
                        "unit (use strategy: ddp)")
    if not p.data:
        from llmx.core.train.sft.rundata import with_rows

        p = with_rows(ctx, p, "defence", "test_clean", "backdoor.json",  # analyze --method backdoor's rows
                      "no backdoor rows: pass data, or put analyze --method backdoor before crow in the same run")
    objective = partial(crow_loss, eps=p.eps, alpha=p.alpha, mask_padding=p.mask_padding)
    codec = replace(PLAIN, collate=partial(collate, multiple=p.pad_to_multiple_of))
    out = sft(ctx, p, "crow", objective=objective, codec=codec, token_weighted=False)  # official: equal micro-batches
    out.update(forwards_per_step=3, backwards_per_step=2, seconds_per_step=out["train_seconds"] / max(out["steps"], 1))
    return out
