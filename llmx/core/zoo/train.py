"""Pre-training of a reference model on a token stream: AdamW, warmup + cosine, early stopping on validation loss."""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass

import torch

from llmx.core.zoo.presets import Preset


@dataclass
class TrainResult:
    steps: int
    best_step: int
    best_val_nll: float
    seconds: float


def lr_at(step: int, p: Preset, total: int) -> float:
    if step < p.warmup:
        return p.lr * (step + 1) / p.warmup
    frac = (step - p.warmup) / max(total - p.warmup, 1)
    return p.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


def val_windows(tokens: torch.Tensor, p: Preset) -> torch.Tensor:
    """Evenly spaced, fixed validation windows (the same for every evaluation)."""
    n = min(p.eval_windows, (len(tokens) - 1) // p.seq_len)
    starts = torch.linspace(0, len(tokens) - p.seq_len - 1, n).long()
    return torch.stack([tokens[s:s + p.seq_len] for s in starts])


@torch.no_grad()
def mean_nll(model: torch.nn.Module, batch: torch.Tensor, chunk: int = 16) -> float:
    model.eval()
    losses = [model(input_ids=batch[i:i + chunk], labels=batch[i:i + chunk]).loss.item() * len(batch[i:i + chunk])
              for i in range(0, len(batch), chunk)]
    model.train()
    return sum(losses) / len(batch)


def pretrain(model: torch.nn.Module, train: torch.Tensor, val: torch.Tensor, p: Preset, seed: int,
             steps: int | None = None, progress=None) -> TrainResult:
    """Train ``model`` in place on random windows of ``train``; restore the best validation checkpoint."""
    total = steps or p.max_steps
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=p.lr, betas=(0.9, 0.95), weight_decay=0.1)
    held_out = val_windows(val, p)
    best = (float("inf"), 0, copy.deepcopy(model.state_dict()))
    stale, t0, step = 0, time.perf_counter(), 0
    model.train()
    for step in (progress or (lambda r, **_: r))(range(total), description="training"):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, p, total)
        starts = torch.randint(0, len(train) - p.seq_len - 1, (p.batch,), generator=gen)
        x = torch.stack([train[s:s + p.seq_len] for s in starts])
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if (step + 1) % p.eval_every == 0 or step + 1 == total:
            nll = mean_nll(model, held_out)
            if nll < best[0]:
                best, stale = (nll, step + 1, copy.deepcopy(model.state_dict())), 0
            else:
                stale += 1
                if stale >= p.patience:
                    break
    model.load_state_dict(best[2])
    model.eval()
    return TrainResult(steps=step + 1, best_step=best[1], best_val_nll=best[0], seconds=time.perf_counter() - t0)
