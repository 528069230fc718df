"""The training loop shared by the zoo's pre-training and the train stages: AdamW, warmup + cosine (or linear /
constant) schedule, gradient accumulation and clipping, optional periodic evaluation with early stopping that
restores the best state, and per-step metrics to ``metrics.jsonl``."""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch


@dataclass(frozen=True)
class TrainConfig:
    steps: int
    lr: float
    warmup: int = 0
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float | None = 1.0
    grad_accum: int = 1
    eval_every: int | None = None
    patience: int | None = None


@dataclass
class TrainResult:
    steps: int
    best_step: int
    best_eval: float
    seconds: float
    last_loss: float


def lr_at(step: int, c: TrainConfig) -> float:
    if step < c.warmup:
        return c.lr * (step + 1) / c.warmup
    if c.schedule == "constant":
        return c.lr
    frac = min((step - c.warmup) / max(c.steps - c.warmup, 1), 1.0)
    shape = 0.5 * (1 + math.cos(math.pi * frac)) if c.schedule == "cosine" else 1 - frac
    return c.lr * (c.min_lr_ratio + (1 - c.min_lr_ratio) * shape)


def train(model: torch.nn.Module, params: Iterable[torch.nn.Parameter], batch: Callable[[int, int], dict],
          c: TrainConfig, evaluate: Callable[[], float] | None = None, progress=None,
          metrics_file: Path | None = None) -> TrainResult:
    """Optimise ``params``; ``batch(step, micro)`` returns the model's keyword inputs (with ``labels``).

    With ``evaluate`` and ``eval_every``, the lowest evaluation wins: training stops after ``patience`` evaluations
    without improvement and the best state is restored.
    """
    params = [p for p in params if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=c.lr, betas=c.betas, weight_decay=c.weight_decay)
    best = (float("inf"), 0, None)
    stale, t0, step, loss_value = 0, time.perf_counter(), 0, float("nan")
    log = metrics_file.open("a") if metrics_file else None
    model.train()
    try:
        for step in (progress or (lambda r, **_: r))(range(c.steps), description="training"):
            for group in opt.param_groups:
                group["lr"] = lr_at(step, c)
            opt.zero_grad(set_to_none=True)
            loss_value = 0.0
            for micro in range(c.grad_accum):
                loss = model(**batch(step, micro)).loss / c.grad_accum
                loss.backward()
                loss_value += float(loss.detach())
            if c.grad_clip:
                torch.nn.utils.clip_grad_norm_(params, c.grad_clip)
            opt.step()
            record = {"step": step + 1, "loss": loss_value, "lr": lr_at(step, c)}
            if evaluate is not None and c.eval_every and ((step + 1) % c.eval_every == 0 or step + 1 == c.steps):
                model.eval()
                record["eval"] = value = evaluate()
                model.train()
                if value < best[0]:
                    best, stale = (value, step + 1, copy.deepcopy(model.state_dict())), 0
                else:
                    stale += 1
                    if c.patience is not None and stale >= c.patience:
                        break
            if log:
                log.write(json.dumps(record) + "\n")
    finally:
        if log:
            log.close()
    if best[2] is not None:
        model.load_state_dict(best[2])
    model.eval()
    return TrainResult(steps=step + 1, best_step=best[1], best_eval=best[0], seconds=time.perf_counter() - t0,
                       last_loss=loss_value)
