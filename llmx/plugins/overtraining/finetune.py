"""Fine-tuning degradation (§3.3): every checkpoint fine-tuned by one recipe (rate, steps, data order) on a target
corpus through the shared loop; reported: the target loss, L_pre after, and forgetting L_pre(FT(theta_T)) -
L_pre(theta_T). The batches are a pure function of (seed, step), and their digest is recorded to prove it."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import torch

from llmx.core.train.lm.data import TokenWindows
from llmx.core.train.loop import TrainConfig, train


def recipe(f: Any, lr: float) -> TrainConfig:
    return TrainConfig(steps=f.steps, lr=lr, warmup=f.warmup, schedule=f.schedule, min_lr_ratio=0.0,
                       weight_decay=f.weight_decay, grad_accum=f.grad_accum)


def finetune(model: torch.nn.Module, windows: TokenWindows, f: Any, lr: float, progress=None) -> str:
    """Train all of ``model`` in place; returns the SHA-256 (16 hex) of the token batches it saw."""
    device = next(model.parameters()).device
    seen = hashlib.sha256()

    def loss(i: int) -> torch.Tensor:
        x = windows.batch(i, f.batch_size)
        seen.update(x.to(torch.int64).cpu().numpy().tobytes())
        x = x.to(device)
        return model(input_ids=x, labels=x).loss

    params = {n: p for n, p in model.named_parameters()}
    for p in params.values():
        p.requires_grad_(True)
    train(model, params, loss, recipe(f, lr), progress=progress)
    model.eval()
    return seen.hexdigest()[:16]


def degradation(model: torch.nn.Module, pre: Callable[[torch.nn.Module], float],
                target: Callable[[torch.nn.Module], float], windows: Callable[[int], TokenWindows], f: Any,
                l_pre: float, progress=None) -> list[dict[str, Any]]:
    """One row per (lr, seed) for a checkpoint; every run starts from theta_T, restored from a copy."""
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    before = target(model)
    rows = []
    for lr in f.lrs:
        for seed in f.seeds:
            model.load_state_dict(start)
            digest = finetune(model, windows(seed), f, lr, progress)
            after = pre(model)
            rows.append({"lr": lr, "seed": seed, "target_before": before, "target": target(model),
                         "L_pre_after": after, "forgetting": after - l_pre, "batches": digest})
    model.load_state_dict(start)
    return rows
